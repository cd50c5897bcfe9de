"""The health gate through real ansible-playbook runs: one host per failure mode.

Each fleet gives every host a different fault (host_vars), so one deploy exercises several
verdicts in parallel, as they would appear on a real fleet.
"""

from __future__ import annotations

import re

import pytest

from sglang_fleet.testfleet.local import make_fleet, run_playbook

pytestmark = pytest.mark.integration

WINDOWS = {"launching": 20, "loading_weights": 3, "allocating_kv_cache": 3,
           "capturing_cuda_graph": 3, "starting_http": 5, "warming_up": 5}


def verdict_line(output: str, host: str) -> str:
    m = re.search(rf"{host}: (\w+) (?:in|while) (\w+): ([^\n]*)", output)
    assert m, f"no verdict for {host} in:\n{output[-3000:]}"
    return m.group(0)


@pytest.fixture(scope="module")
def failing_fleet(tmp_path_factory):
    fleet = make_fleet(tmp_path_factory.mktemp("gate-a"))
    fleet.set_host_vars("sim-node-1", {  # the incident
        "sglang_server_attention_backend": "flashinfer",
        "sglang_server_allow_rules": ["flashinfer-mla-sm120-graph-capture-hang"]})
    fleet.set_host_vars("sim-node-2", {"sglang_server_sim_fault": "hang:loading_weights"})
    fleet.set_host_vars("sim-node-3", {"sglang_server_sim_fault": "crash:launching"})
    fleet.set_host_vars("sim-node-4", {"sglang_server_sim_fault": "oom:allocating_kv_cache"})
    # Observed every second: these tests read the progress lines of each poll.
    fleet.run = fleet.deploy(extra={"sglang_server_gate_stall_windows": WINDOWS,
                                    "sglang_server_gate_poll_interval": 1})
    yield fleet
    fleet.kill_leftovers()


def test_every_host_fails_with_its_own_verdict(failing_fleet):
    run = failing_fleet.run
    assert run.rc != 0
    assert run.failed_hosts() == set(failing_fleet.hosts)


def test_incident_hang_in_graph_capture_is_stalled_with_busy_wait(failing_fleet):
    out = failing_fleet.run.output
    assert verdict_line(out, "sim-node-1").startswith(
        "sim-node-1: stalled in capturing_cuda_graph: no progress")
    block = out[out.index("sim-node-1: stalled in capturing_cuda_graph"):][:3000]
    assert "busy_wait: alive and spinning" in block
    assert "Capture target decode CUDA graph begin" in block
    # 8 schedulers, the detokenizer, the main process and its resource tracker
    assert len(failing_fleet.server_processes("sim-node-1")) == 11, "left alive for recovery"


def test_hang_in_weight_loading_is_stalled_in_that_phase(failing_fleet):
    line = verdict_line(failing_fleet.run.output, "sim-node-2")
    assert line.startswith("sim-node-2: stalled in loading_weights: no progress")
    assert "GATE [sim-node-2]: progressing: loading_weights 32/64 shards, last progress" in \
        failing_fleet.run.output
    # One failure block, said once: the verdict, its cause, what the phase waits on and the
    # next step, and the fix; never again as `as above` or a second fatal line.
    out = failing_fleet.run.output
    assert re.search(r"fatal: \[sim-node-2\]: FAILED! =>\n"
                     r"    sim-node-2: stalled in loading_weights: no progress for \d+ s "
                     r"\(window 3 s\)\n"
                     r"    Cause: (configuration|environment|external|hardware) \([^\n]+\)\n"
                     r"    Next: loading_weights waits on reading the checkpoint from disk or "
                     r"the network; see where each rank is: py-spy dump --pid \d+[^\n]*\n"
                     r"    Fix: recover it \(sglang-fleet recover --limit sim-node-2, or "
                     r"ansible-playbook playbooks/recover.yml --limit sim-node-2\)\n", out), \
        out[out.index("fatal: [sim-node-2]"):][:2000]
    assert out.count("fatal: [sim-node-2]") == 1
    assert out.count("sim-node-2: stalled in loading_weights") == 1
    assert "as above" not in out


def test_crash_at_start_reports_exit_status_and_error_lines(failing_fleet):
    out = failing_fleet.run.output
    # As SGLang 0.5.23 does, the main process kills itself (SIGKILL: 128 + 9) once a child
    # reports its failure.
    # The cause first, once, with the ranks that printed it and its log line.
    line = verdict_line(out, "sim-node-3")
    assert re.match(r"sim-node-3: crashed in launching: TP[\d,-]+: RuntimeError: simulated "
                    r"crash \(SGLANG_SIM_FAULT\) \(log line \d+\); the server exited \(status "
                    r"137, SIGKILL\)$", line), line
    block = out[out.index("sim-node-3: crashed"):][:3000]
    assert "Scheduler hit an exception" in block
    # The block: verdict, cause, fix, each once, right under the fatal line.
    assert re.search(r"fatal: \[sim-node-3\]: FAILED! =>\n    sim-node-3: crashed in launching: "
                     r"[^\n]+\n    Cause: (configuration|environment|external|hardware) "
                     r"\([^\n]+\)\n    Fix: recover it \(sglang-fleet recover --limit "
                     r"sim-node-3, or ansible-playbook playbooks/recover.yml --limit "
                     r"sim-node-3\)\n", out), block
    assert out.count("fatal: [sim-node-3]") == 1 and out.count("sim-node-3: crashed in") == 1


