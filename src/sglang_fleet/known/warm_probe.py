"""A release's checks asked of a warm probe: one process per release (catalogue_probe.py
`serve`) that imported SGLang once and answers each `check` in a child forked for it, instead
of a fresh interpreter importing SGLang, transformers and torch for every playbook run that
has new command lines (about 8 CPU s each).

The probe listens on an abstract Unix socket named after the reference folder, the release and
the probe's own code, answers only its own user, and ends after IDLE_S seconds without a
question. The first asker starts it (under the release's lock, so that parallel workers start
one) and waits for it to listen.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from sglang_fleet.known import release_cache

# An operator validates, edits, validates again: the probe stays for ten quiet minutes.
IDLE_S = 600
START_TIMEOUT_S = 300  # importing SGLang on a loaded controller
ANSWER_TIMEOUT_S = 600
_POLL_S = 0.05


class RefEnv(Protocol):
    """A release's reference environment (refenv.RefEnv): what starting its probe needs."""

    version: str
    python: Path
    sglang_dir: Path

    def environment(self) -> dict[str, str]: ...


class WarmProbeError(RuntimeError):
    pass


def socket_name(env: RefEnv, probe_text: str) -> str:
    """Abstract socket name: one per reference folder, release and probe code (a changed
    probe starts a probe of its own; the old one ends when idle)."""
    key = json.dumps([str(release_cache.root().resolve()), env.version,
                      hashlib.sha256(probe_text.encode()).hexdigest()])
    return f"sglang-fleet-probe-{os.getuid()}-{hashlib.sha256(key.encode()).hexdigest()[:24]}"


def _connect(name: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect("\0" + name)
    except (ConnectionRefusedError, FileNotFoundError):
        conn.close()
        return None
    return conn


def _log(env: RefEnv) -> Path:
    return release_cache.root() / f"probe-{env.version}.log"


def _start(env: RefEnv, probe: Path, name: str) -> socket.socket:
    """Start the release's probe and wait until it listens (it imports SGLang first)."""
    log = _log(env)
    with open(log, "w") as out:
        proc = subprocess.Popen([str(env.python), str(probe), "serve", name, str(IDLE_S)],
                                env=env.environment(), cwd=env.sglang_dir,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        conn = _connect(name)
        if conn is not None:
            return conn
        if proc.poll() is not None:
            raise WarmProbeError(f"SGLang {env.version}'s probe ended as it started "
                                 f"(exit {proc.returncode}): "
                                 f"{log.read_text(errors='replace').strip()[-2000:]}")
        time.sleep(_POLL_S)
    raise WarmProbeError(f"SGLang {env.version}'s probe did not listen within "
                         f"{START_TIMEOUT_S} s (its output: {log})")


def _connection(env: RefEnv, probe: Path, name: str) -> socket.socket:
    conn = _connect(name)
    if conn is not None:
        return conn
    with release_cache.locked(f"probe-{env.version}"):
        return _connect(name) or _start(env, probe, name)


def _exchange(conn: socket.socket, question: bytes) -> bytes:
    """The answer, or b"" where the probe ended before it took the question (it reached its
    idle end, or was stopped, as the question came)."""
    with conn:
        conn.settimeout(ANSWER_TIMEOUT_S)
        try:
            conn.sendall(question)
            conn.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := conn.recv(1 << 16):
                chunks.append(chunk)
        except (ConnectionResetError, BrokenPipeError):
            return b""
    return b"".join(chunks)


def ask(env: RefEnv, probe: Path, probe_text: str, command: str, payload: Any = None) -> Any:
    """The warm probe's answer to one question (started first where none listens; started
    again where it ended as the question came)."""
    name = socket_name(env, probe_text)
    question = json.dumps({"command": command, "payload": payload}).encode()
    raw = _exchange(_connection(env, probe, name), question) or \
        _exchange(_connection(env, probe, name), question)
    if not raw:
        raise WarmProbeError(f"SGLang {env.version}'s probe closed without an answer "
                             f"(its output: {_log(env)})")
    answer = json.loads(raw)
    if "error" in answer:
        raise WarmProbeError(f"SGLang {env.version}'s probe failed: {answer['error'][-2000:]}")
    return answer["result"]


def stop(env: RefEnv, probe_text: str) -> bool:
    """Ask the release's warm probe to end; whether one was listening (one that was already
    ending as it was asked, and so never answered, counts as none)."""
    conn = _connect(socket_name(env, probe_text))
    if conn is None:
        return False
    return bool(_exchange(conn, json.dumps({"command": "stop"}).encode()))
