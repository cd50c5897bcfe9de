"""The warm probe's name and its exchange (known/warm_probe.py), without SGLang: the real probe
is tested in tests/reference/test_warm_probe.py."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from sglang_fleet.known import warm_probe
from sglang_fleet.known.refenv import RefEnv


def env(version: str = "0.5.23") -> RefEnv:
    return RefEnv(version, Path("/ref/venv/bin/python"), Path(f"/ref/sglang-{version}"))


def test_one_probe_per_reference_folder_release_and_probe_code(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_FLEET_REF_DIR", str(tmp_path / "a"))
    base = warm_probe.socket_name(env(), "probe v1")
    assert base == warm_probe.socket_name(env(), "probe v1")
    assert base.startswith(f"sglang-fleet-probe-{os.getuid()}-")
    assert base != warm_probe.socket_name(env("0.5.4.post3"), "probe v1")
    assert base != warm_probe.socket_name(env(), "probe v2")
    monkeypatch.setenv("SGLANG_FLEET_REF_DIR", str(tmp_path / "b"))
    assert base != warm_probe.socket_name(env(), "probe v1")


def test_a_probe_that_ends_before_it_takes_the_question_gives_no_answer():
    ours, probe = socket.socketpair()
    probe.close()
    assert warm_probe._exchange(ours, b'{"command": "check"}') == b""


def test_the_answer_is_everything_the_probe_sends_until_it_closes():
    ours, probe = socket.socketpair()
    answer = b'{"result": [' + b" " * 300_000 + b"]}"

    def serve() -> None:
        with probe:
            while probe.recv(1 << 16):
                pass
            probe.sendall(answer)

    thread = threading.Thread(target=serve)
    thread.start()
    assert warm_probe._exchange(ours, b'{"command": "check", "payload": []}') == answer
    thread.join()
