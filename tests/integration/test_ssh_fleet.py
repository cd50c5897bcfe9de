"""The real playbooks over real SSH: a non-root login user, sudo to root, pipelining, each
node its own sshd on its own loopback address; and the faults of a real rollout."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sglang_fleet.node.process.procs import deployment_processes, stop_deployment
from sglang_fleet.testfleet.local import (
    BIN,
    FAST_GATE,
    REPO,
    add_tp16_group,
    ansible_env,
    http_status,
    wait_for,
)
from sglang_fleet.testfleet.ssh import control_dir, make_ssh_fleet, unavailable

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


@pytest.fixture
def ssh_fleet(tmp_path):
    fleet = make_ssh_fleet(tmp_path, hosts=3)
    yield fleet
    for host in fleet.hosts:
        if fleet.nodes[host].proc and fleet.nodes[host].proc.poll() is not None:
            fleet.start_sshd(host)  # a fault test stopped it: stop the server through it
    control = control_dir(fleet.public_dir)
    try:
        fleet.stop()
        shared = any(control.iterdir())
    finally:
        fleet.close()
        fleet.kill_leftovers()
    assert shared, "Ansible shared its connections through the fleet's folder"
    # No connection-sharing master (nor its sshd session) outlives the fleet.
    assert not [p for p in _cmdlines() if str(control) in p]


def _cmdlines() -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return out


def cli(fleet, command: str, run_dir, *more: str, **extra) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [str(BIN / "sglang-fleet"), command, "-i", str(fleet.inventory), "--run-dir",
         str(run_dir), "-e", json.dumps(fleet.with_stores(**FAST_GATE, **extra)), *more],
        cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=600)
    summary = json.loads((run_dir / "summary.json").read_text())
    return proc.returncode, summary, proc.stdout


def test_deploy_over_ssh_with_become(ssh_fleet, tmp_path):
    code, summary, out = cli(ssh_fleet, "deploy", tmp_path / "first")
    assert code == 0, out[-3000:]
    assert {h: r["verdict"] for h, r in summary["hosts"].items()} == dict.fromkeys(
        ssh_fleet.hosts, "ready")
    for host in ssh_fleet.hosts:
        assert http_status(ssh_fleet.url(host) + "/health") == 200
        # Written through sudo: root's files, the env file unreadable by the login user.
        env_file = next(ssh_fleet.host_root(host).glob("conf/*.env"))
        st = env_file.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
        # The server runs as root, as the service user says, not as the login user.
        main = ssh_fleet.server_processes(host)[0]
        assert os.stat(f"/proc/{main['pid']}").st_uid == 0
    # Nothing changed: the second run over SSH changes nothing.
    again = ssh_fleet.deploy(extra=ssh_fleet.with_stores(**FAST_GATE))
    assert again.rc == 0 and not again.changed_hosts(), again.output[-2000:]


def test_a_node_lost_mid_rollout_is_reported_and_the_rollout_stops(ssh_fleet, tmp_path):
    """serial 1, no failure tolerated: node 2 becomes unreachable while node 1 deploys."""
    run_dir = tmp_path / "lost"
    cmd = [str(BIN / "sglang-fleet"), "deploy", "-i", str(ssh_fleet.inventory), "--serial", "1",
           "--max-fail-percentage", "0", "--run-dir", str(run_dir),
           "-e", json.dumps(ssh_fleet.with_stores(**FAST_GATE))]
    proc = subprocess.Popen(cmd, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        # Node 1's server starting means its batch is under way: cut node 2 off now.
        wait_for(lambda: ssh_fleet.server_processes("ssh-node-1"), timeout=120)
        ssh_fleet.stop_sshd("ssh-node-2")
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    hosts = summary["hosts"]
    assert hosts["ssh-node-1"]["verdict"] == "ready"
    assert hosts["ssh-node-2"]["status"] == "unreachable"
    assert hosts["ssh-node-3"]["status"] == "not started", \
        "max_fail_percentage 0 stops the rollout after node 2"
    assert not ssh_fleet.server_processes("ssh-node-3")
    assert "UNREACHABLE [ssh-node-2]" in out


def test_a_failed_disk_write_fails_only_that_node(ssh_fleet, tmp_path):
    """ssh-node-2's configuration folder is a full filesystem: writes fail with ENOSPC."""
    conf = ssh_fleet.host_root("ssh-node-2") / "conf"
    conf.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(conf)], check=True)
    try:
        (conf / "filler").write_bytes(b"\0" * 12288)
        code, summary, out = cli(ssh_fleet, "deploy", tmp_path / "disk")
    finally:
        subprocess.run(["umount", str(conf)], check=False)
    assert code == 1, out[-3000:]
    two = summary["hosts"]["ssh-node-2"]
    assert two["status"] == "failed" and two["stages"]["deploy"] == "failed"
    assert "No space left on device" in two["message"], two["message"]
    assert summary["hosts"]["ssh-node-1"]["verdict"] == "ready"
    assert summary["hosts"]["ssh-node-3"]["verdict"] == "ready"
    assert not ssh_fleet.server_processes("ssh-node-2"), "nothing half-configured started"


def test_a_hang_on_one_rank_recovers_the_whole_group(tmp_path):
    fleet = add_tp16_group(make_ssh_fleet(tmp_path, hosts=2), tmp_path)
    # Only rank 1 hangs, in CUDA graph capture; rank 0 alone looks fine.
    fleet.set_host_vars("ssh-node-2", {"sglang_server_sim_fault": "hang:capturing_cuda_graph"})
    try:
        code, summary, out = cli(fleet, "deploy", tmp_path / "deploy")
        assert code == 1, out[-3000:]
        assert summary["hosts"]["ssh-node-2"]["verdict"] == "stalled"
        port = fleet.port("ssh-node-1")  # the group's one port names both nodes' deployment

        def server_pids(host: str) -> set[int]:
            return {p["pid"] for p in deployment_processes(f"{host}:Kimi-K2.5-{port}")
                    if not p["cmdline"].startswith("/bin/sh -c")}

        before = {h: server_pids(h) for h in fleet.hosts}
        assert all(before.values())
        fleet.set_host_vars("ssh-node-2", {})  # the cause fixed; recovery redeploys
        code, summary, out = cli(fleet, "recover", tmp_path / "recover")
        assert code == 0, out[-3000:]
        for host in fleet.hosts:  # the hung rank and its healthy peer, both
            record = summary["hosts"][host]
            assert record["recovery"] is not None, (host, record)
            assert record["verdict"] == "ready"
            after = server_pids(host)
            assert after and not after & before[host], f"{host} was restarted"
        assert summary["hosts"]["ssh-node-2"]["recovery"]["verdict"] == "stalled"
        assert http_status(fleet.url("ssh-node-1") + "/health") == 200
    finally:
        fleet.stop()
        fleet.close()
        for host in fleet.hosts:
            stop_deployment(f"{host}:Kimi-K2.5-{fleet.port('ssh-node-1')}", term_timeout=5)
