"""The release check's warm probe (known/warm_probe.py) against the real SGLang 0.5.23: it
answers as a fresh process does, one process answers every question, and it ends when asked.
Each test's probe is its own (its reference folder's name is in the probe's), so the suite's
other release checks never meet it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sglang_fleet.known import refenv, warm_probe
from sglang_fleet.testfleet.local import wait_for

VERSION = "0.5.23"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The release's environment, with a reference folder of this test's own for the probe's
    name, its lock and its output."""
    real = refenv.ensure(VERSION, quiet=True)
    monkeypatch.setenv("SGLANG_FLEET_REF_DIR", str(tmp_path))
    env = refenv.RefEnv(VERSION, real.python, real.sglang_dir)
    yield env
    env.stop_warm_probe()


def probe_name(env: refenv.RefEnv) -> str:
    """The abstract socket name of this test's probe (also on its command line)."""
    return warm_probe.socket_name(env, refenv._probe_text())


def probe_pids(env: refenv.RefEnv) -> set[int]:
    """The processes serving this test's probe, by the socket name on their command line."""
    name = probe_name(env)
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and name.encode() in argv:
            pids.add(int(entry.name))
    return pids


def cases(model_dir: str) -> list[dict]:
    lines = [["--tp-size", "8"], ["--tp-size", "8", "--attn-dp-size", "3"],
             ["--tp-size", "4", "--dp-size", "2", "--attn-dp-size", "2"]]
    return [{"argv": ["--model-path", model_dir, *line], "gpu_memory_mb": 96 * 1024,
             "capability": capability, "node_paths": []}
            for line in lines for capability in ([12, 0], [10, 0])]


def one_shot(env: refenv.RefEnv, command: str, payload: list) -> list:
    """catalogue_probe.py's answer from a fresh interpreter of its own, as before the probe."""
    probe, _ = env._probe_file()
    proc = env.run(str(probe), command, stdin=json.dumps(payload))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_warm_probe_answers_as_a_fresh_process_does(env):
    asked = cases(str(refenv.sample_model_dir()))
    warm = env.check(asked)
    assert warm == one_shot(env, "check", asked)
    assert [v["ok"] for v in warm] == [True, True, False, False, False, False], warm


@pytest.mark.parametrize("command", ["parse", "prepare"])
def test_the_warm_probe_parses_and_prepares_as_a_fresh_process_does(env, command):
    """The reference tests' parse and prepare questions (every example inventory's command
    lines, the corpus) go to the warm probe too: the same answers, accepted and refused."""
    model = str(refenv.sample_model_dir())
    argvs = [["--model-path", model, "--tp-size", "8"],
             ["--model-path", model, "--tp-size", "eight"],
             ["--model-path", model, "--no-such-flag"]]
    warm = env.probe(command, argvs)
    assert warm == one_shot(env, command, argvs)
    assert [v["ok"] for v in warm] == [True, False, False], warm


def test_one_probe_answers_every_question_and_ends_when_asked(env):
    asked = cases(str(refenv.sample_model_dir()))[:1]
    assert env.check(asked)[0]["ok"]
    (pid,) = probe_pids(env)
    assert env.check(asked)[0]["ok"]
    assert probe_pids(env) == {pid}
    assert os.stat(f"/proc/{pid}").st_uid == os.getuid()
    assert env.stop_warm_probe()
    # Gone from the process table, and listening no more (an ending process may still hold
    # its socket for a moment after its command line is gone).
    wait_for(lambda: not probe_pids(env) and not env.stop_warm_probe(), timeout=30)
    # Asked again, it starts again.
    assert env.check(asked)[0]["ok"]
    assert len(probe_pids(env)) == 1


def _ask_as(uid: int, name: str, question: bytes) -> bytes:
    """What the probe named `name` answers `question` from another user (a child that drops to
    `uid`), b"" where it closes without an answer."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            conn = warm_probe._connect(name)
            assert conn is not None, "the probe does not listen"
            os.write(write_end, b"answer:" + warm_probe._exchange(conn, question))
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "the other user's child failed"
    assert said.startswith(b"answer:"), said
    return said.removeprefix(b"answer:")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to ask as another user")
def test_another_user_gets_no_answer_and_cannot_stop_the_probe(env):
    """The probe's socket is abstract (no file permissions guard it), so it checks the asker's
    uid itself (SO_PEERCRED): another user's question, a stop included, is closed unanswered."""
    asked = cases(str(refenv.sample_model_dir()))[:1]
    assert env.check(asked)[0]["ok"]
    (pid,) = probe_pids(env)
    name = probe_name(env)
    nobody = 65534
    assert _ask_as(nobody, name, json.dumps({"command": "stop"}).encode()) == b""
    assert _ask_as(nobody, name, json.dumps({"command": "check", "payload": asked}).encode()) == b""
    # Still the same probe, still answering its own user.
    assert probe_pids(env) == {pid}
    assert env.check(asked)[0]["ok"]
