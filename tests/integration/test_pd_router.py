"""A PD deployment behind SGLang's router in PD mode (the real sglang-router): each side joins
with its worker type (the prefill with its KV bootstrap port) once its gate says ready, the
router's /readiness waits for one of each, and requests go through a prefill and a decode."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_fleet.bench.loadgen import Load, routed_to, summarize
from sglang_fleet.node.process import procs
from sglang_fleet.testfleet.local import (
    SMALL_TP,
    make_pd_fleet,
    pd_bootstrap_port,
    run_playbook,
    sglang_fleet,
    wait_for,
)
from sglang_fleet.testfleet.router import router_venv, router_workers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def venv(tmp_path_factory):
    return router_venv(tmp_path_factory.getbasetemp().parent)


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def loads_stopped():
    """Every load a test starts is stopped when the test ends, passed or failed."""
    yield
    while LOADS:
        LOADS.pop().stop()


LOADS: list[Load] = []


def start_load(fleet, prefix: str, clients: int, api: str = "generate") -> Load:
    """Streaming requests through the router until the test stops them: for as long as its
    steps take on this machine (a fixed 300 s ran out during a deploy on a loaded one)."""
    load = Load(fleet.router_url, clients=clients, max_new_tokens=24, duration=3600,
                prefix=prefix, api=api).start()
    LOADS.append(load)
    return load


def deployed(fleet):
    """The fleet after its first deploy, whose output it keeps (first_output)."""
    first = fleet.deploy()
    assert first.rc == 0, first.output[-3000:]
    fleet.first_output = first.output
    return fleet


@pytest.fixture(scope="module")
def one_by_one(tmp_path_factory, venv):
    """One prefill and one decode behind the router, deployed once for the test that reads
    its first deploy and then the test that kills and recovers its prefill."""
    fleet = make_pd_fleet(tmp_path_factory.mktemp("one-by-one"), router=venv, tp=SMALL_TP)
    try:
        yield deployed(fleet)
    finally:
        fleet.kill_leftovers()


@pytest.fixture(scope="module")
def two_by_two_fleet(tmp_path_factory, venv):
    """Two prefills and two decodes behind the router, deployed once for the tests that roll,
    kill and recover them under a stream. The router logs each request's prefill and decode
    at debug; a prefill gives up its bootstrap to a dead decode after 5 s
    (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, short here), so that the router re-sends it."""
    fleet = make_pd_fleet(tmp_path_factory.mktemp("two-by-two"), router=venv, tp=SMALL_TP,
                          prefills=2, decodes=2, prefill_vars={"sglang_server_extra_env": {
                              "SGLANG_ENABLE_JIT_DEEPGEMM": 0,
                              "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": 5}})
    fleet.extra["sglang_router_log_level"] = "debug"
    try:
        yield deployed(fleet)
    finally:
        fleet.kill_leftovers()


@pytest.fixture
def two_by_two(two_by_two_fleet):
    """The shared fleet, ready on its inventory: a re-run puts back what the test before it
    left otherwise (nothing to change when it left it so)."""
    run = two_by_two_fleet.deploy()
    assert run.rc == 0, run.output[-3000:]
    return two_by_two_fleet


def test_a_pd_deployment_joins_its_router_side_by_side_and_serves_through_it(one_by_one):
    fleet = one_by_one
    command = next((fleet.router_root / "conf").glob("*.launch.sh")).read_text()
    assert "--pd-disaggregation" in command
    workers = {w["url"].rstrip("/"): w for w in router_workers(fleet.router_url)}
    prefill, decode = workers[fleet.url("sim-node-1")], workers[fleet.url("sim-node-2")]
    assert prefill["worker_type"] == "prefill" and decode["worker_type"] == "decode"
    assert prefill["bootstrap_port"] == pd_bootstrap_port(fleet)
    assert prefill["is_healthy"] and decode["is_healthy"]
    assert requests.get(fleet.router_url + "/readiness", timeout=5).status_code == 200
    assert "sim-router: serving at" in fleet.first_output
    assert "one request answered" in fleet.first_output
    # The request went to one server of each side.
    answer = requests.post(fleet.router_url + "/generate", timeout=30, json={
        "text": "hello", "sampling_params": {"max_new_tokens": 4}})
    assert answer.status_code == 200 and answer.json()["meta_info"]["completion_tokens"] == 4
    again = fleet.deploy()
    assert again.rc == 0 and again.changed_hosts() == set(), again.output[-3000:]


def test_the_router_is_not_ready_while_its_deployment_lacks_a_ready_prefill(tmp_path, venv):
    fleet = make_pd_fleet(tmp_path, router=venv, tp=SMALL_TP,
                          prefill_vars={"sglang_server_sim_fault": "crash:loading_weights"})
    try:
        run = fleet.deploy()
        assert run.rc != 0, run.output[-3000:]
        # The decode is ready, but every request through the router would fail without a
        # prefill: it stays out, and says why.
        assert ("sim-node-2: stays out of router sim-router; no prefill of PD deployment "
                "kimi_pd is ready (sim-node-1 crashed)") in flat(run.output), run.output[-3000:]
        assert "joined router" not in run.output
        assert router_workers(fleet.router_url) == []
        ready = requests.get(fleet.router_url + "/readiness", timeout=5)
        assert ready.status_code == 503 and "insufficient healthy workers" in ready.text
    finally:
        fleet.kill_leftovers()


def test_routers_and_pd_deployments_that_do_not_fit_are_refused_before_any_node(tmp_path,
                                                                                venv):
    fleet = make_pd_fleet(tmp_path, router=venv)
    plain = dict(fleet.extra, sglang_router_pd_disaggregation=False)
    check = sglang_fleet("check", "-i", str(fleet.inventory), "-e", json.dumps(plain))
    assert check.returncode == 2, check.stdout[-3000:]
    assert ("refused [sim-node-1, sim-node-2]: router sim-router fronts PD deployment kimi_pd "
            "without PD mode and would send whole requests to a prefill server. Fix: set "
            "sglang_router_pd_disaggregation: true for sim-router") in flat(check.stdout)
    # A canary rollout judges the canary and each later batch's server alone: no PD server
    # may be in one, as the canary (sim-node-1, the prefill) or after it (sim-node-2).
    canary = sglang_fleet("check", "-i", str(fleet.inventory), "-e",
                          json.dumps({**fleet.extra, "sglang_fleet_canary": "sim-node-1"}))
    assert canary.returncode == 2, canary.stdout[-3000:]
    said = flat(canary.stdout)
    assert "sglang_fleet_canary=sim-node-1 is a prefill server of a PD deployment" in said, said
    assert ("sim-node-2 is a decode server of a PD deployment, and with sglang_fleet_canary "
            "set each later batch's servers are judged alone like the canary") in said, said
    assert not fleet.root.exists(), "no node may be touched"


def test_a_prefill_whose_bootstrap_server_died_leaves_the_router_under_watch(tmp_path, venv):
    """The router health-checks only the prefill's HTTP port, which keeps answering 200: it
    would go on sending that prefill requests that every decode fails. The gate judges the
    prefill unhealthy and `watch` takes it out; the router is then not ready."""
    fleet = make_pd_fleet(tmp_path, router=venv, tp=SMALL_TP,
                          prefill_vars={"sglang_server_sim_fault": "bootstrap_dead"})
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]
        # The deploy's request through the router: the decode looked the prefill up, which
        # ended the prefill's bootstrap server (the fault); the decode keeps what it read.
        assert {w["url"].rstrip("/") for w in router_workers(fleet.router_url)
                if w["is_healthy"]} == {fleet.url("sim-node-1"), fleet.url("sim-node-2")}
        watched = sglang_fleet("watch", "--count", "1", "-i", str(fleet.inventory),
                               "--run-dir", str(tmp_path / "watch"), "-e",
                               json.dumps(fleet.extra))
        out = flat(watched.stdout)
        assert "sim-node-1 unhealthy" in out and "removed it" in out, out[-3000:]
        # Its decode, ready itself, leaves with it: the pair serves nothing without a prefill.
        assert ("sim-node-2: router sim-router: registered as decode, healthy, load 0 (gate: "
                "ready); removed it: no prefill of PD deployment kimi_pd is ready (sim-node-1 "
                "unhealthy)") in out, out
        assert router_workers(fleet.router_url) == []
        assert requests.get(fleet.router_url + "/readiness", timeout=5).status_code == 503
    finally:
        fleet.kill_leftovers()


def test_a_killed_decode_loses_only_what_it_held_under_openai_streams(tmp_path, two_by_two):
    """A decode killed under OpenAI-API streams: the router, its circuit breaker off as a PD
    router's should be, re-sends each request it paired with the dead decode once the
    prefill gives it up (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, short here), and watch
    recovers the decode alone. A request fails only if it was running on the decode when it
    died; no prefill's circuit stops the traffic."""
    fleet = two_by_two
    assert "circuit breaker on" not in fleet.first_output
    victim = fleet.hosts[3]
    kept = {h: fleet.server_pid(h) for h in fleet.hosts if h != victim}
    load = start_load(fleet, "kill", clients=4, api="chat")
    wait_for(lambda: sum(r.completed for r in load.requests) >= 4, timeout=180)
    killed_at = time.time()
    procs.signal_pids([p["pid"] for p in fleet.processes(victim)], signal.SIGKILL)
    watched = sglang_fleet("watch", "--recover", "--count", "1", "--interval", "1",
                           "-i", str(fleet.inventory), "--run-dir", str(tmp_path / "watch"),
                           "-e", json.dumps(fleet.extra))
    out = flat(watched.stdout)
    assert f"{victim}: recovered" in out, out[-3000:]
    started = len(load.requests)
    wait_for(lambda: sum(r.completed for r in load.requests[started:]) >= 8, timeout=180)
    load.stop()
    killed = summarize(load.wait())
    assert {h: fleet.server_pid(h) for h in kept} == kept
    routes = routed_to(fleet.router_log.read_text())
    for failure in killed["failures"]:
        assert failure["start"] < killed_at and \
            routes.get(failure["rid"], [""])[-1] == fleet.url(victim), (failure, routes)
    assert killed["completed"] >= killed["sent"] - 4, killed["failures"]


