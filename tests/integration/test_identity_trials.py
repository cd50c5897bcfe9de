"""Issue 13.2, reproduced: identity, not numbers. A PID recorded in a state file is trusted
only while it is the process recorded at start; processes of other users are never
signalled. Every trial runs the real playbooks against a simulated node."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from sglang_fleet.node.process import procs
from sglang_fleet.testfleet.local import http_status, run_playbook, wait_for

pytestmark = pytest.mark.integration

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def take_pid(pid: int) -> subprocess.Popen:
    """Start an unrelated session (a shell with a sleeping child, like an operator's login)
    whose leader gets exactly `pid`: the kernel hands out ns_last_pid + 1 next, so writing
    pid - 1 there just before forking reproduces PID reuse for real. Other processes on the
    machine may take the number first: retried."""
    for _ in range(200):
        with open(NS_LAST_PID, "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(["/bin/sh", "-c", "sleep 600 & wait"], start_new_session=True,
                                env={"PATH": os.environ["PATH"]})
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.skip(f"could not get PID {pid} for the unrelated session")


def session_pids(sid: int) -> set[int]:
    return {p for p in procs.all_pids() if (procs.process_info(p) or {}).get("sid") == sid}


def ours(fleet, host: str) -> list[dict]:
    """The deployment's processes that run as its service user, root."""
    return procs.deployment_processes(fleet.marker(host), uid=0)


def crash(fleet, host: str) -> int:
    """Crash the server the way the trial did: its main SGLang process dies (kill -9), its
    workers follow, the supervisor records the exit, and the state file keeps the old PID."""
    recorded = fleet.main_pid(host)
    main = next(p for p in ours(fleet, host)
                if "sglang_fleet.sim.launch_server" in p["cmdline"])
    os.kill(main["pid"], 9)
    wait_for(lambda: ours(fleet, host) == [] and procs.process_info(recorded) is None,
             timeout=30)
    assert fleet.main_pid(host) == recorded, "the state file keeps the old PID"
    return recorded


@pytest.fixture
def pid_reuse():
    if os.geteuid() != 0 or not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip("needs root and a writable ns_last_pid to reuse a PID for real")
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait()


@pytest.fixture
def other_users_marked_process(one_node):
    """A process of another user (nobody) that carries the deployment's marker."""
    env = {"PATH": os.environ["PATH"],
           procs.MARKER_VAR: one_node.marker("sim-node-1")}
    proc = subprocess.Popen(["/bin/sleep", "600"], env=env, user=65534, group=65534)
    wait_for(lambda: (procs.process_info(proc.pid) or {}).get("uid") == 65534)
    yield proc
    proc.kill()
    proc.wait()


def test_a_reused_pid_is_never_trusted_by_gate_stop_recover_or_deploy(
        one_node, pid_reuse, other_users_marked_process, tmp_path):
    """After a crash, an unrelated session that later got the recorded PID survives
    stop.yml, recover and deploy; the gate calls the dead server crashed, not unhealthy. A
    process of another user carrying the marker survives all of them and is reported.

    Reproduced with real PID reuse: the server's main process is killed, the supervisor's
    session leader exits, and a new session is forked with that very PID (ns_last_pid).
    Before the fix the state file's PID was used as the session id, so the new session's
    processes were the deployment's 'members': the gate said 'unhealthy ... serving', and
    stop.yml, recover and deploy killed the session."""
    nobody = other_users_marked_process
    host = "sim-node-1"
    assert one_node.deploy().rc == 0
    extra = {**one_node.extra, "sglang_fleet_ledger": str(tmp_path / "ledger.jsonl"),
             "sglang_fleet_evidence_dir": str(tmp_path / "evidence")}

    recorded = crash(one_node, host)
    session = take_pid(recorded)
    pid_reuse.append(session)
    unrelated = wait_for(lambda: len(session_pids(recorded)) == 2 and session_pids(recorded))

    health = run_playbook("playbooks/health.yml", one_node.inventory, extra)
    assert f"{host}: crashed" in health.output, health.output[-3000:]
    assert "unhealthy" not in health.output

    stop = run_playbook("playbooks/stop.yml", one_node.inventory, extra)
    assert stop.rc == 0, stop.output[-3000:]
    assert session_pids(recorded) == unrelated, "stop.yml killed the unrelated session"
    assert f"process {nobody.pid} (uid 65534" in stop.output
    assert "does not run as the service user root: not signalled" in stop.output

    # Stopped on purpose: recover leaves it stopped (and the unrelated session alone); a
    # deploy starts it again.
    recover = run_playbook("playbooks/recover.yml", one_node.inventory,
                           {**extra, "sglang_recover_on_failure": True})
    assert recover.rc == 0, recover.output[-4000:]
    assert f"{host}: stopped, nothing to recover" in recover.output
    assert session_pids(recorded) == unrelated, "recover killed the unrelated session"
    assert one_node.deploy().rc == 0
    assert session_pids(recorded) == unrelated, "deploy killed the unrelated session"
    assert http_status(one_node.url(host) + "/health") == 200

    # Once more for deploy: the recovered server crashes and its new PID is reused too.
    recorded = crash(one_node, host)
    session = take_pid(recorded)
    pid_reuse.append(session)
    unrelated = wait_for(lambda: len(session_pids(recorded)) == 2 and session_pids(recorded))
    deploy = one_node.deploy()
    assert deploy.rc == 0, deploy.output[-3000:]
    assert f"{host}: ready at" in deploy.output
    assert session_pids(recorded) == unrelated, "deploy killed the unrelated session"
    state = json.loads((one_node.host_root(host) / "run" /
                        f"Kimi-K2.5-{one_node.port(host)}.pid").read_text())
    assert state["pid"] != recorded and procs.same_process(
        {"pid": state["pid"], "start_ticks": state["pid_start"], "boot_id": state["boot_id"]})
    assert nobody.poll() is None, "a process of another user was signalled"
