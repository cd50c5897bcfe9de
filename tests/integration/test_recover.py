"""Recovery through real ansible-playbook runs: the incident end to end, bystanders that must
survive, orphans, memory that never comes back, the crash-loop guard, concurrent recovery."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from sglang_fleet.node.deploy import lock as lk
from sglang_fleet.node.gpu.gpu import gpu_snapshot
from sglang_fleet.node.process import procs
from sglang_fleet.testfleet.local import (
    BIN,
    FAST_GATE,
    REPO,
    SOAK_REQUESTS,
    ansible_env,
    free_port_block,
    make_fleet,
    make_tp16_group,
    own_stores,
    run_playbook,
    start_sim,
    wait_for,
)
from sglang_fleet.testfleet.router import registered, router_venv

pytestmark = pytest.mark.integration

INCIDENT = {"sglang_server_attention_backend": "flashinfer",
            "sglang_server_allow_rules": ["flashinfer-mla-sm120-graph-capture-hang"]}


def recover_settings(fleet, **more):
    """The fleet's extra vars (its own ledger and evidence) with recovery on failure."""
    return {**fleet.extra, **FAST_GATE, "sglang_recover_on_failure": True, **more}


def ledger(fleet):
    path = Path(fleet.extra["sglang_fleet_ledger"])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def evidence_bundles(fleet, host="sim-node-1"):
    return list((Path(fleet.extra["sglang_fleet_evidence_dir"]) / host).iterdir())


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory):
    """One node, ready on the inventory's configuration, shared by the tests that begin from a
    ready server: each starts in seconds (a no-change re-run) instead of deploying its own."""
    fleet = make_fleet(tmp_path_factory.mktemp("shared-node"), hosts=1)
    yield fleet
    fleet.kill_leftovers()


@pytest.fixture
def ready_node(shared_node, tmp_path):
    """The shared node, ready (re-deployed if the last test left it otherwise), seen through
    stores of this test's own: a ledger that holds only the last known good the node's deploys
    filed (so one test's recoveries never count in another's crash-loop guard), and an empty
    evidence folder."""
    run = shared_node.deploy()
    assert run.rc == 0, run.output[-3000:]
    good = [e for e in ledger(shared_node) if e["kind"] == "ready"][-1]
    node = dataclasses.replace(shared_node, extra={**shared_node.extra, **own_stores(tmp_path)})
    Path(node.extra["sglang_fleet_ledger"]).write_text(json.dumps(good) + "\n")
    return node


class Bystanders:
    """Processes recovery must never touch: an unrelated python3, a stand-in persistence
    daemon holding every simulated GPU device, and a second deployment on the same one_node."""

    def __init__(self, tmp, gpu_dir):
        self.plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        daemon = tmp / "nvidia-persistenced"
        daemon.symlink_to(sys.executable)
        holder = ("import sys, time\nfds = [open(p, 'rb') for p in sys.argv[1:]]\n"
                  "print('holding', flush=True)\ntime.sleep(600)\n")
        self.daemon = subprocess.Popen([str(daemon), "-c", holder,
                                        *[str(gpu_dir / f"nvidia{i}") for i in range(8)]],
                                       stdout=subprocess.PIPE, text=True)
        assert self.daemon.stdout.readline().strip() == "holding"
        self.other = start_sim(tmp / "other", "--tp-size", "1", "--attention-backend",
                               "triton")
        wait_for(lambda: "fired up" in self.other.log(), timeout=60)
        # Its processes once it serves (main, scheduler, detokenizer, resource tracker).
        self.other_pids = {p["pid"] for p in procs.deployment_processes(self.other.marker)}
        assert len(self.other_pids) >= 3, self.other_pids

    def alive(self):
        return (self.plain.poll() is None and self.daemon.poll() is None
                and self.other.proc.poll() is None
                and {p["pid"] for p in procs.deployment_processes(self.other.marker)}
                == self.other_pids)

    def stop(self):
        for p in (self.plain, self.daemon):
            p.kill()
            p.wait()
        self.other.stop()