def test_a_prefill_whose_bootstrap_port_is_taken_is_never_registered_and_no_request_fails(
        tmp_path, venv):
    """The router checks only a prefill's HTTP port: registered, a prefill whose bootstrap
    server never bound would fail every request paired with it (about half, with two
    prefills). Its port held by another program, it is refused before it starts, so it never
    joins, and all 200 requests pass."""
    fleet = make_pd_fleet(tmp_path, router=venv, tp=SMALL_TP, prefills=2, decodes=1)
    holder = socket.socket()  # this test's own listener holds the second prefill's port
    holder.bind(("127.0.0.1", pd_bootstrap_port(fleet, 1)))
    holder.listen()
    try:
        run = fleet.deploy()
        assert run.rc != 0 and run.recap["sim-node-2"]["failed"] == 1, run.output[-3000:]
        assert (f"the prefill's KV bootstrap port 127.0.0.1:{pd_bootstrap_port(fleet, 1)} is "
                f"held by {os.getpid()} (") in flat(run.output), run.output[-3000:]
        workers = {w["url"].rstrip("/"): w["worker_type"]
                   for w in router_workers(fleet.router_url)}
        assert workers == {fleet.url("sim-node-1"): "prefill",
                           fleet.url("sim-node-3"): "decode"}

        def one(i: int) -> int:
            return requests.post(fleet.router_url + "/generate", timeout=60, json={
                "text": f"request {i}", "sampling_params": {"max_new_tokens": 2}}).status_code

        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = list(pool.map(one, range(200)))
        assert statuses.count(200) == 200, {s: statuses.count(s) for s in set(statuses)}
    finally:
        holder.close()
        fleet.kill_leftovers()


