"""Recovery through real ansible-playbook runs: the incident end to end, bystanders that must
survive, orphans, memory that never comes back, the crash-loop guard, concurrent recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from sglang_fleet.testfleet.local import (
    FAST_GATE,
    make_tp16_group,
    run_playbook,
    start_sim,
    wait_for,
)
from sglang_fleet_node import sglang_fleet_procs as procs
from sglang_fleet_node.sglang_fleet_gpu import gpu_snapshot

pytestmark = pytest.mark.integration

INCIDENT = {"sglang_server_attention_backend": "flashinfer",
            "sglang_server_allow_rules": ["flashinfer-mla-sm120-graph-capture-hang"]}


def recover_settings(fleet, **more):
    return {**fleet.extra, **FAST_GATE, "sglang_recover_on_failure": True,
            "sglang_fleet_ledger": str(fleet.root.parent / "ledger.jsonl"),
            "sglang_fleet_evidence_dir": str(fleet.root.parent / "evidence"), **more}


def ledger(fleet):
    path = fleet.root.parent / "ledger.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


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

    def alive(self):
        return (self.plain.poll() is None and self.daemon.poll() is None
                and self.other.proc.poll() is None
                and len(procs.deployment_processes(self.other.marker)) == 3)

    def stop(self):
        for p in (self.plain, self.daemon):
            p.kill()
            p.wait()
        self.other.stop()



def test_incident_replayed_end_to_end_with_bystanders_spared(one_node, tmp_path):
    # A ready deploy first: it provisions the node's simulated GPUs that the stand-in
    # persistence daemon holds, and gives the test's ledger a last known good.
    assert one_node.deploy(extra=recover_settings(one_node)).rc == 0
    by = Bystanders(tmp_path, one_node.host_root("sim-node-1") / "sim" / "gpus")
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
        (bundle,) = (tmp_path / "evidence" / "sim-node-1").iterdir()
        verdict = json.loads((bundle / "verdict.json").read_text())
        assert verdict["verdict"] == "stalled" and verdict["phase"] == "capturing_cuda_graph"
        assert "busy_wait" in verdict["evidence"]
        assert "Capture target decode CUDA graph begin" in (bundle / "log_tail.txt").read_text()
        assert "capturing_cuda_graph" in (bundle / "phase_timeline.txt").read_text()
        table = (bundle / "processes.txt").read_text()
        assert "sglang::scheduler_TP0" in table and "sglang::detokenizer" in table
        dumps = list(bundle.glob("py-spy-*.txt"))
        assert len(dumps) >= 10 and any("hang" in d.read_text() for d in dumps)
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
        # Logs of the failed run are still on the one_node.
        log = one_node.log_file("sim-node-1").read_text()
        assert "Capture target decode CUDA graph begin" in log
        assert log.count("===== sglang-fleet: start") == 3
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


def test_a_second_concurrent_recovery_is_refused(one_node):
    assert one_node.deploy(extra={"sglang_server_sim_fault": "hang_generation",
                              "sglang_server_extra_env": {"SGLANG_HEALTH_CHECK_TIMEOUT": 1}}
                       ).rc != 0
    run_dir = one_node.host_root("sim-node-1") / "run"
    lock = run_dir / f"Kimi-K2.5-{one_node.port('sim-node-1')}.recover.lock"
    lock.write_text(json.dumps({"owner": "another operator's recovery", "at": time.time()}))
    run = run_playbook("playbooks/recover.yml", one_node.inventory, recover_settings(
        one_node, sglang_server_sim_fault="hang_generation"))
    assert run.rc != 0
    assert "another recovery of this deployment is running: another operator's recovery" in \
        run.output
    assert len(one_node.server_processes("sim-node-1")) == 10, "nothing was stopped"


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
        run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)


# ---- faults of a running server keep its configuration; what ran is what is judged --------

def words(text: str) -> str:
    return " ".join(text.split())  # Ansible's YAML output folds long messages


def test_a_frozen_server_is_restarted_on_the_same_configuration(one_node):
    """Issue 13's trial: SIGSTOP a ready server's processes. It was ready on its
    configuration and failed later: restarted on the same one, not `cuda_graph=false`."""
    settings = recover_settings(one_node, sglang_server_health_timeout=21,
                                sglang_recover_term_timeout=5)
    assert one_node.deploy(extra=settings).rc == 0
    good = [e for e in ledger(one_node) if e["kind"] == "ready"][-1]
    frozen = [p["pid"] for p in one_node.server_processes("sim-node-1")]
    procs.signal_pids(frozen, signal.SIGSTOP)
    try:
        run = run_playbook("playbooks/recover.yml", one_node.inventory, settings)
    finally:
        procs.signal_pids(frozen, signal.SIGCONT)
    assert run.rc == 0, run.output[-4000:]
    out = words(run.output)
    assert (f"sim-node-1: recovered: configuration {good['config_hash']} failed (unhealthy in "
            f"serving)") in out
    assert (f"Path: restart, because it was ready on {good['config_hash']} and failed later "
            f"(unhealthy while serving), its first failure: restart on the same configuration "
            f"{good['config_hash']}. Now {good['config_hash']} is ready.") in out
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
    # Without a record of the running spec on the node, the evidence says what it holds.
    (bundle,) = (one_node.root.parent / "evidence" / "sim-node-1").iterdir()
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["running_config_hash"] == good["config_hash"]
    assert "launch_spec.json is the controller's" in summary["note"]


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


def test_a_one_off_change_that_hangs_is_named_and_reverted_to_the_last_known_good(tmp_path):
    """Issue 12's scenario: deploy a known good configuration, deploy a one-off change with
    -e that hangs, then `sglang-fleet recover --limit HOST` without the -e."""
    from sglang_fleet.testfleet.local import make_fleet, sglang_fleet
    fleet = make_fleet(tmp_path, hosts=1)
    stores = json.dumps(fleet.with_stores(**FAST_GATE))
    common = ("-i", str(fleet.inventory), "-e", stores)
    try:
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
               f"capturing_cuda_graph)" in out
        assert (f"Path: last_known_good, because it failed while starting (stalled in "
                f"capturing_cuda_graph), so the configuration is suspect: revert to the last "
                f"known good {good}: the configuration that failed, {spec['config_hash']}, "
                f"differs from it") in out
        assert f"Now {good} is ready. The inventory already describes it." in out
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
    finally:
        fleet.stop()
        fleet.kill_leftovers()
