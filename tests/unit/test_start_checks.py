"""Check before you stop: what a new server needs from its node (free space, its port, its
model), on real filesystems, sockets and processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from sglang_fleet.node.process import startcheck as check
from sglang_fleet.testfleet.local import wait_for

MIB = 1 << 20


@pytest.fixture
def full_fs(tmp_path):
    """A 64 KiB tmpfs filled to the last byte, as in the trial (needs root; unmounted after)."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        with open(mount / "filler", "wb", buffering=0) as f, \
                pytest.raises(OSError, match="No space"):
            while True:
                f.write(b"x" * 4096)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_log_filesystem_is_named_before_anything_stops(full_fs, tmp_path):
    problems = check.space_problems(
        [("log folder", str(full_fs / "logs"), "free space there"),  # not made yet: its parent
         ("run folder", str(tmp_path), "free space there")], 64 * MIB)
    assert len(problems) == 1
    assert problems[0].startswith(f"log folder {full_fs}/logs has 0 B free (64.0 MiB needed)")
    assert "No space left on device" in problems[0] and "Fix: free space there" in problems[0]


def test_port_held_by_another_program_blocks_but_the_replaced_server_does_not():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        (problem,) = check.port_problems("127.0.0.1", port, member_pids=set())
        assert f"port 127.0.0.1:{port} is held by" in problem
        assert "would load its weights and then die on bind" in problem
        # Held by the server being replaced (a member): fine, it is stopped first.
        assert check.port_problems("127.0.0.1", port, member_pids={os.getpid()}) == []
        # A wildcard listener of the new server conflicts with any address on that port.
        assert check.port_problems("0.0.0.0", port, member_pids=set())
        # Another address on the same port does not.
        assert check.port_problems("127.0.0.2", port, member_pids=set()) == []
    assert check.port_problems("127.0.0.1", port, member_pids=set()) == []


def test_port_held_by_another_node_of_the_same_group_on_this_machine():
    code = ("import os, socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\n"
            "s.listen()\nprint(s.getsockname()[1], flush=True)\ntime.sleep(60)\n")
    env = dict(os.environ, SGLANG_FLEET_DEPLOYMENT="sim-node-1:Kimi-K2.5-1")
    rank0 = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        port = int(rank0.stdout.readline())
        wait_for(lambda: check.listening_inodes(port, "127.0.0.1"))
        assert check.port_problems("127.0.0.1", port, set(),
                                   ["sim-node-1:Kimi-K2.5-1", "sim-node-2:Kimi-K2.5-1"]) == []
        assert check.port_problems("127.0.0.1", port, set(), ["sim-node-9:x"])
    finally:
        rank0.kill()
        rank0.wait()


def test_model_path_must_exist_with_its_config(tmp_path):
    missing = tmp_path / "models" / "Kimi-K2.5"
    (problem,) = check.model_problems(str(missing))
    assert problem.startswith(f"model path {missing} does not exist on the node")
    missing.mkdir(parents=True)
    (problem,) = check.model_problems(str(missing))
    assert "has no config.json" in problem
    (missing / "config.json").write_text("{}")
    assert check.model_problems(str(missing)) == []
    # A hub id is SGLang's to download.
    assert check.model_problems("moonshotai/Kimi-K2.5") == []


def test_a_link_where_the_server_writes_blocks_its_start(tmp_path):
    """The log file or the log and run folders as symbolic links: the server would write
    through them, outside the deployment's root."""
    private = tmp_path / "private"
    private.mkdir()
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "logs").symlink_to(private)
    options = {"log_file": str(root / "logs" / "d.log"), "state_file": str(root / "run" / "d.pid"),
               "shm_dir": str(tmp_path), "min_free_mb": 0, "host": "127.0.0.1", "port": None,
               "group_markers": [], "model_path": None}
    (problem,) = check.server_start_blockers(options, [])
    assert problem.startswith(f"{root}/logs is a symbolic link (to {private})")
    assert "Fix: replace the link by a real folder" in problem
    (root / "logs").unlink()
    (root / "logs").mkdir()
    (root / "logs" / "d.log").symlink_to(private / "secret.log")
    (problem,) = check.server_start_blockers(options, [])
    assert "d.log is a symbolic link" in problem
    (root / "logs" / "d.log").unlink()
    assert check.server_start_blockers(options, []) == []


