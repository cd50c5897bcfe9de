"""A canary judged by what clients feel, behind the real router under a steady client stream:
a slower canary is detected, rolled back by itself with no failed client request, and the
ledger rejects it; a canary that serves like the baseline passes and the rollout goes on.

Servers are simulated (SGLANG_SIM_REGRESS makes the canary slower, docs/simulator.md); the
router (the pinned sglang-router wheel), the HTTP traffic and the window's seconds are real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_fleet.bench.loadgen import Load
from sglang_fleet.testfleet.local import SMALL_TP, make_fleet
from sglang_fleet.testfleet.router import router_venv

pytestmark = pytest.mark.integration

# A short window for a test (the default is 300 s): 6 clients keep each server busy enough
# that both sides pass the minimum of 20 live requests many times over.
JUDGE = {"sglang_fleet_canary": "sim-node-1", "sglang_bench_canary_window": 15}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("canary")
    fleet = make_fleet(tmp, hosts=3, time_factor=0.005, tp=SMALL_TP,
                       router=router_venv(tmp_path_factory.getbasetemp().parent))
    first = fleet.deploy(extra=fleet.with_stores())
    assert first.rc == 0, first.output[-3000:]
    yield fleet
    fleet.stop()
    fleet.kill_leftovers()


def ledger(fleet) -> list[dict]:
    path = Path(fleet.extra["sglang_fleet_ledger"])
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ready_hash(fleet, host: str) -> str:
    return [e for e in ledger(fleet) if e["kind"] == "ready" and e["host"] == host][-1][
        "config_hash"]


def under_load(fleet, **extra):
    """One canary deploy while 6 clients stream through the router; (run, failed requests)."""
    load = Load(url=fleet.router_url, clients=6, max_new_tokens=32, duration=600).start()
    try:
        run = fleet.deploy(extra=fleet.with_stores(**{**JUDGE, **extra}))
    finally:
        load.stop()
        records = load.wait()
    return run, [r for r in records if not r.completed]


def test_a_slower_canary_is_rolled_back_by_itself_with_no_failed_request(fleet):
    good = ready_hash(fleet, "sim-node-1")
    pids = {h: fleet.main_pid(h) for h in ("sim-node-2", "sim-node-3")}
    run, failed = under_load(fleet, sglang_server_sim_regress="decode=0.5")
    assert run.rc != 0, run.output[-3000:]
    assert failed == [], [(r.rid, r.error) for r in failed]
    text = " ".join(run.output.split())
    assert "sim-node-1: canary failed on generation tokens/s: canary" in text, text[-4000:]
    assert "Rolled back by itself" in text and "Rollout stopped" in text
    assert "because the canary failed on generation tokens/s" in text
    # Back on the configuration it ran before; the ledger rejects the slower one and says why.
    assert ready_hash(fleet, "sim-node-1") == good
    rejected = [e for e in ledger(fleet) if e["kind"] == "rejected"][-1]
    assert rejected["host"] == "sim-node-1" and rejected["back_to"] == good
    assert rejected["why"].startswith("the canary failed on generation tokens/s")
    # The rollout never reached the baseline servers.
    assert {h: fleet.main_pid(h) for h in pids} == pids
    assert run.recap["sim-node-2"]["changed"] == 0


def test_canaries_that_serve_like_the_baseline_pass_and_the_rollout_goes_on(fleet):
    # A new configuration (its hash differs) that serves exactly like the old one, on half
    # the fleet first (rounded up: sim-node-1 and sim-node-2), judged against sim-node-3.
    before = fleet.main_pid("sim-node-3")
    run, failed = under_load(fleet, sglang_server_sim_regress="decode=1",
                             sglang_fleet_canary="50%")
    assert run.rc == 0, run.output[-4000:]
    assert failed == [], [(r.rid, r.error) for r in failed]
    for canary in ("sim-node-1", "sim-node-2"):
        assert f"{canary}: canary passed every signal over 15 s of live traffic" in run.output
    assert fleet.main_pid("sim-node-3") != before, "the rollout went on past the canaries"


def test_a_batch_is_judged_like_the_canary_against_the_servers_not_yet_deployed(fleet):
    # One batch at a time. The canary's new configuration serves like the old one and passes;
    # the next batch (sim-node-2) is slower and is judged against sim-node-3, still on the
    # configuration before: it is rolled back and sim-node-3 is never deployed.
    for host, regress in (("sim-node-1", "ttft=1"), ("sim-node-2", "decode=0.5"),
                          ("sim-node-3", "ttft=1")):
        fleet.set_host_vars(host, {"sglang_server_sim_regress": regress})
    last = fleet.main_pid("sim-node-3")
    load = Load(url=fleet.router_url, clients=6, max_new_tokens=32, duration=600).start()
    try:
        run = fleet.deploy(extra=fleet.with_stores(**JUDGE, sglang_fleet_serial=1))
    finally:
        load.stop()
        failed = [r for r in load.wait() if not r.completed]
    assert run.rc != 0, run.output[-3000:]
    assert failed == [], [(r.rid, r.error) for r in failed]
    text = " ".join(run.output.split())
    assert "sim-node-1: canary passed every signal" in text, text[-4000:]
    assert "sim-node-2: batch server failed on generation tokens/s" in text, text[-4000:]
    assert "because the batch server failed on generation tokens/s" in text
    assert fleet.main_pid("sim-node-3") == last, "no batch after the failing one started"


def test_canaries_judged_together_count_no_probe_as_live_traffic(fleet):
    # Two canaries in one window with no client traffic: their shared baseline (sim-node-1)
    # is probed once, and none of the probes counts as live, so neither canary passes.
    for host in ("sim-node-2", "sim-node-3"):
        fleet.set_host_vars(host, {"sglang_server_sim_regress": "itl=1"})
    run = fleet.deploy(extra=fleet.with_stores(**{
        **JUDGE, "sglang_fleet_canary": "sim-node-2,sim-node-3",
        "sglang_bench_canary_window": 5}))
    assert run.rc != 0, run.output[-3000:]
    text = " ".join(run.output.split())
    for canary in ("sim-node-2", "sim-node-3"):
        assert (f"{canary}: canary inconclusive: canary and baseline got fewer than 20 live "
                "requests, over 5 s of live traffic (canary 0 requests, baseline 0)") in text, \
            text[-4000:]
    assert "It keeps its new configuration and serves" in text


def test_a_later_batch_servers_plan_that_could_never_fail_is_refused_before_any_node(fleet):
    # sim-node-3 would be judged like the canary in a later batch, by its own plan.
    pids = {h: fleet.main_pid(h) for h in ("sim-node-1", "sim-node-2", "sim-node-3")}
    fleet.set_host_vars("sim-node-3", {"sglang_bench_canary_min_tokens_ratio": 0})
    run = fleet.deploy(extra=fleet.with_stores(**{**JUDGE, "sglang_server_sim_regress": "ttft=1",
                                                  "sglang_fleet_serial": 1}))
    assert run.rc != 0, run.output[-3000:]
    text = " ".join(run.output.split())
    assert ("not started, no node was contacted: sglang_bench_canary_min_tokens_ratio=0 is "
            "refused. Fix: set a ratio above 0 and below 1") in text, text[-3000:]
    assert {h: fleet.main_pid(h) for h in pids} == pids
