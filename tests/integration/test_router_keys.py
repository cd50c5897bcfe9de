"""The router's keys cannot vanish: a router that last started with a key whose variable now
resolves to nothing is refused, not restarted open, unless sglang_router_drop_secrets says so.
And watch cuts a failed server out of its router even when the inventory no longer builds."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
import requests
import yaml

from sglang_fleet.testfleet.local import (
    BIN,
    REPO,
    ansible_env,
    make_fleet,
    run_playbook,
    wait_for,
)
from sglang_fleet.testfleet.router import registered, router_venv

pytestmark = pytest.mark.integration

ROUTER_KEY = "rk-vanish-3d9f1a7c5e2b8d40"
ADMIN_KEY = "cp-vanish-8e1f2a3b4c5d6e7f"


@pytest.fixture
def routed(tmp_path, tmp_path_factory):
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.005,
                       router=router_venv(tmp_path_factory.getbasetemp().parent))
    path = fleet.inventory / "group_vars" / "sglang_routers.yml"
    data = yaml.safe_load(path.read_text()) or {}
    data.update(sglang_router_api_key=ROUTER_KEY, sglang_router_control_plane_api_keys=[
        {"id": "fleet", "name": "sglang-fleet", "role": "admin", "key": ADMIN_KEY}])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        first = fleet.deploy()
        assert first.rc == 0, first.output[-3000:]
        yield fleet
    finally:
        fleet.stop()
        fleet.kill_leftovers()


def router_pid(fleet) -> int:
    port = fleet.extra["sglang_fleet_router_port"]
    return json.loads((fleet.router_root / "run" / f"sglang-router-{port}.pid").read_text())["pid"]


def test_a_router_key_that_resolves_to_nothing_never_restarts_the_router_open(routed, tmp_path):
    pid = router_pid(routed)
    run = run_playbook("playbooks/router.yml", routed.inventory,
                       {**routed.extra, "sglang_router_api_key": ""})
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert ("sglang_router_api_key resolves to nothing, but the router last started with it "
            "(config ") in text, run.output[-3000:]
    assert "sglang_router_drop_secrets: [sglang_router_api_key]" in text
    assert ROUTER_KEY not in run.output
    assert router_pid(routed) == pid, "the router keeps running with its key"
    assert requests.post(routed.router_url + "/v1/chat/completions", json={},
                         timeout=10).status_code == 401
    # Dropped on purpose: the router restarts without it.
    dropped = run_playbook("playbooks/router.yml", routed.inventory, {
        **routed.extra, "sglang_router_api_key": "",
        "sglang_router_drop_secrets": ["sglang_router_api_key"]})
    assert dropped.rc == 0, dropped.output[-3000:]
    assert router_pid(routed) != pid

    # watch cuts a crashed server out of its router although the inventory no longer builds.
    host = routed.hosts[0]
    wait_for(lambda: registered(routed.router_url, ADMIN_KEY).get(routed.url(host)), timeout=60)
    os.kill(routed.main_pid(host), signal.SIGKILL)
    # The inventory as a broken vault leaves it: the server's key one character long.
    path = routed.inventory / "group_vars" / "sglang_routers.yml"
    data = yaml.safe_load(path.read_text())
    data.update(sglang_router_api_key="", sglang_router_drop_secrets=["sglang_router_api_key"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    routed.set_host_vars(host, {"sglang_server_api_key": "x"})
    watch = subprocess.run(
        [str(BIN / "sglang-fleet"), "watch", "-i", str(routed.inventory), "--count", "1",
         "--run-dir", str(tmp_path / "watch"), "-e", json.dumps(routed.extra)],
        cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=600)
    assert f"{host} crashed" in watch.stdout and "removed it" in watch.stdout, \
        watch.stdout[-3000:]
    assert routed.url(host) not in registered(routed.router_url, ADMIN_KEY)


def test_a_broken_router_secret_never_keeps_the_fleet_running(routed):
    """A stop needs only identities: with the router's keys too short in the inventory, the
    server still leaves the router (with the admin key the router was started with, read on
    its host) and stops; with them unset, the router stops too."""
    from sglang_fleet.node.process.procs import deployment_processes

    host = routed.hosts[0]
    wait_for(lambda: registered(routed.router_url, ADMIN_KEY).get(routed.url(host)), timeout=60)
    short = {**routed.extra, "sglang_router_api_key": "short",
             "sglang_router_control_plane_api_keys": [
                 {"id": "fleet", "name": "sglang-fleet", "role": "admin", "key": "short"}]}
    run = run_playbook("playbooks/stop.yml", routed.inventory, short, "--limit", host)
    assert run.rc == 0, run.output[-3000:]
    text = " ".join(run.output.split())
    assert "router sim-router's settings are refused" in text and "too short" in text, text
    assert "leaving it with the admin key it was started with" in text
    assert "could not be changed" not in text
    assert routed.url(host) not in registered(routed.router_url, ADMIN_KEY), "it left the router"
    wait_for(lambda: routed.processes(host) == [], timeout=60)
    assert deployment_processes(routed.router_marker()), "the router was not asked to stop"
    assert ADMIN_KEY not in run.output and ROUTER_KEY not in run.output

    unset = {**routed.extra, "sglang_router_api_key": "",
             "sglang_router_control_plane_api_keys": [], "sglang_router_host": "0.0.0.0"}
    run = run_playbook("playbooks/stop.yml", routed.inventory, unset)
    assert run.rc == 0, run.output[-3000:]
    assert "stopping by the router's identity" in " ".join(run.output.split())
    wait_for(lambda: deployment_processes(routed.router_marker()) == [], timeout=60)
