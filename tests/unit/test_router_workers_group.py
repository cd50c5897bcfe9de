"""A router's workers group (sglang_router_workers_group) must front servers: with several
models in one inventory each router names its own deployment's group, and a misspelt or
serverless group is refused with the router's settings, before any node is touched."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sglang_fleet.router.workers_group import workers_group_errors

GROUPS = {"all": ["n1", "n2", "r1", "r2"], "ungrouped": [],
          "sglang_servers": ["n1", "n2"], "kimi": ["n1"], "llama": ["n2"],
          "sglang_routers": ["r1", "r2"]}


def test_a_group_of_servers_is_accepted():
    for group in ("kimi", "llama", "sglang_servers", "all", None):
        assert workers_group_errors("r1", group, GROUPS) == []


def test_a_misspelt_group_is_refused_with_the_nearest_name():
    assert workers_group_errors("r2", "lama", GROUPS) == [
        "host r2: sglang_router_workers_group='lama': is not a group of this inventory: the "
        "router would front no server. Fix: did you mean 'llama'? Or set it to the group of "
        "the servers this router fronts, one of: kimi, llama, sglang_servers"]


def test_a_group_without_servers_is_refused():
    errors = workers_group_errors("r1", "sglang_routers", GROUPS)
    assert errors == [
        "host r1: sglang_router_workers_group='sglang_routers': holds no host of the "
        "sglang_servers group: the router would front no server. Fix: set it to the group of "
        "the servers this router fronts, one of: kimi, llama, sglang_servers"]


def test_an_inventory_without_servers_is_told_to_add_them():
    errors = workers_group_errors("r1", None, {"all": ["r1"], "sglang_routers": ["r1"]})
    assert errors == [
        "host r1: sglang_router_workers_group='sglang_servers': is not a group of this "
        "inventory: the router would front no server. Fix: add the servers this router fronts "
        "to the sglang_servers group"]


def test_the_router_spec_filter_adds_the_refusal_to_the_settings_refusals():
    path = Path(__file__).resolve().parents[2] / "plugins" / "filter" / "sglang_router.py"
    spec = importlib.util.spec_from_file_location("sglang_router_filter_workers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    router_spec = module.FilterModule().filters()["sglang_fleet_router_spec"]
    settings = {"sglang_router_workers_group": "lama", "sglang_router_port": 30000,
                "sglang_router_host": "127.0.0.1"}
    assert router_spec(settings, "r2", None)["ok"]  # without the groups: settings alone
    built = router_spec(settings, "r2", None, GROUPS)
    assert not built["ok"] and built["spec"] is None
    assert built["errors"] == workers_group_errors("r2", "lama", GROUPS)
