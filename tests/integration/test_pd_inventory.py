"""A prefill/decode deployment in the inventory: `check` refuses what a decode would find only at
its first request, before any node is touched; a consistent one deploys each side."""

from __future__ import annotations

import json

import pytest
import yaml

from sglang_fleet.testfleet.local import http_status, make_fleet, sglang_fleet

pytestmark = pytest.mark.integration


def make_pd_fleet(tmp_path, decode_vars: dict | None = None):
    """Two simulated servers: sim-node-1 the prefill, sim-node-2 the decode of group kimi_pd."""
    fleet = make_fleet(tmp_path, hosts=2)
    hosts = fleet.inventory / "hosts.yml"
    data = yaml.safe_load(hosts.read_text())
    data["all"]["children"]["sglang_servers"]["children"] = {"kimi_pd": {
        "vars": {"sglang_server_pd_deployment": "kimi_pd",
                 "sglang_server_disaggregation_transfer_backend": "nixl"},
        "children": {
            "kimi_prefill": {"hosts": {"sim-node-1": {}},
                             "vars": {"sglang_server_disaggregation_mode": "prefill",
                                      "sglang_server_disaggregation_bootstrap_port":
                                          fleet.base_port + 100}},
            "kimi_decode": {"hosts": {"sim-node-2": {}},
                            "vars": {"sglang_server_disaggregation_mode": "decode",
                                     **(decode_vars or {})}}}}}
    hosts.write_text(yaml.safe_dump(data))
    return fleet


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_pd_deployment_whose_sides_disagree_is_refused_before_any_node(tmp_path):
    fleet = make_pd_fleet(tmp_path, {"sglang_server_kv_cache_dtype": "fp8_e4m3",
                                     "sglang_server_disaggregation_transfer_backend": "mooncake"})
    check = sglang_fleet("check", "-i", str(fleet.inventory), "-e", json.dumps(fleet.extra))
    out = flat(check.stdout)
    assert check.returncode == 2, check.stdout[-3000:]
    assert ("PD deployment kimi_pd: its servers disagree on --kv-cache-dtype (auto on "
            "sim-node-1; fp8_e4m3 on sim-node-2)") in out, out[-3000:]
    assert "disagree on transfer backend (nixl on sim-node-1; mooncake on sim-node-2)" in out
    assert "Fix: set it once, in group_vars/kimi_pd" in out
    assert not fleet.root.exists(), "no node may be touched"


def test_a_consistent_pd_deployment_deploys_each_side_as_a_server(tmp_path):
    fleet = make_pd_fleet(tmp_path)
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]
        for host in fleet.hosts:
            assert f"{host}: ready at" in run.output
            assert http_status(fleet.url(host) + "/health") == 200
        script = (fleet.host_root("sim-node-1") / "conf" /
                  f"Kimi-K2.5-{fleet.port('sim-node-1')}.launch.sh").read_text()
        assert "--disaggregation-mode prefill" in script
        assert f"--disaggregation-bootstrap-port {fleet.base_port + 100}" in script
    finally:
        fleet.kill_leftovers()
