"""Node-side safety trials through real ansible-playbook runs: a lock held from another PID
namespace, an empty lock, shared-memory cleanup in a folder shared with others, symlinked
folders, a port change that would orphan a running server, a killed recovery finished by a
stop."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sglang_fleet.node.process import procs
from sglang_fleet.testfleet.local import (
    BIN,
    REPO,
    ansible_env,
    link_node_folder,
    run_playbook,
    wait_for,
)

pytestmark = pytest.mark.integration

HOST = "sim-node-1"


def ledger(fleet):
    path = Path(fleet.extra["sglang_fleet_ledger"])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def lock_path(fleet):
    return fleet.host_root(HOST) / "run" / f"Kimi-K2.5-{fleet.port(HOST)}.recover.lock"


def flat(text):
    return " ".join(text.split())


HOLDER = """\
- name: Hold a deployment's lock, renewing it each second, as a live run does
  hosts: sglang_servers
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: sglang.fleet.sglang_server, tasks_from: spec.yml}
    - name: Take and renew the lock
      sglang.fleet.sglang_lock:
        path: "{{ sglang_server_launch_spec.paths.recover_lock }}"
        name: "{{ sglang_server_launch_spec.marker }}"
        purpose: deploy
        owner: a deploy from a container
        lease: 8
      loop: "{{ range(600) | list }}"
      loop_control: {pause: 1, label: "{{ item }}"}
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a PID namespace needs root and unshare(1)")
def test_a_lock_held_from_another_pid_namespace_is_refused_while_its_run_lives(
        one_node, tmp_path):
    """Trials: a controller in another PID namespace on the same host (a container with host
    networking) looked dead by its PID, its lock was taken and both deploys reported ok; once
    it was dead, its lock blocked even a stop for its whole lease. Its PID means nothing in
    this namespace: from the kernel's initial PID namespace (as root) the run is found in its
    own, alive or gone; from anywhere else its lease decides."""
    from_init = os.readlink("/proc/self/ns/pid") == "pid:[4026531836]"
    playbook = tmp_path / "holder.yml"
    playbook.write_text(HOLDER)
    holder = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", str(BIN / "ansible-playbook"), "-i",
         str(one_node.inventory), str(playbook), "-e", json.dumps(one_node.extra)],
        cwd=REPO, env=ansible_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    lock = lock_path(one_node)
    try:
        wait_for(lambda: lock.exists() and "container" in lock.read_text(), timeout=120,
                 interval=0.2)
        held = json.loads(lock.read_text())
        assert held["run"]["pid_ns"] != os.readlink("/proc/self/ns/pid")
        refused = one_node.deploy()
        assert refused.rc != 0
        out = flat(refused.output)
        assert "is locked by a deploy from a container" in out
        if from_init:
            assert (f"It is alive (pid {held['run']['pid']} in PID namespace "
                    f"{held['run']['pid_ns']}, a container on this controller: found from the "
                    "initial PID namespace)") in out
        else:
            assert "cannot be checked from here" in out and "its lease runs out in" in out
        assert one_node.server_processes(HOST) == [], "nothing started"
        assert json.loads(lock.read_text())["run"]["run_id"] == held["run"]["run_id"]
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # its whole PID namespace goes with it
        holder.wait()
    if not from_init:
        silent_since = time.time()
        wait_for(lambda: time.time() - silent_since > 9, timeout=30, interval=0.5)
    run = one_node.stop()
    assert run.rc == 0, run.output[-3000:]
    out = flat(run.output)
    assert "took over the lock of a deploy from a container" in out
    because = ("is gone (no process of its kernel is that run: checked from the initial PID "
               "namespace" if from_init else "longer than its lease (8 s)")
    assert because in out
    (taken,) = [e for e in ledger(one_node) if e["kind"] == "lock_taken_over"]
    assert taken["by"] == "stop" and because in taken["because"]
    assert taken["from_run"]["run_id"] == held["run"]["run_id"]
    assert not lock.exists(), "released after the stop"


def test_an_empty_lock_file_is_taken_over_with_a_ledger_entry(one_node):
    """Trial: an empty lock file blocked the deployment forever ("it keeps appearing and
    disappearing", no fix)."""
    lock = lock_path(one_node)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_bytes(b"")
    past = time.time() - 60
    os.utime(lock, (past, past))
    run = one_node.deploy()
    assert run.rc == 0, run.output[-3000:]
    assert "took over the lock of an empty lock file" in flat(run.output)
    (taken,) = [e for e in ledger(one_node) if e["kind"] == "lock_taken_over"]
    assert "the lock file is empty" in taken["because"]
    assert not lock.exists()


