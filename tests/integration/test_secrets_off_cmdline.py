"""No secret of a running fleet is on any of its processes' command lines: the servers read their
API key and admin key from their 0600 `--config` file, the router its keys from its env file by
variable name. Every process of the fleet is found as the product finds it (the deployment's
marker), and its /proc/PID/cmdline, which every local user can read, holds no secret; requests
with the keys still work, and without them are refused.

The SSL key's password goes the same way (tests/unit/test_render.py::
test_every_secret_option_is_in_the_config_file_and_none_on_the_command_line renders it and
parses it back through the simulator's --config merge); the simulator serves no TLS, so it is
not deployed here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import requests
import yaml

from sglang_fleet.node.process.procs import deployment_processes
from sglang_fleet.testfleet.local import make_fleet
from sglang_fleet.testfleet.router import router_venv

pytestmark = pytest.mark.integration

API_KEY = "sk-cmdline-4f1e9a2b7c3d5e60"
ADMIN_KEY = "ak-cmdline-9b8a7c6d5e4f3a21"
ROUTER_KEY = "rk-cmdline-1a2b3c4d5e6f7a8b"
CONTROL_KEY = "cp-cmdline-8e1f2a3b4c5d6e7f"
SECRETS = (API_KEY, ADMIN_KEY, ROUTER_KEY, CONTROL_KEY)


@pytest.fixture
def keyed_fleet(tmp_path, tmp_path_factory):
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.005,
                       router=router_venv(tmp_path_factory.getbasetemp().parent))
    servers = fleet.inventory / "group_vars" / "sglang_servers.yml"
    data = yaml.safe_load(servers.read_text())
    data.update(sglang_server_api_key=API_KEY, sglang_server_admin_api_key=ADMIN_KEY)
    servers.write_text(yaml.safe_dump(data, sort_keys=False))
    routers = fleet.inventory / "group_vars" / "sglang_routers.yml"
    data = yaml.safe_load(routers.read_text()) or {}
    data.update(sglang_router_api_key=ROUTER_KEY, sglang_router_control_plane_api_keys=[
        {"id": "fleet", "name": "sglang-fleet", "role": "admin", "key": CONTROL_KEY}])
    routers.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]
        yield fleet
    finally:
        fleet.stop()
        fleet.kill_leftovers()


def fleet_processes(fleet) -> list[dict]:
    found = [p for host in fleet.hosts for p in fleet.processes(host)]
    return found + deployment_processes(fleet.router_marker())


def raw_cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_no_secret_of_the_running_fleet_is_on_any_command_line(keyed_fleet):
    fleet = keyed_fleet
    procs = fleet_processes(fleet)
    assert len(fleet.server_processes("sim-node-1")) >= 3, procs
    assert deployment_processes(fleet.router_marker()), "the router runs"
    for p in procs:
        cmdline = raw_cmdline(int(p["pid"]))
        for secret in SECRETS:
            assert secret.encode() not in cmdline, (p["pid"], cmdline[:300])
    # The server was started with its config file's path, and the file is its owner's alone.
    main = raw_cmdline(fleet.server_pid("sim-node-1")).split(b"\0")
    config = Path(main[main.index(b"--config") + 1].decode())
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and config.stat().st_uid == os.getuid()
    assert yaml.safe_load(config.read_text()) == {"api-key": API_KEY, "admin-api-key": ADMIN_KEY}
    assert b"--api-key" not in b" ".join(main) and b"--admin-api-key" not in b" ".join(main)


def test_requests_with_the_keys_still_work(keyed_fleet):
    fleet = keyed_fleet
    url = fleet.url("sim-node-1")
    assert requests.get(f"{url}/v1/models", timeout=10).status_code == 401
    ok = requests.get(f"{url}/v1/models", timeout=10,
                      headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200, ok.text
    routed = requests.post(f"{fleet.router_url}/v1/completions", timeout=60,
                           headers={"Authorization": f"Bearer {ROUTER_KEY}"},
                           json={"model": "Kimi-K2.5", "prompt": "hi", "max_tokens": 2})
    assert routed.status_code == 200, routed.text