def test_another_deployment_of_the_same_host_still_running_is_named_with_its_stop(tmp_path):
    """Trial: deploying again on another port (the deployment's name is <served>-<port>, so its
    files get a new name) left the old server running, unmanaged, on the same GPUs."""
    import json
    import uuid

    from sglang_fleet.node.process.procs import MARKER_VAR

    host = f"node-{uuid.uuid4().hex[:8]}"
    run = tmp_path / "run"
    run.mkdir()
    alive = []

    def deployment(marker, live, port=None):
        name = marker.partition(":")[2]
        (run / f"{name}.pid").write_text(json.dumps({"marker": marker, "pid": None}))
        if port:
            (run / f"{name}.running-spec.json").write_text(json.dumps({"http": {"port": port}}))
        if live:
            alive.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                          env={**os.environ, MARKER_VAR: marker}))

    try:
        deployment(f"{host}:Kimi-K2.5-30001", live=False)          # this deployment
        deployment(f"{host}:Kimi-K2.5-30000", live=True, port=30000)  # the old port's server
        deployment(f"{host}:Kimi-K2.5-29000", live=False)           # stopped: nothing to say
        deployment(f"other-{host}:Kimi-K2.5-31000", live=True)      # another inventory host
        mine = str(run / "Kimi-K2.5-30001.pid")
        wait_for(lambda: check.other_deployments_running(mine, f"{host}:Kimi-K2.5-30001"), 10)
        (found,) = check.other_deployments_running(mine, f"{host}:Kimi-K2.5-30001")
        assert found["marker"] == f"{host}:Kimi-K2.5-30000" and found["port"] == 30000
        assert found["pids"] == [alive[0].pid]
        message = check.orphan_refusal(f"{host}:Kimi-K2.5-30001", [found])
        assert message.startswith(f"another deployment of {host} still runs under the same "
                                  f"root: {host}:Kimi-K2.5-30000 (port 30000, 1 process(es)")
        assert (f"Fix: stop it first: ansible-playbook playbooks/stop.yml --limit {host} "
                "-e sglang_server_deployment_name=Kimi-K2.5-30000 -e sglang_server_port=30000"
                in message)
    finally:
        for proc in alive:
            proc.kill()
            proc.wait()
    assert check.other_deployments_running(mine, f"{host}:Kimi-K2.5-30001") == []


def test_a_prefills_bootstrap_port_held_by_another_program_blocks_its_start(tmp_path):
    """The KV bootstrap server binds beside the HTTP server: a port another program holds
    would leave the prefill serving without it, so the start is refused as for its HTTP
    port, naming the setting that moves it."""
    options = {"log_file": str(tmp_path / "logs" / "d.log"),
               "state_file": str(tmp_path / "run" / "d.pid"), "shm_dir": str(tmp_path),
               "min_free_mb": 0, "host": "127.0.0.1", "port": None, "group_markers": [],
               "model_path": None}
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        (problem,) = check.server_start_blockers(dict(options, bootstrap_port=port), [])
        assert problem.startswith(f"the prefill's KV bootstrap port 127.0.0.1:{port} is held "
                                  f"by {os.getpid()} (")
        assert ("no decode could fetch its KV cache. Fix: stop that program, or set "
                "sglang_server_disaggregation_bootstrap_port to a free port") in problem
        # Held by the server being replaced: it is stopped first.
        assert check.server_start_blockers(dict(options, bootstrap_port=port),
                                           [os.getpid()]) == []
        assert check.server_start_blockers(options, []) == []  # not a prefill