def test_a_symlinked_logs_folder_is_refused_and_its_target_untouched(one_node, tmp_path):
    """Trial: a `logs` folder that was a symlink to a 0700 folder elsewhere: the deploy changed
    the target to 0755 and wrote the server log into it."""
    private = tmp_path / "private"
    logs = link_node_folder(one_node, HOST, "logs", private)
    run = one_node.deploy()
    assert run.rc != 0
    out = flat(run.output)
    assert f"{logs} is a symbolic link (to {private})" in out
    assert "Fix: replace the link by a folder" in out
    assert os.stat(private).st_mode & 0o777 == 0o700
    assert list(private.iterdir()) == []
    assert one_node.server_processes(HOST) == []
    assert not lock_path(one_node).exists(), "the lock is released"


def test_a_stop_that_takes_over_a_killed_recovery_files_it_in_the_ledger(one_node):
    """Trial: a recovery killed after its stop and finished by stop.yml left no ledger entry
    (the deploy path records it as interrupted)."""
    gone = subprocess.Popen(["/bin/true"])
    gone.wait()
    from sglang_fleet.node.deploy import lock as lk
    lock = lock_path(one_node)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({
        "owner": "recovery of sim-node-1", "purpose": "recover", "since": time.time(),
        "run": lk.run_identity(os.getpid()) | {"pid": gone.pid, "run_id": "killed-run"},
        "recovery": {"stage": "stopped", "failed_config_hash": "0123456789ab",
                     "verdict": {"verdict": "stalled", "phase": "capturing_cuda_graph",
                                 "reason": "x"},
                     "evidence": "/evidence/sim-node-1/x", "stop": {"killed": [{"pid": 7}]}}}))
    run = one_node.stop()
    assert run.rc == 0, run.output[-3000:]
    entries = ledger(one_node)
    assert [e["kind"] for e in entries] == ["lock_taken_over", "recovery"]
    taken, recovery = entries
    assert taken["by"] == "stop" and f"pid {gone.pid}" in taken["because"]
    assert recovery["interrupted"] is True and recovery["finished_by"] == "stop"
    assert recovery["config_hash"] == "0123456789ab" and recovery["verdict"] == "stalled"
    assert recovery["killed"] == [7]
    # Each entry names the run that wrote it (the stop), never the run it took over from.
    assert {e["run"]["id"] for e in entries} == {taken["run"]["id"]} != {"killed-run"}
    assert taken["run"]["pid"] != gone.pid and taken["from_run"]["run_id"] == "killed-run"
    assert not lock.exists()


def test_a_port_change_refuses_while_the_old_server_runs_and_names_its_stop(one_node):
    """Trial: deploying the deployment again on another port (its name is <served>-<port>, so
    its files got a new name) left the old server running, unmanaged, on the same GPUs, with
    no warning, out of stop.yml's reach. The node check refuses before anything changes, with
    the command that stops the old one; after that command the deploy goes through."""
    from sglang_fleet.testfleet.local import free_port_block

    assert one_node.deploy().rc == 0
    old_port = one_node.port(HOST)
    before = sorted(p["pid"] for p in one_node.server_processes(HOST))
    new_port = free_port_block(1)
    refused = one_node.deploy(extra={"sglang_server_port": new_port})
    assert refused.rc != 0
    out = flat(refused.output)
    assert (f"another deployment of {HOST} still runs under the same root: "
            f"{HOST}:Kimi-K2.5-{old_port} (port {old_port}") in out
    fix = (f"ansible-playbook playbooks/stop.yml --limit {HOST} -e "
           f"sglang_server_deployment_name=Kimi-K2.5-{old_port} -e sglang_server_port={old_port}")
    assert f"Fix: stop it first: {fix}" in out
    assert sorted(p["pid"] for p in one_node.server_processes(HOST)) == before, "untouched"
    run_dir = one_node.host_root(HOST) / "run"
    assert not list(run_dir.glob(f"Kimi-K2.5-{new_port}.*")), "nothing written for the new one"
    stop = run_playbook("playbooks/stop.yml", one_node.inventory, one_node.extra,
                        *fix.split()[2:])
    assert stop.rc == 0, stop.output[-3000:]
    assert one_node.server_processes(HOST) == []
    try:
        moved = one_node.deploy(extra={"sglang_server_port": new_port})
        assert moved.rc == 0, moved.output[-3000:]
        assert f"{HOST}: ready at" in moved.output
    finally:  # the fixture ends the inventory port's deployment, not this one
        procs.stop_deployment(f"{HOST}:Kimi-K2.5-{new_port}", term_timeout=5)


