"""The release check's warm probe (known/warm_probe.py) against the real SGLang 0.5.23: it
answers as a fresh process does, one process answers every question, and it ends when asked.
Each test's probe is its own (its reference folder's name is in the probe's), so the suite's
other release checks never meet it."""

from __future__ import annotations

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


def probe_pids(env: refenv.RefEnv) -> set[int]:
    """The processes serving this test's probe, by the socket name on their command line."""
    name = warm_probe.socket_name(env, refenv._probe_text())
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


def test_the_warm_probe_answers_as_a_fresh_process_does(env):
    asked = cases(str(refenv.sample_model_dir()))
    warm = env.check(asked)
    assert warm == env.probe("check", asked)
    assert [v["ok"] for v in warm] == [True, True, False, False, False, False], warm


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
