"""Failures after start-up and across nodes, as SGLang 0.5.23 has them, through the toolkit:
a multi-node group whose second node never started, a generation hang that SGLang's watchdog
ends, a stopped scheduler that hangs the endpoints that wait on it, and a queue that
overflows. Each is judged, recovered or ridden out by real playbook runs, as a user would."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from sglang_fleet.node.bench.client import flush_cache
from sglang_fleet.node.process import procs
from sglang_fleet.node.router.api import Router, parse_prometheus, read_inflight
from sglang_fleet.testfleet.local import (
    FAST_GATE,
    SOAK_REQUESTS,
    http_status,
    make_fleet,
    make_tp16_group,
    run_playbook,
    wait_for,
)
from sglang_fleet.testfleet.router import registered, router_venv

pytestmark = pytest.mark.integration


def words(text: str) -> str:
    return " ".join(text.split())  # Ansible's output folds long lines


# ---- a TP=16 group with one node not started --------------------------------------------------

def test_a_group_whose_second_node_never_started_is_never_ready(tmp_path):
    """Rank 0 waits at the rendezvous for ranks 8-15: the gate names them while it waits,
    calls the group stalled in launching, never ready, and crashed with torch's own store
    timeout once --dist-timeout has passed. The second node's own check refuses to start it
    (its logs folder is a link), as a node that fails before its start would."""
    fleet = make_tp16_group(tmp_path)
    # The launching window must outlast the time from the start to the gate's first look (a
    # few seconds on a loaded machine), so that the wait is first seen progressing, and end
    # well before --dist-timeout's crash, so that it is then seen stalled.
    extra = {**fleet.extra, "sglang_server_extra_args": ["--dist-timeout", "30"],
             "sglang_server_gate_stall_windows": {
                 **FAST_GATE["sglang_server_gate_stall_windows"], "launching": 10},
             "sglang_server_gate_poll_interval": 1}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second_logs = fleet.log_file("sim-node-2").parent
    second_logs.parent.mkdir(parents=True, exist_ok=True)
    second_logs.symlink_to(elsewhere)
    try:
        run = run_playbook("deploy.yml", fleet.inventory, extra)
        assert "is a symbolic link" in words(run.output), run.output[-3000:]
        assert not procs.deployment_processes(fleet.marker("sim-node-2"))
        assert run.rc != 0, run.output[-3000:]
        out = words(run.output)
        waits = r"TP0-7 wait at the rendezvous on 127\.0\.0\.1:\d+ for TP8-15 \(node rank 1\)"
        assert re.search(r"progressing: launching: " + waits, out), out[-3000:]
        assert re.search(r"sim-node-1: stalled in launching: no progress for \d+ s \(window "
                         r"10 s\); " + waits, out), out[-3000:]
        assert "a rank or node never joined: check that every node of the group started" in out
        assert "sim-node-1: ready" not in out
        log = fleet.log_file("sim-node-1")
        wait_for(lambda: not procs.deployment_processes(fleet.marker("sim-node-1")),
                 timeout=90, interval=0.5)
        assert "Load weight begin" not in log.read_text()
        health = run_playbook("playbooks/health.yml", fleet.inventory, extra,
                              "--limit", "sim-node-1")
        said = words(health.output)
        assert ("sim-node-1: crashed in launching: TP0: torch.distributed.DistStoreError: Timed "
                "out after 31 seconds waiting for clients. 8/16 clients joined.") in said, \
            said[-3000:]
        assert "sim-node-1: ready" not in said
    finally:
        fleet.kill_leftovers()


def test_the_groups_nodes_meet_and_the_group_is_ready(tmp_path):
    fleet = make_tp16_group(tmp_path)
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]
        text = fleet.log_file("sim-node-1").read_text()
        assert re.search(r" TP0\] Init parallel ends\. elapsed=", text)
        assert "sim-node-1: ready at" in run.output
    finally:
        fleet.kill_leftovers()


# ---- a generation hang after ready -----------------------------------------------------------

def server_pid(fleet, host: str = "sim-node-1") -> int:
    """The sglang-sim main process (the supervisor's recorded pid is its waiting shell)."""
    return next(p["pid"] for p in fleet.server_processes(host)
                if "sglang_fleet.sim.launch_server" in p["cmdline"])


def ledger(fleet) -> list[dict]:
    path = Path(fleet.extra["sglang_fleet_ledger"])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_hang_is_judged_before_sglangs_watchdog_ends_it_and_recovered_unchanged(tmp_path):
    """A stuck forward after ready: /health fails after SGLANG_HEALTH_CHECK_TIMEOUT and the
    gate says unhealthy; at --watchdog-timeout SGLang's watchdog logs and SIGQUITs the tree;
    the gate then says crashed, and recovery starts the same configuration again."""
    fleet = make_fleet(tmp_path, hosts=1)
    # Long enough that a health run on a loaded machine still comes first; the test's point
    # is the order (gate, then watchdog), not the gate's speed.
    watchdog = 40
    extra = {**fleet.extra, **FAST_GATE,
             "sglang_server_extra_args": ["--watchdog-timeout", str(watchdog)],
             "sglang_server_extra_env": {"SGLANG_HEALTH_CHECK_TIMEOUT": 2}}
    try:
        assert run_playbook("deploy.yml", fleet.inventory, extra).rc == 0
        good = [e for e in ledger(fleet) if e["kind"] == "ready"][-1]["config_hash"]
        os.kill(server_pid(fleet), signal.SIGUSR1)  # its batches hang from now on
        hung_at = time.monotonic()
        health = run_playbook("playbooks/health.yml", fleet.inventory, extra)
        judged_after = time.monotonic() - hung_at
        assert "sim-node-1: unhealthy while serving: serving, but /health answered 503" in \
            words(health.output), health.output[-3000:]
        assert judged_after < watchdog, "the gate's verdict comes before the watchdog's"
        assert "Scheduler watchdog timeout" not in fleet.log_file("sim-node-1").read_text()

        wait_for(lambda: not fleet.server_processes("sim-node-1"), timeout=60, interval=0.5)
        ended_after = time.monotonic() - hung_at
        assert watchdog <= ended_after < watchdog * 1.5 + 5 + 15, ended_after
        log = fleet.log_file("sim-node-1").read_text()
        assert re.search(rf"\] Scheduler watchdog timeout \(self\.watchdog_timeout={watchdog}\.0, "
                         r"self\.soft=False\)\n", log)
        assert "SIGQUIT received. signum=None, frame=None. It usually means one child " \
               "failed." in log

        run = run_playbook("playbooks/recover.yml", fleet.inventory,
                           {**extra, "sglang_recover_on_failure": True})
        out = words(run.output)
        assert run.rc == 0, run.output[-4000:]
        # Each rank's watchdog fires on its own; the first SIGQUIT ends the tree, so the
        # ranks that logged it vary (TP0-7, or TP0,2-5,7 on a loaded machine).
        assert re.search(rf"sim-node-1: recovered: configuration {good} failed \(crashed "
                         r"while serving: TP[0-7,-]+: Scheduler watchdog timeout "
                         rf"\(self\.watchdog_timeout={watchdog}\.0, self\.soft=False\)",
                         out), out[-3000:]
        assert f"it was ready on {good} and failed later (crashed while serving)" in out
        assert (f"restart on the same configuration {good}. Now {good} is ready and answered "
                f"its soak of {SOAK_REQUESTS} generation requests.") in out
        assert [e for e in ledger(fleet) if e["kind"] == "ready"][-1]["config_hash"] == good
        assert http_status(fleet.url("sim-node-1") + "/health") == 200
    finally:
        fleet.kill_leftovers()


# ---- endpoints that wait on a stopped scheduler ------------------------------------------------

def timed(call) -> tuple[float, object]:
    began = time.monotonic()
    try:
        result = call()
    except (OSError, requests.RequestException) as exc:
        result = exc
    return time.monotonic() - began, result


def test_a_stopped_scheduler_hangs_its_endpoints_but_no_toolkit_call_past_its_timeout(
        tmp_path, router):
    """SGLang's /server_info, /get_server_info and /flush_cache wait on the scheduler with no
    timeout; a SIGSTOPped scheduler hangs them. The toolkit's own calls to the server each
    have a timeout: the gate's /health probe (sglang_server_health_timeout) and /ready, the
    benchmark's cache flush, membership's in-flight reading, and router registration (each
    call to the router, and the wait for the worker to turn healthy there)."""
    fleet = make_fleet(tmp_path, hosts=1, router=router)
    extra = {**fleet.extra, "sglang_server_health_timeout": 21}
    try:
        assert run_playbook("deploy.yml", fleet.inventory, extra).rc == 0
        url, port = fleet.url("sim-node-1"), fleet.port("sim-node-1")
        began = time.monotonic()
        assert run_playbook("playbooks/health.yml", fleet.inventory, extra).rc == 0
        baseline = time.monotonic() - began
        schedulers = [p["pid"] for p in fleet.server_processes("sim-node-1")
                      if p["cmdline"].startswith("sglang::scheduler")]
        assert len(schedulers) == 8
        procs.signal_pids(schedulers, signal.SIGSTOP)
        try:
            for method, path in (("GET", "/server_info"), ("GET", "/get_server_info"),
                                 ("POST", "/flush_cache")):
                took, answer = timed(lambda m=method, p=path: requests.request(
                    m, url + p, timeout=3))
                assert isinstance(answer, requests.Timeout), (path, answer)
            assert requests.get(url + "/model_info", timeout=3).status_code == 200
            assert requests.get(url + "/ready", timeout=3).status_code == 200
            # The benchmark's cache flush gives up at its own timeout.
            took, answer = timed(lambda: flush_cache("127.0.0.1", port, None, 2))
            assert isinstance(answer, OSError) and took < 3, (took, answer)
            # Membership's in-flight reading: /metrics does not wait on the scheduler.
            took, (count, sources) = timed(lambda: read_inflight(url + "/metrics", "", url, 5))
            assert sources == ["worker /metrics"] and count is not None and took < 5
            # Router registration (sglang_router_member's calls): leave, then join with a
            # join timeout of 8 s; the router's own probes of the worker do not hold it up.
            member = Router(fleet.router_url, timeout=10)
            member.remove(member.find(url)["id"])
            assert member.wait_for(url, present=False, timeout=30) is None
            took, entry = timed(lambda: (member.add(url), member.wait_for(
                url, present=True, healthy=True, timeout=8))[1])
            assert took < 8 + 10 + 3, (took, entry)
            # The gate: its /health probe waits sglang_server_health_timeout, then /ready.
            began = time.monotonic()
            run = run_playbook("playbooks/health.yml", fleet.inventory, extra)
            stopped = time.monotonic() - began
            out = words(run.output)
            # SGLang's own health check gives up first (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s).
            assert ("sim-node-1: unhealthy while serving: serving, but /health answered 503; 8 "
                    "of its processes are stopped (state T: SIGSTOP or a debugger)") in out, out
            assert stopped - baseline < 21 + 5 + 15, (stopped, baseline)
        finally:
            procs.signal_pids(schedulers, signal.SIGCONT)
        answer = requests.get(url + "/server_info", timeout=10).json()
        assert answer["status"] == "ready" and len(answer["internal_states"]) == 1
        entry = Router(fleet.router_url).wait_for(url, present=True, healthy=True, timeout=90)
        assert entry is not None and entry["is_healthy"], entry
    finally:
        fleet.kill_leftovers()


# ---- a full queue ---------------------------------------------------------------------------

# http_server's HTTPException handler around the scheduler's abort (scheduler.py
# _abort_on_queued_limit: 503, "The request queue is full.").
QUEUE_FULL = {"object": "error", "message": "The request queue is full.", "type": "503",
              "param": None, "code": 503}


def generate(url: str, tokens: int, timeout: float = 300) -> requests.Response:
    return requests.post(f"{url}/generate", json={
        "text": f"{os.urandom(8).hex()} tell me more",
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}, timeout=timeout)


def gauge(url: str, name: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    return sum(v for (n, _), v in parse_prometheus(text).items() if n == name)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    return router_venv(tmp_path_factory.getbasetemp().parent)


def test_a_full_queue_answers_sglangs_503_the_router_retries_and_the_gate_says_ready(
        tmp_path, router):
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.005, router=router)
    extra = {**fleet.extra, "sglang_server_extra_args": [
        "--max-running-requests", "4", "--max-queued-requests", "8"]}
    pool = ThreadPoolExecutor(64)
    try:
        assert run_playbook("deploy.yml", fleet.inventory, extra).rc == 0
        url = fleet.url("sim-node-1")
        # 4 running and 8 waiting, for a minute at the simulated speed.
        filling = [pool.submit(generate, url, 1200) for _ in range(12)]
        wait_for(lambda: gauge(url, "sglang:num_running_reqs") == 4
                 and gauge(url, "sglang:num_queue_reqs") == 8, timeout=30)
        answers = list(pool.map(lambda _: generate(url, 8, timeout=30), range(200)))
        assert [a.status_code for a in answers] == [503] * 200
        assert {a.text for a in answers} == {json.dumps(QUEUE_FULL, separators=(",", ":"))}
        # SGLang counts only the aborts its tokenizer manager sends (client disconnects,
        # /abort_request); a queue-full rejection is not one.
        assert gauge(url, "sglang:num_aborted_requests_total") == 0

        # The gate: a full queue is not a health failure (/health's own request is answered,
        # or aborted, at once). The server's verdict only: the router's own row says what its
        # clients get meanwhile, a 503 from a worker whose queue is full.
        health = run_playbook("playbooks/health.yml", fleet.inventory, extra,
                              "--limit", "sim-node-1")
        assert health.rc == 0, health.output[-3000:]
        assert "sim-node-1: ready" in words(health.output)

        # The router in front retries what the queue refuses, and keeps the worker in rotation.
        retries = gauge(fleet.router_metrics_url, "smg_worker_retries_total")
        routed = list(pool.map(lambda _: generate(fleet.router_url, 8, timeout=60), range(20)))
        assert gauge(fleet.router_metrics_url, "smg_worker_retries_total") > retries
        assert {r.status_code for r in routed} <= {200, 503}
        assert registered(fleet.router_url) == {url: True}
        assert all(f.result().status_code == 200 for f in filling)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        fleet.kill_leftovers()
