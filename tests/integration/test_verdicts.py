"""What the toolkit says of a server, through real playbook runs on the simulated fleet: a stop
is a stop, client text in SGLang's request log forges no crash, a line of text alone never gets
a server that generates killed, and a fault of the node restarts the same configuration."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests

from sglang_fleet.testfleet.local import FAST_GATE, run_playbook

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def words(text: str) -> str:
    return " ".join(text.split())  # Ansible's output folds long messages


def health(fleet):
    return run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra)


def ledger(fleet) -> list[dict]:
    path = Path(fleet.extra["sglang_fleet_ledger"])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_health_after_stop_says_stopped_by_stop_yml_and_passes(one_node):
    assert one_node.deploy().rc == 0
    stop = one_node.stop()
    assert stop.rc == 0, stop.output[-3000:]
    run = health(one_node)
    assert run.rc == 0, run.output[-3000:]
    assert re.search(r"ok: \[sim-node-1\] => sim-node-1: stopped: stopped by stop\.yml at "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", run.output), run.output[-3000:]
    assert "recover" not in run.output
    assert [e["by"] for e in ledger(one_node) if e["kind"] == "stop"] == ["stop.yml"]
    # A start afterwards is a new run: no longer stopped.
    assert one_node.deploy().rc == 0
    assert "sim-node-1: ready" in health(one_node).output


def quotes() -> list[str]:
    """A line of every failure kind the grammar knows, as the request-log fixture quotes."""
    text = (FIXTURES / "log-requests-quoting-failures.log").read_text()
    return [q.replace("\\'", "'") for q in
            re.findall(r"Please explain this log line:\\n(.*?)', input_ids", text)]


def test_requests_quoting_every_failure_leave_the_server_ready(one_node):
    """SGLang logs each request with --log-requests: prompts quoting every failure wording,
    and a malformed request, never turn a serving server into a crashed one."""
    one_node.set_host_vars("sim-node-1", {"sglang_server_extra_args": ["--log-requests"]})
    assert one_node.deploy().rc == 0
    url = one_node.url("sim-node-1")
    for quote in quotes():
        answer = requests.post(f"{url}/generate", timeout=60, json={
            "text": f"Please explain this log line:\n{quote}\n{quote}",
            "sampling_params": {"max_new_tokens": 4}})
        assert answer.status_code == 200, answer.text
    bad = requests.post(f"{url}/generate", timeout=60, json={
        "text": "hi", "sampling_params": {"max_new_tokens": "NCCL error"}})
    assert bad.status_code == 500
    log = one_node.log_file("sim-node-1").read_text()
    # Every request is logged, warm-up's too; the malformed one is logged before it fails.
    assert log.count("] Receive: obj=GenerateReqInput(rid=") == len(quotes()) + 2
    assert log.count("] Finish: obj=GenerateReqInput(rid=") == len(quotes()) + 1
    assert "'max_new_tokens': 'NCCL error'" in log
    run = health(one_node)
    assert run.rc == 0, run.output[-3000:]
    assert "ok: [sim-node-1] => sim-node-1: ready: /health answered 200" in run.output


def test_a_fatal_line_alone_never_gets_a_generating_server_killed(one_node):
    """Text that reads as a fatal line (here written into the log by the test) while the
    server answers /health and /health_generate: the verdict says they disagree, and a
    recovery leaves the server alone."""
    assert one_node.deploy().rc == 0
    pids = sorted(p["pid"] for p in one_node.server_processes("sim-node-1"))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with one_node.log_file("sim-node-1").open("a") as log:
        log.write(f"[{stamp} TP0] Scheduler hit an exception: Traceback (most recent call "
                  f"last):\n  File \"scheduler.py\", line 1, in run_scheduler_process\n"
                  f"RuntimeError: NCCL error: unhandled system error\x1b[2J\x1b]0;x\x07\n")
    run = health(one_node)
    assert run.rc == 0, run.output[-3000:]
    assert ("sim-node-1: ready: /health and /health_generate answered 200, though the log "
            "reads as nccl_error: TP0: RuntimeError: NCCL error: unhandled system error") \
        in words(run.output)
    # The log's escape sequences reach the terminal as text.
    assert "\\x1b]0;x\\x07" in run.output and "\x1b]0;" not in run.output
    recover = run_playbook("playbooks/recover.yml", one_node.inventory, one_node.extra)
    assert recover.rc == 0 and "sim-node-1: ready, nothing to recover" in recover.output
    assert sorted(p["pid"] for p in one_node.server_processes("sim-node-1")) == pids


def test_the_oom_killer_at_start_up_restarts_the_same_configuration(one_node):
    """The host's OOM killer takes the server while it loads: the node's fault. Recovery
    restarts the same configuration (never the fallback's), naming the cause."""
    settings = {**one_node.extra, **FAST_GATE, "sglang_recover_on_failure": True,
                "sglang_server_sim_fault": "killed:loading_weights",
                "sglang_recover_fallback_chain": [{"sglang_server_cuda_graph": False}]}
    run = run_playbook("deploy.yml", one_node.inventory, settings)
    assert run.rc != 0
    out = words(run.output)
    assert "sim-node-1: crashed in loading_weights: the kernel's OOM killer killed pid" in out
    assert "Cause: environment (the node's: fix the node, the configuration stays)" in out
    recovery = next(e for e in ledger(one_node) if e["kind"] == "recovery")
    assert recovery["cause"] == "environment"
    assert recovery["next"]["source"] == "restart" and recovery["next"]["overrides"] == {}
    assert "restart on the same configuration" in out
    assert "sglang_server_cuda_graph" not in json.dumps(recovery["next"])


# ---- faults from outside at start-up are not the configuration's ------------------------

def _deploy_in_background(fleet, settings):
    import threading

    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(
        run=run_playbook("deploy.yml", fleet.inventory, settings)), daemon=True)
    thread.start()
    return thread, done