def test_cuda_oom_at_kv_allocation_is_a_crash_with_the_oom_line(failing_fleet):
    out = failing_fleet.run.output
    assert verdict_line(out, "sim-node-4").startswith(
        "sim-node-4: crashed in allocating_kv_cache")
    block = out[out.index("sim-node-4: crashed"):][:3000]
    assert "torch.OutOfMemoryError: CUDA out of memory" in block


@pytest.fixture(scope="module")
def mixed_fleet(tmp_path_factory):
    fleet = make_fleet(tmp_path_factory.mktemp("gate-b"), hosts=3)
    fleet.set_host_vars("sim-node-1", {
        "sglang_server_sim_fault": "hang_generation",
        "sglang_server_extra_env": {"SGLANG_HEALTH_CHECK_TIMEOUT": 2}})
    fleet.set_host_vars("sim-node-2", {"sglang_server_sim_fault": "xid:capturing_cuda_graph"})
    # A slow load: 412 s x 0.05 = 21 s of weight loading, ten times its 2 s window.
    fleet.set_host_vars("sim-node-3", {"sglang_server_sim_time_factor": 0.05})
    fleet.run = fleet.deploy(extra={"sglang_server_gate_stall_windows":
                                    dict(WINDOWS, loading_weights=2),
                                    "sglang_server_gate_poll_interval": 1})
    yield fleet
    fleet.kill_leftovers()


def test_generation_hanging_after_ready_is_unhealthy(mixed_fleet):
    line = verdict_line(mixed_fleet.run.output, "sim-node-1")
    assert line.startswith("sim-node-1: unhealthy while serving: serving, but /health answered "
                           "503")
    block = mixed_fleet.run.output[mixed_fleet.run.output.index(line):][:8000]
    # 0.5.23's /ready answers 503 once a health check failed: the server knows it is unwell.
    assert "health: 503" in block and "ready_endpoint: 503" in block


def test_xid_in_the_kernel_log_is_a_gpu_fault_with_nvidias_action(mixed_fleet):
    out = mixed_fleet.run.output
    line = verdict_line(out, "sim-node-2")
    assert line.startswith("sim-node-2: gpu_fault in capturing_cuda_graph: Xid 79")
    assert "reboot or power-cycle the node" in line
    assert "NVRM: Xid (PCI:0000:01:00): 79" in out


def test_slow_but_steady_load_is_never_called_stalled(mixed_fleet):
    out = mixed_fleet.run.output
    assert "sim-node-3: ready at" in out
    assert "sim-node-3: stalled" not in out
    polls = re.findall(r"GATE \[sim-node-3\]: progressing: loading_weights (\d+)/64", out)
    assert len(set(polls)) >= 5, "observed all through the load"
    assert [int(x) for x in polls] == sorted(int(x) for x in polls)


def test_health_playbook_prints_one_line_per_host(mixed_fleet):
    """One line per ready host; one block per host whose server is not ready: its verdict,
    cause, next step and fix."""
    run = run_playbook("playbooks/health.yml", mixed_fleet.inventory, mixed_fleet.extra)
    assert run.rc == 2, run.output[-3000:]
    assert run.failed_hosts() == {"sim-node-1", "sim-node-2"}
    task = run.output[:run.output.index("PLAY RECAP")]
    assert re.search(r"^fatal: \[sim-node-1\]: FAILED! =>\n    sim-node-1: unhealthy while "
                     r"serving: serving, but /health answered 503\n    Next: py-spy dump the "
                     r"scheduler processes.*\n    Fix: recover it \(sglang-fleet recover "
                     r"--limit sim-node-1, ", task, re.M), task
    assert re.search(r"^fatal: \[sim-node-2\]: FAILED! =>\n    sim-node-2: gpu_fault in "
                     r"capturing_cuda_graph: Xid 79 .*\n    Cause: hardware .*\n    Next: "
                     r"NVIDIA's action for Xid 79: reboot or power-cycle the node\n    Fix: "
                     r"recover it .*; if the GPU stays faulty, drain the node$", task, re.M), task
    assert "ok: [sim-node-3] => sim-node-3: ready: /health answered 200" in task


def test_a_rerun_with_nothing_to_change_is_judged_by_the_node_check(mixed_fleet):
    """Nothing to change: the node check's one module run asks each server, and a server that
    went unwell is failed with the same verdict the gate gives; no gate poll runs."""
    # -v: the tasks that ran are named (and the node check's ready GATE line shown).
    run = mixed_fleet.deploy("-v", extra={"sglang_server_gate_stall_windows":
                                          dict(WINDOWS, loading_weights=2)})
    out = run.output
    assert run.rc == 2, out[-3000:]
    assert run.changed_hosts() == set()
    assert run.failed_hosts() == {"sim-node-1", "sim-node-2"}
    assert all(f"NODE [{host}]: unchanged:" in out for host in mixed_fleet.hosts)
    assert "TASK [sglang.fleet.sglang_server : Observe the server" not in out
    assert "GATE [sim-node-3]: ready: /health answered 200" in out
    assert "sim-node-3: ready at" in out and "already running unchanged" in out
    assert verdict_line(out, "sim-node-1").startswith(
        "sim-node-1: unhealthy while serving: serving, but /health answered 503")
    assert verdict_line(out, "sim-node-2").startswith(
        "sim-node-2: gpu_fault in capturing_cuda_graph: Xid 79")