def test_a_long_gate_renews_the_lease_of_the_run_that_holds_the_lock(one_node):
    """The lease counts from the owner's last sign of life: each gate observation renews it,
    so a slow start is a live owner's, never a stale lock."""
    slow = {**one_node.extra, "sglang_server_sim_time_factor": 0.05,
            "sglang_server_gate_poll_interval": 2}
    first = subprocess.Popen(
        [str(BIN / "ansible-playbook"), "-i", str(one_node.inventory), "deploy.yml", "-e",
         json.dumps(slow)], cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    lock = lock_path(one_node)
    seen = {}
    try:
        while first.poll() is None:
            try:
                record = json.loads(lock.read_text())
            except (OSError, ValueError):
                record = None
            if record:
                seen[record["renewed"]] = record["run"]["run_id"]
            time.sleep(0.2)
        out = first.stdout.read()
    finally:
        if first.poll() is None:
            first.kill()
        first.wait()
    assert first.returncode == 0, out[-3000:]
    assert len(set(seen.values())) == 1, "one run held it throughout"
    assert len(seen) >= 3, f"renewed during the gate: {sorted(seen)}"
    assert not lock.exists()


def test_a_symlinked_run_folder_is_refused_before_anything_is_written_through_it(
        one_node, tmp_path):
    """Trial: a `run` folder that was a symlink to a folder elsewhere: the node wrote the
    argument check's record (0644) and the lock into the link's target before the start check
    refused it."""
    private = tmp_path / "private"
    run_dir = link_node_folder(one_node, HOST, "run", private)
    run = one_node.deploy()
    assert run.rc != 0
    out = flat(run.output)
    assert f"{run_dir} is a symbolic link (to {private})" in out
    assert list(private.iterdir()) == [], "nothing written into the link's target"
    assert os.stat(private).st_mode & 0o777 == 0o700
    assert one_node.server_processes(HOST) == []


def _lock_from_another_controller(fleet, silent_s):
    """The lock of a deploy run from a controller this one cannot check (another machine, or
    a container seen from another container), declaring a 4.6-hour lease, last renewed
    `silent_s` ago on this node's boot clock."""
    from sglang_fleet.node.deploy import lock as lk
    run = dict(lk.run_identity(os.getpid()), boot_id="another-kernel", pid=41,
               host="ci-runner", run_id="container-run")
    record = lk.lock_record(f"{HOST}:Kimi-K2.5-{fleet.port(HOST)}", "deploy", run,
                            "a deploy from a container", lease=16560)
    record.update(renewed=time.time() - silent_s, since=time.time() - silent_s,
                  renewed_uptime=time.clock_gettime(time.CLOCK_BOOTTIME) - silent_s)
    lock = lock_path(fleet)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps(record))
    return lock


def test_a_stop_takes_over_a_silent_lock_it_cannot_check_without_its_whole_lease(one_node):
    """Trial: a lock left by a dead controller that cannot be checked from here blocked even
    a stop for its whole 4.6-hour lease. A stop waits for such an owner only while it renews
    (900 s); a deploy still waits for the lease."""
    lock = _lock_from_another_controller(one_node, silent_s=30)
    refused = one_node.stop()
    assert refused.rc != 0
    out = flat(refused.output)
    assert "is locked by a deploy from a container" in out
    waits = re.search(r"a stop takes it over once the lock has gone 900 s unrenewed "
                      r"\(in (\d+) s unless renewed\)", out)
    assert waits and 800 < int(waits.group(1)) <= 870, out
    assert json.loads(lock.read_text())["run"]["run_id"] == "container-run"

    lock = _lock_from_another_controller(one_node, silent_s=1000)
    deploy = one_node.deploy()
    assert deploy.rc != 0 and "its lease runs out in" in flat(deploy.output)
    assert one_node.server_processes(HOST) == []
    stop = one_node.stop()
    assert stop.rc == 0, stop.output[-3000:]
    assert "took over the lock of a deploy from a container" in flat(stop.output)
    (taken,) = [e for e in ledger(one_node) if e["kind"] == "lock_taken_over"]
    assert taken["by"] == "stop" and taken["from_run"]["run_id"] == "container-run"
    assert re.search(r"has not renewed the lock for 1\d\d\d s", taken["because"])
    assert "a stop waits at most 900 s for such a run, not its whole lease (16560 s)" in \
        taken["because"]
    assert not lock.exists()
