"""Issue 13.6, reproduced: a deploy checks what the new server needs before it stops the running
one, and write errors in the launch path reach the verdict's evidence."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, http_status, wait_for

pytestmark = pytest.mark.integration

HOST = "sim-node-1"


@pytest.fixture
def tmpfs():
    """Mount small tmpfs filesystems (needs root); every one is unmounted after the test."""
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path) -> None:
    """Write until the filesystem is full."""
    with open(folder / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * (1 << 20))
        except OSError:
            pass
        try:
            while True:
                f.write(b"x" * 512)
        except OSError:
            pass


def serving_pid(fleet) -> int:
    pid = fleet.main_pid(HOST)
    assert pid and http_status(fleet.url(HOST) + "/health") == 200
    return pid


def test_a_full_log_filesystem_leaves_the_old_server_serving(one_node, tmpfs):
    """Trial: with a full 64 KiB tmpfs as the log filesystem, the running server was stopped
    and the new one died with status 120, 'No space left on device' named nowhere."""
    assert one_node.deploy().rc == 0
    before = serving_pid(one_node)
    # The running server keeps writing to its open log; new writes land on the full tmpfs.
    fill(tmpfs(one_node.host_root(HOST) / "logs", "64k"))
    run = one_node.deploy(extra={"sglang_server_extra_env": {"SGLANG_ENABLE_JIT_DEEPGEMM": 0,
                                                             "SGLANG_HEALTH_CHECK_TIMEOUT": 30}})
    assert run.rc != 0
    out = " ".join(run.output.split())
    assert "the new server cannot start here: log folder" in out
    assert "'No space left on device'" in out
    assert f"Nothing was stopped: the running server (pid {before}" in out
    assert serving_pid(one_node) == before


def test_a_port_held_by_another_program_refuses_the_start_before_loading(one_node):
    """Trial: with the port held by another program, the new server loaded fully and only
    then died on bind."""
    assert one_node.deploy().rc == 0
    assert one_node.stop().rc == 0
    log_before = one_node.log_file(HOST).read_text()
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", one_node.port(HOST)))
        other.listen()
        run = one_node.deploy()
    assert run.rc != 0
    out = " ".join(run.output.split())
    assert f"port 127.0.0.1:{one_node.port(HOST)} is held by" in out
    assert "not by the server being replaced" in out
    assert one_node.server_processes(HOST) == []
    assert one_node.log_file(HOST).read_text() == log_before, "nothing was started"
    assert one_node.deploy().rc == 0, "the port is free again: it starts"


def test_a_missing_model_path_outside_the_node_is_refused_and_nothing_written(one_node,
                                                                               tmp_path):
    """Trial: a model path that does not exist passed; on the simulated fleet, files were
    written outside the node root."""
    assert one_node.deploy().rc == 0
    before = serving_pid(one_node)
    outside = tmp_path / "elsewhere" / "Kimi-K2.5"
    run = one_node.deploy(extra={"sglang_server_model_path": str(outside)})
    assert run.rc != 0
    out = " ".join(run.output.split())
    assert f"sglang_server_model_path={outside} is outside" in out
    assert not (tmp_path / "elsewhere").exists(), "files were written outside the node"
    assert serving_pid(one_node) == before


def test_a_log_write_error_after_start_is_named_in_the_verdict(one_node, tmpfs):
    """The log filesystem fills up while the new server starts: the server dies unable to
    write its log, and the verdict's evidence names 'No space left on device' from the
    supervisor's own write test, where the log itself has nothing."""
    logs = tmpfs(one_node.host_root(HOST) / "logs", "65m")  # passes the 64 MiB check
    state = one_node.host_root(HOST) / "run" / f"Kimi-K2.5-{one_node.port(HOST)}.pid"
    cmd = [str(BIN / "ansible-playbook"), "-i", str(one_node.inventory), "deploy.yml",
           "-e", json.dumps({**one_node.extra, "sglang_server_sim_time_factor": 0.05})]
    with subprocess.Popen(cmd, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as deploy:
        wait_for(lambda: state.exists() and json.loads(state.read_text()).get("pid"),
                 timeout=120, interval=0.02)
        fill(logs)  # while the server loads: its next log lines fail
        out, _ = deploy.communicate(timeout=300)
    assert deploy.returncode != 0, out[-3000:]
    flat = " ".join(out.split())
    assert f"{HOST}: crashed" in flat, out[-3000:]
    assert "launch_errors" in out and "No space left on device" in flat
