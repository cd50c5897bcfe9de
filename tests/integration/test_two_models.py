"""Two models in one inventory (issue 42): two deployments, each an inventory group with its own
simulated server and its own real sglang-router (sglang_router_workers_group). An upgrade of
one deployment (`sglang-fleet deploy --limit <its group>`, SGLang 0.5.4.post3 -> 0.5.23) and
its rollback (`sglang-fleet rollback --limit <its group>`) restart that deployment's server
and change its router's worker, and leave the other deployment's processes (found by the
membership the product records: its marker and supervisor session), their start times, its
router's process and its router's worker list exactly as they were."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests

from sglang_fleet.node.process import procs
from sglang_fleet.testfleet.local import FAST_GATE, SimFleet, make_models_fleet, sglang_fleet
from sglang_fleet.testfleet.router import router_venv, router_workers

pytestmark = pytest.mark.integration

OLD, NEW = "0.5.4.post3", "0.5.23"
# Two models: Kimi-K2.5 at TP=8 (the simulated fleet's default) and Llama-3.1-8B-Instruct at
# TP=1, each pinned to the older release in its own group's vars.
MODELS = {
    "kimi": {"sglang_server_version": OLD},
    "llama": {"sglang_server_version": OLD,
              "sglang_server_served_model_name": "Llama-3.1-8B-Instruct",
              "sglang_server_model_path": "{{ sglang_server_root }}/models/Llama-3.1-8B-Instruct",
              "sglang_server_model_family": "MHA", "sglang_server_model_size_b": 8,
              "sglang_server_tp": 1, "sglang_server_gpu_count": 1,
              "sglang_server_sim_gpu_count": 1},
}
SERVER = {"kimi": "sim-node-1", "llama": "sim-node-2"}
# sglang-router's log line for each request it receives.
REQUEST = re.compile(r"http_request\{method=(\w+) uri=(\S+) .*started processing request")


@pytest.fixture
def fleet(tmp_path):
    venv = router_venv(tmp_path.parent)
    fleet = make_models_fleet(tmp_path / "fleet", MODELS, venv, time_factor=0.005)
    yield fleet
    # By their markers, as the product's stop finds them (stop.yml over four hosts takes longer).
    fleet.kill_leftovers()


def members(fleet: SimFleet, host: str) -> set[tuple[int, int]]:
    """The server's processes as (pid, start time), found as the product finds them: its
    deployment marker and the supervisor session its state file records."""
    state = json.loads((fleet.host_root(host) / "run" / f"{fleet.deployment(host)}.pid")
                       .read_text())
    return {(p["pid"], p["start_ticks"]) for p in
            procs.deployment_processes(fleet.marker(host), **procs.recorded_session(state))}


def router_members(fleet: SimFleet, router: str) -> set[tuple[int, int]]:
    marker = f"{router}:sglang-router-{fleet.router_ports[router]}"
    return {(p["pid"], p["start_ticks"]) for p in procs.deployment_processes(marker)}


def requests_to(fleet: SimFleet, router: str) -> list[tuple[str, str]]:
    """Every HTTP request the router received, (method, path), as its own log lists them."""
    log = fleet.root / router / "logs" / f"sglang-router-{fleet.router_ports[router]}.log"
    return REQUEST.findall(log.read_text())


def snapshot(fleet: SimFleet, model: str) -> dict:
    router = f"router-{model}"
    host = SERVER[model]
    # The router's requests are read before this snapshot's own GET /workers.
    return {"requests": requests_to(fleet, router),
            "server": members(fleet, host), "router": router_members(fleet, router),
            "workers": router_workers(fleet.routed_at(router)),
            "version": requests.get(fleet.url(host) + "/server_info", timeout=10)
            .json()["version"]}


def worker_view(snap: dict) -> list[tuple[str, str, bool]]:
    return [(w["id"], w["url"].rstrip("/"), bool(w["is_healthy"])) for w in snap["workers"]]


def run(fleet: SimFleet, tmp_path: Path, name: str, *args: str) -> str:
    done = sglang_fleet(*args, "-i", str(fleet.inventory),
                        "-e", json.dumps(fleet.with_stores(**FAST_GATE)),
                        "--run-dir", str(tmp_path / name))
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def assert_moved(before: dict, after: dict, fleet: SimFleet, model: str, version: str) -> None:
    """The deployment restarted: none of its processes is the one before, its router (the same
    process) lists its one server again, healthy, as a new worker."""
    assert after["server"] and not after["server"] & before["server"]
    assert after["router"] == before["router"]
    assert [(url, healthy) for _, url, healthy in worker_view(after)] == \
        [(fleet.url(SERVER[model]), True)]
    assert worker_view(after) != worker_view(before)
    assert after["version"] == version


def assert_untouched(before: dict, after: dict) -> None:
    """The same processes (PIDs and start times), server and router, the same worker list and
    release, and the router asked nothing but the test's own read of its workers."""
    rest = [k for k in before if k != "requests"]
    assert {k: after[k] for k in rest} == {k: before[k] for k in rest}
    assert after["requests"] == before["requests"] + [("GET", "/workers")]


def test_an_upgrade_and_rollback_of_one_model_leave_the_other_untouched(fleet, tmp_path):
    run(fleet, tmp_path, "both", "deploy")
    kimi, llama = snapshot(fleet, "kimi"), snapshot(fleet, "llama")
    # Each router fronts its own deployment's server, and only it.
    for model, snap in (("kimi", kimi), ("llama", llama)):
        assert [(url, healthy) for _, url, healthy in worker_view(snap)] == \
            [(fleet.url(SERVER[model]), True)]
        assert snap["version"] == OLD and snap["server"] and snap["router"]

    fleet.update_group_vars("llama", {"sglang_server_version": NEW})
    run(fleet, tmp_path, "upgrade", "deploy", "--limit", "llama")
    upgraded = snapshot(fleet, "llama")
    assert_moved(llama, upgraded, fleet, "llama", NEW)
    kimi_now = snapshot(fleet, "kimi")
    assert_untouched(kimi, kimi_now)

    out = run(fleet, tmp_path, "rollback", "rollback", "--limit", "llama")
    assert "rolled back: configuration" in " ".join(out.split())
    assert "sglang_server_version differs" in " ".join(out.split())
    assert_moved(upgraded, snapshot(fleet, "llama"), fleet, "llama", OLD)
    assert_untouched(kimi_now, snapshot(fleet, "kimi"))
    # The ledger rejects the upgrade for the llama deployment's server only.
    ledger = [json.loads(x) for x in
              Path(fleet.extra["sglang_fleet_ledger"]).read_text().splitlines()]
    assert {e["host"] for e in ledger if e["kind"] == "rejected"} == {"sim-node-2"}


def test_a_router_whose_workers_group_is_misspelt_is_refused_before_any_node(tmp_path):
    fleet = make_models_fleet(tmp_path / "fleet", MODELS, router_venv(tmp_path.parent))
    fleet.set_host_vars("router-llama", {"sglang_router_workers_group": "lama"})
    refused = sglang_fleet("check", "-i", str(fleet.inventory), "-e", json.dumps(fleet.extra))
    assert refused.returncode == 2, refused.stdout
    assert ("sglang_router_workers_group='lama': is not a group of this inventory: the router "
            "would front no server. Fix: did you mean 'llama'?") in refused.stdout
    assert not fleet.root.exists()