def whole_sides_out(output: str, sides: list[list[str]]) -> list[list[str]]:
    """The sides whose servers were all out of the router at once during a run, read from
    its membership lines in the order it printed them."""
    out: set[str] = set()
    seen = []
    for host, verb in re.findall(r"(sim-node-\d+): (left|joined) router", output):
        (out.add if verb == "left" else out.discard)(host)
        seen += [side for side in sides if set(side) <= out and side not in seen]
    return seen


def test_a_deploy_of_a_pd_deployment_keeps_a_server_of_each_side_serving(two_by_two):
    """Two prefills and two decodes changed by one deploy without sglang_fleet_serial: one
    batch would restart them all (both decodes out of the router at once: a full outage).
    The batches hold one server of each side back, and no request through the router fails."""
    fleet = two_by_two
    prefills, decodes = fleet.hosts[:2], fleet.hosts[2:]
    load = start_load(fleet, "whole", clients=3)
    wait_for(lambda: any(r.completed for r in load.requests), timeout=180)
    run = fleet.deploy(extra={"sglang_server_num_continuous_decode_steps": 2})
    done = sum(r.completed for r in load.requests)
    wait_for(lambda: sum(r.completed for r in load.requests) >= done + 5, timeout=180)
    load.stop()
    rolled = summarize(load.wait())
    assert run.rc == 0 and run.changed_hosts() == set(fleet.hosts), run.output[-3000:]
    assert rolled["failed"] == 0, rolled["failures"][:5]
    assert flat(run.output).count("; drained in ") == 4, run.output[-3000:]
    assert whole_sides_out(run.output, [prefills, decodes]) == [], run.output[-3000:]
    # An inventory that lets the sides go whole: one batch, as it says.
    whole = fleet.deploy(extra={"sglang_server_num_continuous_decode_steps": 1,
                                "sglang_server_pd_keep_side_serving": False})
    assert whole.rc == 0, whole.output[-3000:]
    assert whole_sides_out(whole.output, [prefills, decodes]) != [], whole.output[-3000:]