def test_incident_replayed_end_to_end_with_bystanders_spared(ready_node, tmp_path):
    # The node is ready on the inventory's configuration, its last known good; the stand-in
    # persistence daemon holds the node's simulated GPUs.
    one_node = ready_node
    by = Bystanders(tmp_path, one_node.host_root("sim-node-1") / "sim" / "gpus")
    starts = one_node.log_file("sim-node-1").read_text().count("===== sglang-fleet: start")
    try:
        run = run_playbook("deploy.yml", one_node.inventory, recover_settings(one_node, **INCIDENT))
        assert run.rc == 0, run.output[-4000:]
        out = run.output
        assert "sim-node-1: stalled in capturing_cuda_graph" in out
        assert "sim-node-1: recovered:" in out
        assert "rule flashinfer-mla-sm120-graph-capture-hang" in " ".join(out.split())
        assert by.alive(), "recovery touched a bystander"
        info = requests.get(one_node.url("sim-node-1") + "/server_info", timeout=5).json()
        assert info["attention_backend"] == "triton"
        # The evidence bundle, fetched to the controller.
        (bundle,) = evidence_bundles(one_node)
        verdict = json.loads((bundle / "verdict.json").read_text())
        assert verdict["verdict"] == "stalled" and verdict["phase"] == "capturing_cuda_graph"
        assert "busy_wait" in verdict["evidence"]
        assert "Capture target decode CUDA graph begin" in (bundle / "log_tail.txt").read_text()
        assert "capturing_cuda_graph" in (bundle / "phase_timeline.txt").read_text()
        table = (bundle / "processes.txt").read_text()
        assert "sglang::scheduler_TP0" in table and "sglang::detokenizer" in table
        dumps = list(bundle.glob("py-spy-*.txt"))
        assert len(dumps) >= 10 and any("hang" in d.read_text() for d in dumps)
        # py-spy reads Python: the launch script's shell is listed, not dumped.
        shells = [int(row.split()[0]) for row in table.splitlines()
                  if row.split()[4:5] == ["/bin/sh"]]
        assert shells and not any((bundle / f"py-spy-{pid}.txt").exists() for pid in shells)
        # The fetch of the bundle is one line, and the recovery says where the bundle is.
        assert re.search(r"changed: \[sim-node-1\] => \d+ files fetched into \S+", out)
        assert "(item=py-spy" not in out
        # It came as one archive: private on the controller, and gone from the node, where
        # the bundle's folder stays.
        assert oct(bundle.stat().st_mode & 0o777) == "0o700"
        assert {oct(f.stat().st_mode & 0o777) for f in bundle.iterdir()} == {"0o600"}
        on_node = one_node.host_root("sim-node-1") / "evidence"
        assert (on_node / bundle.name / "verdict.json").exists()
        assert not list(on_node.glob("*.tar.gz")) and not list(bundle.parent.glob(".*"))
        assert f"Evidence: {bundle}" in " ".join(out.split())
        spec = json.loads((bundle / "launch_spec.json").read_text())
        assert spec["facts"]["attention_backend"] == "flashinfer"
        assert "No Xid" in (bundle / "kernel.txt").read_text() or \
            "no Xid" in (bundle / "kernel.txt").read_text()
        assert json.loads((bundle / "gpus.json").read_text())[0]["memory_used"] > 0
        # The ledger: the recovery, then the outcome.
        kinds = [e["kind"] for e in ledger(one_node)]
        assert kinds[-3:] == ["recovery", "ready", "recovery_outcome"]
        rec = [e for e in ledger(one_node) if e["kind"] == "recovery"][-1]
        # The incident's configuration differs from the ready deploy before it: back to that
        # last known good (which the Rule's fix, triton, also gives).
        assert rec["next"]["source"] == "last_known_good" and rec["reboot_needed"] is False
        # The recovery's three entries name the one run that wrote them.
        assert len({json.dumps(e["run"]) for e in ledger(one_node)[-3:]}) == 1
        assert rec["run"]["id"] and rec["run"]["controller"] and rec["run"]["pid"] > 0
        # Logs of the failed run are still on the node: the incident's start, then the
        # recovery's, each appended.
        log = one_node.log_file("sim-node-1").read_text()
        assert "Capture target decode CUDA graph begin" in log
        assert log.count("===== sglang-fleet: start") == starts + 2
        # GPUs back to one server's worth plus the bystander deployment's.
        snap = gpu_snapshot("simulated", str(one_node.host_root("sim-node-1") / "sim" / "gpus"))
        server_pids = {p["pid"] for p in one_node.processes("sim-node-1")}
        assert all(p["pid"] in server_pids | {pp["pid"] for pp in procs.deployment_processes(
            by.other.marker)} for d in snap for p in d["processes"])
    finally:
        by.stop()


def test_orphaned_workers_are_found_and_killed(one_node):
    run = one_node.deploy(extra={"sglang_server_sim_fault": "orphan_workers"})
    assert run.rc == 0, run.output[-3000:]
    main = next(p for p in one_node.processes("sim-node-1")
                if "sglang_fleet.sim.launch_server" in p["cmdline"])
    workers = [p["pid"] for p in one_node.processes("sim-node-1")
               if p["cmdline"].startswith("sglang::")]
    os.kill(main["pid"], 9)  # the parent dies; its workers are reparented and keep the GPUs
    wait_for(lambda: all(procs.process_info(w)["ppid"] != main["pid"] for w in workers))
    run = run_playbook("playbooks/recover.yml", one_node.inventory,
                       recover_settings(one_node, sglang_server_sim_fault="orphan_workers"))
    assert run.rc == 0, run.output[-4000:]
    assert "sim-node-1: recovered:" in run.output
    assert all(procs.process_info(w) is None for w in workers), "orphans survived"


def test_memory_never_released_marks_the_node_for_reboot(one_node):
    run = run_playbook("deploy.yml", one_node.inventory, recover_settings(
        one_node, sglang_server_sim_fault="leak_memory,hang:capturing_cuda_graph",
        sglang_recover_verify_timeout=2))
    assert run.rc != 0
    assert "GPU memory stayed held after the deployment was killed" in run.output
    mark = one_node.host_root("sim-node-1") / "NEEDS_REBOOT"
    assert mark.exists() and json.loads(mark.read_text())["held"]
    again = one_node.deploy()
    assert again.rc != 0 and "recovery marked this node for reboot" in again.output
    assert one_node.server_processes("sim-node-1") == []
    cleared = run_playbook("playbooks/recover.yml", one_node.inventory,
                           {**one_node.extra, "sglang_recover_clear_reboot_mark": True})
    assert cleared.rc == 0 and not mark.exists()


