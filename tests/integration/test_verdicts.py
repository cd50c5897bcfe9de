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