def test_prefills_roll_and_a_decode_recovers_under_a_stream_without_touching_the_other_side(
        tmp_path, two_by_two):
    """Two prefills and two decodes behind the router: a rolling change of the prefills drains
    each from the router before its restart, while the other prefill serves; a hung decode is
    cut out, recovered and rejoins, and no prefill is touched. No request fails but those the
    hung decode held when it hung, or that the router sent it before it was cut out."""
    fleet = two_by_two
    prefills, decodes = fleet.hosts[:2], fleet.hosts[2:]
    before = {h: fleet.server_pid(h) for h in fleet.hosts}
    load = start_load(fleet, "roll", clients=3)
    wait_for(lambda: any(r.completed for r in load.requests), timeout=180)
    run = fleet.deploy("--limit", "kimi_prefill", "-e", "sglang_fleet_serial=1",
                       extra={"sglang_server_num_continuous_decode_steps": 2})
    wait_for(lambda: sum(r.completed for r in load.requests) >= 10, timeout=180)
    load.stop()
    rolled = summarize(load.wait())
    assert run.rc == 0 and run.changed_hosts() == set(prefills), run.output[-3000:]
    assert rolled["failed"] == 0, rolled["failures"][:5]
    text = flat(run.output)
    assert text.count("; drained in ") == 2
    assert all(fleet.server_pid(h) != before[h] for h in prefills)
    assert all(fleet.server_pid(h) == before[h] for h in decodes)

    victim = decodes[1]
    kept = {h: fleet.server_pid(h) for h in fleet.hosts}
    load = start_load(fleet, "hang", clients=3)
    wait_for(lambda: any(r.completed for r in load.requests), timeout=180)
    os.kill(kept[victim], signal.SIGUSR1)  # generation hangs, requests in flight included
    watched = sglang_fleet("watch", "--recover", "--count", "1", "--interval", "1",
                           "-i", str(fleet.inventory), "--run-dir", str(tmp_path / "watch"),
                           "-e", json.dumps(fleet.extra))
    out = flat(watched.stdout)
    assert f"{victim} unhealthy" in out and f"{victim}: recovered" in out, out[-3000:]
    wait_for(lambda: {w["url"].rstrip("/") for w in router_workers(fleet.router_url)
                      if w["is_healthy"]} == {fleet.url(h) for h in fleet.hosts},
             timeout=60)
    started = len(load.requests)
    wait_for(lambda: sum(r.completed for r in load.requests[started:]) >= 5, timeout=180)
    load.stop()
    hung = summarize(load.wait())
    assert fleet.server_pid(victim) != kept[victim]
    assert {h: fleet.server_pid(h) for h in fleet.hosts if h != victim} == {
        h: pid for h, pid in kept.items() if h != victim}
    # Every request that failed had been sent to the hung decode (before it was cut out).
    routes = routed_to(fleet.router_log.read_text())
    assert hung["sent"] > hung["failed"]
    assert all(routes.get(f["rid"], [""])[-1] == fleet.url(victim)
               for f in hung["failures"]), (hung["failures"][:5], routes)