def test_crash_loop_guard_stops_after_the_configured_attempts(one_node):
    settings = recover_settings(one_node, sglang_server_sim_fault="crash:launching",
                                sglang_recover_max_attempts=1)
    first = run_playbook("deploy.yml", one_node.inventory, settings)
    assert first.rc != 0 and "and it failed again" in words(first.output)
    second = run_playbook("playbooks/recover.yml", one_node.inventory, settings)
    assert second.rc != 0
    assert "crash-loop guard: 1 recoveries within 3600 s (limit 1)" in second.output
    assert [e["kind"] for e in ledger(one_node)].count("recovery") == 1


UNHEALTHY = {"sglang_server_sim_fault": "hang_generation",
             "sglang_server_extra_env": {"SGLANG_HEALTH_CHECK_TIMEOUT": 1}}


def lock_path(fleet, host="sim-node-1"):
    return fleet.host_root(host) / "run" / f"Kimi-K2.5-{fleet.port(host)}.recover.lock"


def test_a_recovery_killed_after_its_stop_is_finished_by_the_next_run(one_node):
    """Trial: a recovery SIGKILLed after its stop and before its redeploy left the node down,
    with no ledger entry, and its lock refused recover for an hour. The next run takes the
    dead run's lock over, redeploys the configuration the killed run chose, gates it and
    writes the ledger entries. Its extra variables come as key=value strings, as an
    operator types them (-e sglang_recover_max_attempts=50 crashed the guard before)."""
    assert one_node.deploy(extra=UNHEALTHY).rc != 0
    lock = lock_path(one_node)
    cmd = [str(BIN / "ansible-playbook"), "-i", str(one_node.inventory), "playbooks/recover.yml",
           "-e", json.dumps(recover_settings(one_node))]
    first = subprocess.Popen(cmd, cwd=REPO, env=ansible_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def stage():
            try:
                return (json.loads(lock.read_text()).get("recovery") or {}).get("stage")
            except (OSError, ValueError):
                return None
        wait_for(lambda: stage() == "stopped" or first.poll() is not None, timeout=300,
                 interval=0.01)
        os.killpg(first.pid, signal.SIGKILL)  # between its stop and its redeploy
    finally:
        first.wait()
    assert stage() == "stopped"
    assert one_node.server_processes("sim-node-1") == [], "the node is down"
    killed_run = json.loads(lock.read_text())["run"]["pid"]

    started = time.monotonic()
    run = run_playbook("playbooks/recover.yml", one_node.inventory,
                       {k: v for k, v in recover_settings(one_node).items()
                        if not k.startswith("sglang_recover")},
                       "-e", "sglang_recover_on_failure=true",
                       "-e", "sglang_recover_max_attempts=50", "-e", "sglang_recover_window=3600",
                       "-e", "sglang_recover_term_timeout=5", "-e", "sglang_recover_redeploy=true",
                       "-e", "sglang_recover_verify_timeout=30")
    took = time.monotonic() - started
    assert run.rc == 0, run.output[-4000:]
    out = " ".join(run.output.split())
    assert f"ansible-playbook pid {killed_run} on {socket.gethostname()}" in out
    assert f"pid {killed_run} on {socket.gethostname()} is gone" in out
    assert "finishing the recovery of" in out and "left at stage stopped" in out
    assert "sim-node-1: recovered:" in out
    assert requests.get(one_node.url("sim-node-1") + "/health", timeout=30).status_code == 200
    entries = [e for e in ledger(one_node) if e["kind"] in ("recovery", "recovery_outcome")]
    assert [e["kind"] for e in entries] == ["recovery", "recovery_outcome"]
    assert entries[0]["verdict"] == "unhealthy", "the killed run's verdict, not 'crashed'"
    assert entries[1]["verdict"] == "ready"
    assert not lock.exists()
    print(f"recovered {took:.1f} s after the next run started")


def test_a_deploy_that_takes_over_a_killed_recovery_files_it_in_the_ledger(ready_node):
    """The next run after a killed recovery may be a deploy: it deploys the inventory's
    configuration, gates it, and records the interrupted recovery in the ledger."""
    one_node = ready_node
    assert one_node.deploy(extra=UNHEALTHY).rc != 0
    lock = lock_path(one_node)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock.write_text(json.dumps({
        "owner": "recovery of sim-node-1", "purpose": "recover", "since": time.time(),
        "run": lk.run_identity(os.getpid()) | {"pid": gone.pid},
        "recovery": {"stage": "stopped", "failed_config_hash": "0123456789ab",
                     "verdict": {"verdict": "unhealthy", "phase": "serving", "reason": "x"},
                     "evidence": "/evidence/sim-node-1/x", "stop": {"killed": [{"pid": 1}]}}}))
    run = one_node.deploy()
    assert run.rc == 0, run.output[-3000:]
    assert "it records an unfinished recovery (stage stopped)" in " ".join(run.output.split())
    (entry,) = [e for e in ledger(one_node) if e["kind"] == "recovery"]
    assert entry["interrupted"] is True and entry["finished_by"] == "deploy"
    assert entry["config_hash"] == "0123456789ab" and entry["verdict"] == "unhealthy"
    assert not lock.exists()


def test_a_recovery_never_stops_a_server_restarted_after_it_was_judged(ready_node, tmp_path):
    """Trial: a recovery killed the fresh server of a concurrent deploy, which then reported a
    false 'crashed'. The recovery judged the old server; a deploy restarted it before the
    recovery took the lock. Under the lock, the recovery compares the run it judged with the
    run the node records, and leaves the fresh server alone. (The interleaving is fixed here
    by handing the role a verdict on an earlier run.)"""
    one_node = ready_node
    before = one_node.main_pid("sim-node-1")
    playbook = tmp_path / "stale-verdict.yml"
    playbook.write_text(
        "- hosts: sglang_servers\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n"
        "        {name: sglang.fleet.sglang_server, tasks_from: spec.yml}\n"
        "    - ansible.builtin.set_fact:\n"
        "        sglang_server_verdict: {verdict: stalled, phase: capturing_cuda_graph,\n"
        "                                reason: judged before a deploy, run_id: 1.0,\n"
        "                                evidence: {}}\n"
        "    - ansible.builtin.include_role: {name: sglang.fleet.sglang_recover}\n")
    run = run_playbook(str(playbook), one_node.inventory, recover_settings(one_node))
    assert run.rc != 0
    out = " ".join(run.output.split())
    assert "not recovered: the server judged stalled was restarted by another run" in out
    assert one_node.main_pid("sim-node-1") == before
    assert requests.get(one_node.url("sim-node-1") + "/health", timeout=30).status_code == 200
    assert not lock_path(one_node).exists()


def test_two_concurrent_deploys_cannot_both_succeed(one_node):
    """Trial: two deploys of the same deployment at once both 'succeeded'. The second is
    refused with the first one's owner while the first is still gating its server."""
    slow = {**one_node.extra, "sglang_server_sim_time_factor": 0.05}
    cmd = [str(BIN / "ansible-playbook"), "-i", str(one_node.inventory), "deploy.yml",
           "-e", json.dumps(slow)]
    first = subprocess.Popen(cmd, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: lock_path(one_node).exists()
                 and json.loads(lock_path(one_node).read_text() or "{}").get("purpose")
                 == "deploy", timeout=300, interval=0.05)
        second = one_node.deploy()
        out_first, _ = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, out_first[-3000:]
    assert "sim-node-1: ready at" in out_first
    assert second.rc != 0
    out = " ".join(second.output.split())
    assert "is locked by deploy of sim-node-1:Kimi-K2.5-" in out
    assert f"(ansible-playbook pid {first.pid} on {socket.gethostname()}" in out
    assert "It is alive" in out


def test_a_failed_rank_takes_its_whole_multi_node_group_along(tmp_path):
    fleet = make_tp16_group(tmp_path)
    marker = {h: f"{h}:Kimi-K2.5-{fleet.port('sim-node-1')}" for h in fleet.hosts}
    try:
        assert fleet.deploy().rc == 0
        rank0_before = {p["pid"] for p in procs.deployment_processes(marker["sim-node-1"])}
        rank1_main = next(p for p in procs.deployment_processes(marker["sim-node-2"])
                          if "sglang_fleet.sim.launch_server" in p["cmdline"])
        os.kill(rank1_main["pid"], 9)  # rank 1 crashes; rank 0 alone looks fine
        run = run_playbook("playbooks/recover.yml", fleet.inventory, recover_settings(fleet))
        assert run.rc == 0, run.output[-4000:]
        assert "sim-node-1: recovered:" in run.output and "sim-node-2: recovered:" in run.output
        rank0_after = {p["pid"] for p in procs.deployment_processes(marker["sim-node-1"])}
        assert rank0_after and not rank0_before & rank0_after, "rank 0 was restarted too"
        assert requests.get(fleet.url("sim-node-1") + "/health", timeout=30).status_code == 200
    finally:
        fleet.kill_leftovers()


# ---- faults of a running server keep its configuration; what ran is what is judged --------

def words(text: str) -> str:
    return " ".join(text.split())  # Ansible's YAML output folds long messages


def test_a_frozen_server_is_restarted_on_the_same_configuration(ready_node):
    """Issue 13's trial: SIGSTOP a ready server's processes. It was ready on its
    configuration and failed later: restarted on the same one, not `cuda_graph=false`."""
    one_node = ready_node
    settings = recover_settings(one_node, sglang_server_health_timeout=21,
                                sglang_recover_term_timeout=5)
    good = [e for e in ledger(one_node) if e["kind"] == "ready"][-1]
    frozen = [p["pid"] for p in one_node.server_processes("sim-node-1")]
    procs.signal_pids(frozen, signal.SIGSTOP)
    try:
        run = run_playbook("playbooks/recover.yml", one_node.inventory, settings)
    finally:
        procs.signal_pids(frozen, signal.SIGCONT)
    assert run.rc == 0, run.output[-4000:]
    out = words(run.output)
    # The probe either timed out within the observation or was still unanswered when the
    # stacks ended the wait: the same finding, said by how long it waited.
    assert re.search(rf"sim-node-1: recovered: configuration {good['config_hash']} failed "
                     rf"\(unhealthy while serving: serving, but /health (timed out|has not "
                     rf"answered in \d+ s); ", out), out[-3000:]
    assert "processes are stopped (state T: SIGSTOP or a debugger)" in out
    assert ("Path: restart, because it came from outside SGLang (a signal, a stopped "
            "process), not from the configuration (unhealthy in serving: ") in out
    assert (f"restart on the same configuration {good['config_hash']}. Now "
            f"{good['config_hash']} is ready and answered its soak of {SOAK_REQUESTS} generation "
            f"requests.") in out
    assert "The inventory already describes it." in out
    assert "processes stopped" in out and "was 1" not in out
    rec = [e for e in ledger(one_node) if e["kind"] == "recovery"][-1]
    assert rec["config_hash"] == good["config_hash"] and rec["verdict"] == "unhealthy"
    assert rec["next"]["source"] == "restart" and rec["next"]["overrides"] == {}
    again = [e for e in ledger(one_node) if e["kind"] == "ready"][-1]
    assert again["config_hash"] == good["config_hash"], "same configuration, restarted"
    assert again["settings"]["sglang_server_cuda_graph"] is True
    assert all(procs.process_info(pid) is None for pid in frozen), "the frozen run is gone"
    assert requests.get(one_node.url("sim-node-1") + "/health", timeout=30).status_code == 200
    # The evidence's LaunchSpec is the one the node recorded when it started the server.
    (bundle,) = evidence_bundles(one_node)
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["running_config_hash"] == good["config_hash"]
    assert summary["running_config_source"] == "running_spec" and summary["note"] == ""
    assert json.loads((bundle / "launch_spec.json").read_text())["config_hash"] == \
        good["config_hash"]


def soak_requests_answered(log: Path, since: int) -> int:
    """/generate requests the server started after `since` (the log's size when it was
    relaunched) has answered since it was fired up (uvicorn logs each as its answer starts)."""
    raw = log.read_bytes()
    text = (raw[since:] if len(raw) >= since else raw).decode(errors="replace")
    if "The server is fired up and ready to roll!" not in text:
        return 0
    after = text[text.index("The server is fired up and ready to roll!"):]
    return after.count('"POST /generate HTTP/1.1" 200')


def quiet_partway(node, host, old_pids, after, stop, since):
    """Once the server relaunched in place of `old_pids` has answered `after` soak requests
    (counted in its log past `since` bytes, its size before the recovery), its batches hang
    (SIGUSR1 to its main process, found by the deployment's membership): a server that goes
    quiet partway through its soak. Returns the hung main pid (or None)."""
    main = wait_for(lambda: stop.is_set() or next(
        (p["pid"] for p in node.server_processes(host)
         if "sglang_fleet.sim.launch_server" in p["cmdline"] and p["pid"] not in old_pids),
        None), timeout=300, interval=0.05)
    if main is True:
        return None
    wait_for(lambda: stop.is_set() or soak_requests_answered(node.log_file(host), since)
             >= after, timeout=300, interval=0.02)
    if stop.is_set():
        return None
    os.kill(main, signal.SIGUSR1)
    return main


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    return router_venv(tmp_path_factory.getbasetemp().parent)


def test_a_server_that_goes_quiet_partway_through_its_soak_fails_and_stays_out(tmp_path,
                                                                              router):
    """The reported SGLang failure: relaunched on the same port, a server answered some
    requests, then went quiet. Its soak fails naming how many requests it answered; it does
    not rejoin its router, is not recorded as a last known good, and the evidence is kept."""
    fleet, soak, after = make_fleet(tmp_path, hosts=1, router=router), 400, 20
    try:
        assert run_playbook("deploy.yml", fleet.inventory, fleet.extra).rc == 0
        url = fleet.url("sim-node-1")
        assert registered(fleet.router_url).get(url), "in its router before the failure"
        good = [e for e in ledger(fleet) if e["kind"] == "ready"][-1]
        settings = recover_settings(fleet, sglang_server_health_timeout=21,
                                    sglang_recover_term_timeout=5,
                                    sglang_recover_soak_requests=soak,
                                    sglang_recover_soak_timeout=5)
        frozen = [p["pid"] for p in fleet.server_processes("sim-node-1")]
        procs.signal_pids(frozen, signal.SIGSTOP)
        stop, hung = threading.Event(), []
        # Counted from here: the relaunched server may be ready before its pid is found.
        since = fleet.log_file("sim-node-1").stat().st_size
        watcher = threading.Thread(target=lambda: hung.append(
            quiet_partway(fleet, "sim-node-1", set(frozen), after, stop, since)), daemon=True)
        watcher.start()
        try:
            run = run_playbook("playbooks/recover.yml", fleet.inventory, settings)
        finally:
            stop.set()
            watcher.join(timeout=30)
            procs.signal_pids(frozen, signal.SIGCONT)
        out = words(run.output)
        assert hung and hung[0], "the relaunched server was never made to go quiet"
        assert run.rc != 0 and "sim-node-1" in run.failed_hosts(), out[-3000:]
        m = re.search(rf"recovered to ready, then failed its soak of {soak} generation "
                      rf"requests: benchmark of 127\.0\.0\.1:\d+ failed: request (\d+) of "
                      rf"{soak} got no answer within 5 s \((\d+) answered\)", out)
        assert m, out[-4000:]
        answered = int(m.group(2))
        assert int(m.group(1)) == answered + 1 and after - 1 <= answered < soak, m.group(0)
        assert f"sim-node-1: configuration {good['config_hash']} failed (" in out
        assert re.search(r"\(unhealthy in serving: serving, but /health (timed out|has not "
                         r"answered in \d+ s); ", out), out[-3000:]
        assert "recovery redeployed (path restart: " in out and "and it failed again: " in out
        # Out of its router, not reported ready, nor recorded as a last known good: the soak
        # comes first.
        assert url not in registered(fleet.router_url), "a server that failed its soak rejoined"
        assert "sim-node-1: ready at" not in out
        assert re.search(r"soak: error: 'benchmark of [^']* \(\d+ answered\)' log_file: "
                         rf"\S+\.log requests: {soak} timeout_s: 5\.0", out), out[-3000:]
        entries = ledger(fleet)
        assert [e for e in entries if e["kind"] == "recovery_outcome"][-1]["verdict"] == \
            "unhealthy"
        assert [e for e in entries if e["kind"] == "ready"][-1] == good
        # Evidence kept: the first failure's bundle, and the quiet server itself with its log.
        (bundle,) = evidence_bundles(fleet)
        assert f"Evidence of the first failure: {bundle}" in out
        assert (bundle / "summary.json").is_file()
        assert procs.process_info(hung[0]) is not None, "the quiet server is left for a look"
        assert soak_requests_answered(fleet.log_file("sim-node-1"), 0) >= answered
    finally:
        fleet.kill_leftovers()


def one_off_spec(run_dir) -> dict:
    """The LaunchSpec a CLI deploy published, from its runner events."""
    for path in sorted(run_dir.glob("runner/artifacts/*/job_events/*.json")):
        facts = ((json.loads(path.read_text()).get("event_data") or {}).get("res") or {}).get(
            "ansible_facts") or {}
        if "sglang_server_launch_spec" in facts:
            return facts["sglang_server_launch_spec"]
    raise AssertionError(f"no LaunchSpec in {run_dir}'s events")


def record_running_spec(fleet, host, spec) -> None:
    """What the node records at each start (the safety branch's node side, written here as a
    fixture): the started LaunchSpec beside the state file, and its hash in the state file."""
    run = fleet.host_root(host) / "run"
    path = run / f"{spec['deployment']}.running-spec.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o600)
    state_file = run / f"{spec['deployment']}.pid"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps(dict(state, config_hash=spec["config_hash"])))


