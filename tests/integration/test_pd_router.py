"""A PD deployment behind SGLang's router in PD mode (the real sglang-router): each side joins
with its worker type (the prefill with its KV bootstrap port) once its gate says ready, the
router's /readiness waits for one of each, and requests go through a prefill and a decode."""

from __future__ import annotations

import json

import pytest
import requests

from sglang_fleet.testfleet.local import make_pd_fleet, pd_bootstrap_port, sglang_fleet
from sglang_fleet.testfleet.router import router_venv, router_workers

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return router_venv(tmp_path_factory.getbasetemp().parent)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_pd_deployment_joins_its_router_side_by_side_and_serves_through_it(tmp_path, venv):
    fleet = make_pd_fleet(tmp_path, router=venv)
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]
        command = next((fleet.router_root / "conf").glob("*.launch.sh")).read_text()
        assert "--pd-disaggregation" in command
        workers = {w["url"].rstrip("/"): w for w in router_workers(fleet.router_url)}
        prefill, decode = workers[fleet.url("sim-node-1")], workers[fleet.url("sim-node-2")]
        assert prefill["worker_type"] == "prefill" and decode["worker_type"] == "decode"
        assert prefill["bootstrap_port"] == pd_bootstrap_port(fleet)
        assert prefill["is_healthy"] and decode["is_healthy"]
        assert requests.get(fleet.router_url + "/readiness", timeout=5).status_code == 200
        assert "sim-router: serving at" in run.output and "one request answered" in run.output
        # The request went to one server of each side.
        answer = requests.post(fleet.router_url + "/generate", timeout=30, json={
            "text": "hello", "sampling_params": {"max_new_tokens": 4}})
        assert answer.status_code == 200 and answer.json()["meta_info"]["completion_tokens"] == 4
        again = fleet.deploy()
        assert again.rc == 0 and again.changed_hosts() == set(), again.output[-3000:]
    finally:
        fleet.stop()
        fleet.kill_leftovers()


def test_the_router_is_not_ready_while_its_deployment_lacks_a_ready_prefill(tmp_path, venv):
    fleet = make_pd_fleet(tmp_path, router=venv,
                          prefill_vars={"sglang_server_sim_fault": "crash:loading_weights"})
    try:
        run = fleet.deploy()
        assert run.rc != 0, run.output[-3000:]
        assert "sim-node-2: joined router sim-router" in run.output
        assert "sim-node-1: joined router" not in run.output
        workers = {w["url"].rstrip("/"): w["worker_type"]
                   for w in router_workers(fleet.router_url)}
        assert workers == {fleet.url("sim-node-2"): "decode"}
        ready = requests.get(fleet.router_url + "/readiness", timeout=5)
        assert ready.status_code == 503 and "insufficient healthy workers" in ready.text
    finally:
        fleet.stop()
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
    assert not fleet.root.exists(), "no node may be touched"


def test_a_prefill_whose_bootstrap_server_died_leaves_the_router_under_watch(tmp_path, venv):
    """The router health-checks only the prefill's HTTP port, which keeps answering 200: it
    would go on sending that prefill requests that every decode fails. The gate judges the
    prefill unhealthy and `watch` takes it out; the router is then not ready."""
    fleet = make_pd_fleet(tmp_path, router=venv,
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
        workers = {w["url"].rstrip("/"): w["worker_type"]
                   for w in router_workers(fleet.router_url)}
        assert workers == {fleet.url("sim-node-2"): "decode"}
        assert requests.get(fleet.router_url + "/readiness", timeout=5).status_code == 503
    finally:
        fleet.stop()
        fleet.kill_leftovers()