def test_a_recovery_of_the_only_prefill_brings_its_decode_back_into_the_router(tmp_path,
                                                                               one_by_one):
    """One prefill and one decode: when the prefill dies, the decode leaves the router. The
    recovery of the prefill, by `recover --limit` or `watch --recover`, puts the decode back
    in the same run and says ok only then; a recovery that cannot (the decode outside a plain
    playbook's --limit) fails, naming the side the router lacks."""
    fleet = one_by_one
    prefill, decode = fleet.hosts
    both = {fleet.url(prefill), fleet.url(decode)}
    extra = ["-i", str(fleet.inventory), "-e", json.dumps(fleet.extra)]

    def healthy() -> set[str]:
        return {w["url"].rstrip("/") for w in router_workers(fleet.router_url)
                if w["is_healthy"]}

    def prefill_dies_and_the_decode_leaves(name: str) -> None:
        os.kill(fleet.server_pid(prefill), signal.SIGKILL)
        watched = sglang_fleet("watch", "--count", "1", "--run-dir", str(tmp_path / name),
                               *extra)
        assert f"{prefill} crashed" in flat(watched.stdout), watched.stdout[-3000:]
        assert router_workers(fleet.router_url) == [], watched.stdout[-3000:]

    prefill_dies_and_the_decode_leaves("watch-1")
    # The fleet's own advice: recover the prefill.
    recovered = sglang_fleet("recover", "--limit", prefill, "--run-dir",
                             str(tmp_path / "recover"), *extra)
    out = flat(recovered.stdout)
    assert recovered.returncode == 0 and "result: ok" in out, out[-3000:]
    assert f"[{decode}] joined router sim-router" in out, out[-3000:]
    assert healthy() == both
    answer = requests.post(fleet.router_url + "/generate", timeout=30, json={
        "text": "hello", "sampling_params": {"max_new_tokens": 4}})
    assert answer.status_code == 200, answer.text

    # The same under watch --recover, which exits 0 after the good recovery.
    os.kill(fleet.server_pid(prefill), signal.SIGKILL)
    watched = sglang_fleet("watch", "--recover", "--count", "1", "--interval", "1",
                           "--run-dir", str(tmp_path / "watch-2"), *extra)
    out = flat(watched.stdout)
    assert f"{prefill}: recovered" in out and f"{decode}: not recovered" not in out, \
        out[-3000:]
    assert watched.returncode == 0, out[-3000:]
    wait_for(lambda: healthy() == both, timeout=30)

    # A plain playbook limited to the prefill cannot reach the decode: it says so.
    prefill_dies_and_the_decode_leaves("watch-3")
    plain = run_playbook("playbooks/recover.yml", fleet.inventory, fleet.extra,
                         "--limit", prefill)
    assert plain.rc != 0, plain.output[-3000:]
    assert (f"{prefill}: recovered, but router sim-router lists no healthy decode server "
            f"of PD deployment kimi_pd: every request through it fails; {decode} was "
            f"outside this run. Fix: recover the deployment as a unit: sglang-fleet "
            f"recover --limit kimi_pd") in flat(plain.output), plain.output[-3000:]


def test_a_prefill_whose_transfers_fail_is_judged_by_its_decodes_and_taken_out(tmp_path, venv):
    """The prefill's KV transfers never complete (transfer_hang) while its HTTP and bootstrap
    servers answer: its own checks pass. The decode fails each request at its waiting timeout
    and names the prefill's bootstrap address; `watch` judges the prefill unhealthy on that
    evidence and takes it out of the router (and the decode with it: no prefill is ready)."""
    fleet = make_pd_fleet(
        tmp_path, router=venv, tp=SMALL_TP,
        prefill_vars={"sglang_server_sim_fault": "transfer_hang"},
        decode_vars={"sglang_server_extra_env": {
            "SGLANG_ENABLE_JIT_DEEPGEMM": 0, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 3}})
    port = pd_bootstrap_port(fleet)
    try:
        fleet.deploy()  # its request through the router meets the hang too
        assert {w["url"].rstrip("/") for w in router_workers(fleet.router_url)
                if w["is_healthy"]} == {fleet.url("sim-node-1"), fleet.url("sim-node-2")}
        failed = requests.post(fleet.url("sim-node-2") + "/generate", timeout=60, json={
            "text": "hello", "sampling_params": {"max_new_tokens": 2},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": 7})
        assert failed.status_code == 500, failed.text
        watched = sglang_fleet("watch", "--count", "1", "-i", str(fleet.inventory),
                               "--run-dir", str(tmp_path / "watch"), "-e",
                               json.dumps(fleet.extra))
        out = flat(watched.stdout)
        assert "sim-node-1 unhealthy; sim-node-2 ready" in out, out[-3000:]
        assert "removed it" in out and watched.returncode != 0, out[-3000:]
        assert router_workers(fleet.router_url) == []
        prefill = json.loads((tmp_path / "watch" / "summary.json").read_text())["hosts"][
            "sim-node-1"]
        assert prefill["reason"].startswith(
            f"/health and its KV bootstrap server answer, but its decodes' KV transfers from "
            f"it fail (bootstrap 127.0.0.1:{port}; sim-node-2: "), prefill
        # The decode waited its 3 s timeout, and says how long it waited (more on a busy
        # machine).
        waited = re.search(r"timed out after (\d+\.\d)s in KVPoll\.WaitingForInput",
                           prefill["reason"])
        assert waited and float(waited[1]) >= 3.0, prefill
    finally:
        fleet.kill_leftovers()