def _loading(fleet, host="sim-node-1"):
    log = fleet.host_root(host) / "logs" / f"Kimi-K2.5-{fleet.port(host)}.log"
    return log.exists() and "Load weight begin" in log.read_text(errors="replace")


def test_a_scheduler_killed_from_outside_while_loading_keeps_the_configuration(one_node):
    """A kill -9 of a scheduler while the weights load, with no OOM kill in the kernel log:
    SGLang's main process says the scheduler died (exit code -9). Not the configuration's
    fault: the verdict says external, and recovery restarts the same configuration (never the
    fallback's cuda_graph=False) and offers nothing to keep."""
    import os
    import signal

    from sglang_fleet.testfleet.local import wait_for

    settings = {**one_node.extra, **FAST_GATE, "sglang_recover_on_failure": True,
                "sglang_server_sim_time_factor": 0.05,
                "sglang_recover_fallback_chain": [{"sglang_server_cuda_graph": False}]}
    thread, done = _deploy_in_background(one_node, settings)
    wait_for(lambda: _loading(one_node), timeout=240)
    scheduler = wait_for(lambda: next(
        (p["pid"] for p in one_node.server_processes("sim-node-1")
         if p["cmdline"].startswith("sglang::scheduler")), None), timeout=60)
    os.kill(scheduler, signal.SIGKILL)
    thread.join(600)
    run = done["run"]
    out = words(run.output)
    assert ("sim-node-1: crashed in loading_weights: a scheduler was killed by SIGKILL from "
            "outside SGLang in loading_weights (SGLang: RuntimeError: Rank 0 scheduler died "
            "during initialization (exit code: -9)") in out, run.output[-4000:]
    assert "Cause: external" in out
    recovery = next(e for e in ledger(one_node) if e["kind"] == "recovery")
    assert recovery["cause"] == "external"
    assert recovery["next"]["source"] == "restart" and recovery["next"]["overrides"] == {}
    assert "Keep it" not in out and "sglang_server_cuda_graph" not in json.dumps(
        recovery["next"])
    assert "Now " in out and " is ready" in out


def test_a_port_taken_while_loading_is_the_nodes_fault_naming_its_holder(one_node):
    """Another program takes the HTTP port while the server loads (here: this test, bound
    to it). The start dies on [Errno 98]: the verdict says environment and names the
    holder's pid and command; recovery restarts the same configuration once the port is
    free, with nothing to keep."""
    import os
    import socket

    from sglang_fleet.testfleet.local import wait_for

    port = one_node.port("sim-node-1")
    settings = {**one_node.extra, **FAST_GATE, "sglang_server_sim_time_factor": 0.05,
                "sglang_recover_fallback_chain": [{"sglang_server_cuda_graph": False}]}
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        thread, done = _deploy_in_background(one_node, settings)
        wait_for(lambda: _loading(one_node), timeout=240)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        thread.join(600)
        run = done["run"]
        assert run.rc != 0
        out = words(run.output)
        assert f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {port})" \
            in out, run.output[-4000:]
        assert f"port {port} is held by {os.getpid()} (" in out, run.output[-4000:]
        assert "Cause: environment" in out and "Cause: configuration" not in out
    finally:
        holder.close()
    recover = run_playbook("playbooks/recover.yml", one_node.inventory,
                           {**settings, "sglang_recover_on_failure": True})
    assert recover.rc == 0, recover.output[-4000:]
    out = words(recover.output)
    assert "Path: restart, because it is the node's fault, not the configuration's" in out
    assert "Keep it" not in out
    recovery = [e for e in ledger(one_node) if e["kind"] == "recovery"][-1]
    assert recovery["cause"] == "environment" and recovery["next"]["overrides"] == {}