def test_a_one_off_change_that_hangs_is_named_and_reverted_to_the_last_known_good(ready_node,
                                                                                  tmp_path):
    """Issue 12's scenario: deploy a known good configuration, deploy a one-off change with
    -e that hangs, then `sglang-fleet recover --limit HOST` without the -e."""
    from sglang_fleet.testfleet.local import sglang_fleet
    fleet = ready_node
    stores = json.dumps(fleet.with_stores(**FAST_GATE))
    common = ("-i", str(fleet.inventory), "-e", stores)
    first = sglang_fleet("deploy", *common, "--run-dir", str(tmp_path / "good"))
    assert first.returncode == 0, first.stdout[-3000:]
    good = [e for e in ledger(fleet) if e["kind"] == "ready"][-1]["config_hash"]
    one_off = sglang_fleet("deploy", *common, "-e", json.dumps(INCIDENT),
                           "--run-dir", str(tmp_path / "one-off"))
    assert one_off.returncode == 1, one_off.stdout[-3000:]
    assert "stalled" in one_off.stdout
    spec = one_off_spec(tmp_path / "one-off")
    assert spec["config_hash"] != good
    record_running_spec(fleet, "sim-node-1", spec)

    rec_run = sglang_fleet("recover", "--limit", "sim-node-1", *common,
                           "--run-dir", str(tmp_path / "recover"))
    assert rec_run.returncode == 0, rec_run.stdout[-4000:]
    out = words(rec_run.stdout)
    assert f"recovered: configuration {spec['config_hash']} failed (stalled in " \
           f"capturing_cuda_graph: no progress for " in out
    assert (f"Path: last_known_good, because it failed while starting (stalled in "
            f"capturing_cuda_graph), so the configuration is suspect: revert to the last "
            f"known good {good}: the configuration that failed, {spec['config_hash']}, "
            f"differs from it") in out
    assert (f"Now {good} is ready and answered its soak of {SOAK_REQUESTS} generation "
            "requests. The "
            "inventory already describes it.") in out
    rec = [e for e in ledger(fleet) if e["kind"] == "recovery"][-1]
    assert rec["config_hash"] == spec["config_hash"], "the one-off is the one that failed"
    assert rec["config_hash_inventory"] == good and rec["running_source"] == "running_spec"
    assert rec["facts"]["attention_backend"] == "flashinfer"
    assert rec["next"]["source"] == "last_known_good" and rec["next"]["config_hash"] == good
    assert rec["next"]["overrides"] == {}, "not cuda_graph=false, nor any other change"
    assert [e for e in ledger(fleet) if e["kind"] == "ready"][-1]["config_hash"] == good
    # The evidence describes what ran: the one-off, not the inventory.
    evidence = json.loads((tmp_path / "recover" / "summary.json").read_text())
    host = evidence["hosts"]["sim-node-1"]
    assert host["recovery"]["config_hash"] == spec["config_hash"]
    bundle = tmp_path / "evidence" / "sim-node-1" / host["evidence"].rsplit("/", 1)[-1]
    ran = json.loads((bundle / "launch_spec.json").read_text())
    assert ran["config_hash"] == spec["config_hash"]
    assert ran["facts"]["attention_backend"] == "flashinfer"
    assert (bundle / "launch_spec.json").stat().st_mode & 0o777 == 0o600
    info = requests.get(fleet.url("sim-node-1") + "/server_info", timeout=5).json()
    assert info["attention_backend"] == "triton"

CGROUP_ROOT = Path("/sys/fs/cgroup/systemd")


class OtherDeployments:
    """Three other SGLang deployments on the node, sharing its simulated GPUs (two servers of
    a few GPUs each is the common layout), each tied to its deployment by one signal only:
    its marker, its supervisor session, or its systemd unit's cgroup; plus decoys."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs, self.logs, self.decoys = tmp, [], [], []
        slice_dir = CGROUP_ROOT / "system.slice"
        self.made_slice = not slice_dir.exists()
        self.cgroup = slice_dir / f"sglang-other-{os.getpid()}-{int(time.time())}.service"
        self.cgroup.mkdir(parents=True)
        self.sessions = {}

    def start(self, node_gpus: Path, model: Path):
        tmp = self.tmp
        base = {"PATH": os.environ["PATH"], "SGLANG_SIM_GPU_DIR": str(node_gpus),
                "SGLANG_SIM_SHM_DIR": str(tmp), "SGLANG_SIM_TIME_FACTOR": "0.005",
                "HOME": os.environ.get("HOME", "/root")}
        for i, how in enumerate(("marker", "session", "unit")):
            port = free_port_block(1)
            sim = [sys.executable, "-m", "sglang_fleet.sim.launch_server", "--model-path",
                   str(model), "--served-model-name", f"other-{how}", "--port", str(port),
                   "--tp-size", "2", "--base-gpu-id", str(2 * i), "--attention-backend",
                   "triton", "--disable-custom-all-reduce"]
            env = dict(base)
            if how == "marker":
                env.update({procs.MARKER_VAR: f"sim-node-1:other-{how}", "SPT_NOENV": "1"})
                argv = sim
            elif how == "session":
                # The leader shell keeps its marker; the server and its renamed workers do not.
                env[procs.MARKER_VAR] = f"sim-node-1:other-{how}"
                argv = ["/bin/sh", "-c", 'env -u SGLANG_FLEET_DEPLOYMENT "$@"; exit $?', "sh",
                        *sim]
            else:
                argv = ["/bin/sh", "-c", 'echo $$ > "$0"; exec "$@"',
                        str(self.cgroup / "cgroup.procs"), *sim]
            log = tmp / f"other-{how}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            self.procs.append(proc)
            self.logs.append(log)
            self.sessions[how] = proc.pid
        for log in self.logs:
            wait_for(lambda log=log: "fired up" in log.read_text(), timeout=120)
        env = {"PATH": os.environ["PATH"]}
        hold = ("import sys, time\nfds = [open(p, 'rb') for p in sys.argv[1:]]\n"
                "print('holding', flush=True)\ntime.sleep(600)\n")
        daemon = tmp / "nvidia-persistenced"
        daemon.symlink_to(sys.executable)
        self.daemon = subprocess.Popen([str(daemon), "-c", hold, *map(str, sorted(
            node_gpus.glob("nvidia*")))], stdout=subprocess.PIPE, text=True, env=env)
        self.holder = subprocess.Popen([sys.executable, "-c", hold, str(node_gpus / "nvidia7")],
                                       stdout=subprocess.PIPE, text=True, env=env)
        self.decoys += [self.daemon, self.holder]
        for p in (self.daemon, self.holder):
            assert p.stdout.readline().strip() == "holding"
        self.lookalike = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                           "-m", "sglang.launch_server", "--port", "1"], env=env)
        self.plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                      env=env)
        # Its own session: the shell's `sleep` child goes with it in stop().
        self.other_user = subprocess.Popen(["/bin/sh", "-c", "sleep 600", "sglang::scheduler_TP0"],
                                           env=env, user=65534, group=65534,
                                           start_new_session=True)
        self.decoys += [self.lookalike, self.plain, self.other_user]
        wait_for(lambda: "sglang" in procs.process_info(self.lookalike.pid)["cmdline"]
                 and "sglang" in procs.process_info(self.other_user.pid)["cmdline"])
        self.servers = self.server_pids()
        assert sum(len(p) for p in self.servers.values()) >= 12

    def server_pids(self):
        out = {}
        for how, sid in self.sessions.items():
            out[how] = {p for p in procs.all_pids()
                        if (procs.process_info(p) or {}).get("sid") == sid}
        return out

    def stop(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.other_user.pid, signal.SIGKILL)
        for p in self.decoys:
            p.kill()
            p.wait()
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        wait_for(lambda: not (self.cgroup / "cgroup.procs").read_text().strip(), timeout=15)
        self.cgroup.rmdir()
        if self.made_slice:
            self.cgroup.parent.rmdir()


def test_aggressive_mode_never_crosses_into_another_deployment(ready_node, tmp_path):
    """Trial: sglang_recover_aggressive: true killed 3 other servers (33 processes, each
    carrying its own marker) and the decoys, reported '87 processes stopped', no warning.
    Now every process of another deployment (marker, session or unit) and of another user is
    spared; each unmarked process it stops is listed with its command line, in the output
    and in the evidence."""
    if os.geteuid() != 0 or not (CGROUP_ROOT / "cgroup.procs").exists():
        pytest.skip("needs root and the name=systemd cgroup hierarchy for a unit's cgroup")
    one_node = ready_node
    node = one_node.host_root("sim-node-1")
    (tmp_path / "others").mkdir()
    others = OtherDeployments(tmp_path / "others")
    try:
        others.start(node / "sim" / "gpus", node / "models" / "Kimi-K2.5")
        main = next(p for p in one_node.processes("sim-node-1")
                    if "sglang_fleet.sim.launch_server" in p["cmdline"])
        os.kill(main["pid"], 9)  # our server crashes
        run = run_playbook("playbooks/recover.yml", one_node.inventory, recover_settings(
            one_node, sglang_recover_aggressive=True))
        assert run.rc == 0, run.output[-4000:]
        out = " ".join(run.output.split())
        assert "sim-node-1: recovered:" in out
        assert others.server_pids() == others.servers, "another deployment was touched"
        for p in (others.daemon, others.plain, others.other_user):
            assert p.poll() is None
        for p in (others.lookalike, others.holder):
            assert p.wait(10) == -signal.SIGTERM
        assert "aggressive mode stopped 2 process(es) without this deployment's marker:" in out
        assert f"{others.lookalike.pid} {sys.executable} -c import time" in out
        (bundle,) = evidence_bundles(one_node)
        stop = json.loads((bundle / "stop.json").read_text())
        unmarked = {u["pid"]: u for u in stop["unmarked_stopped"]}
        assert set(unmarked) == {others.lookalike.pid, others.holder.pid}
        assert "sglang.launch_server" in unmarked[others.lookalike.pid]["cmdline"]
        assert unmarked[others.holder.pid]["why"] == "holds a GPU device"
        spared = {s["pid"]: s["why"] for s in stop["spared_other_deployments"]}
        every_other = set().union(*others.servers.values())
        assert {p for p in spared if p in every_other}, spared
        assert spared[others.other_user.pid] == "runs as uid 65534, not the service user"
    finally:
        others.stop()


def test_a_live_owners_lock_refuses_and_a_gone_owners_lock_is_taken_over(ready_node):
    """Issue 13.4: the lock names its owner's run (host, PID, start time); a second run is
    refused while that run lives, and takes the lock over with a line saying so once it is
    gone: no fixed expiry. (The last test on the shared node: it leaves it on another
    configuration.)"""
    one_node = ready_node
    fast_health = {"sglang_server_extra_env": {"SGLANG_HEALTH_CHECK_TIMEOUT": 1}}
    assert one_node.deploy(extra=fast_health).rc == 0
    # Generation hangs from now on (the simulator's switch): unhealthy, not by configuration,
    # so the recovery's restart on the same configuration brings it back.
    main = next(p["pid"] for p in one_node.server_processes("sim-node-1")
                if "sglang_fleet.sim.launch_server" in p["cmdline"])
    os.kill(main, signal.SIGUSR1)
    # Stands for another operator's ansible-playbook run on this controller.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        lock_path(one_node).write_text(json.dumps({
            "owner": "another operator's recovery", "purpose": "recover",
            "since": time.time(), "run": lk.run_identity(other.pid)}))
        run = run_playbook("playbooks/recover.yml", one_node.inventory, recover_settings(
            one_node, **fast_health))
        assert run.rc != 0
        out = " ".join(run.output.split())
        assert (f"is locked by another operator's recovery (ansible-playbook pid {other.pid} "
                f"on {socket.gethostname()}, since") in out
        assert f"It is alive (pid {other.pid} on this controller)" in out
        assert len(one_node.server_processes("sim-node-1")) == 11, "nothing was stopped"
    finally:
        other.kill()
        other.wait()
    run = run_playbook("playbooks/recover.yml", one_node.inventory,
                       recover_settings(one_node, **fast_health))
    assert run.rc == 0, run.output[-4000:]
    out = " ".join(run.output.split())
    assert f"took over the lock of another operator's recovery (ansible-playbook pid {other.pid}" \
        in out and f"pid {other.pid} on {socket.gethostname()} is gone" in out
    assert "sim-node-1: recovered:" in out
    assert not lock_path(one_node).exists(), "released at the end"
