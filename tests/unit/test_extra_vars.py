"""A mapping setting given with -e replaces the inventory's whole mapping (Ansible's extra
variables replace): the keys it drops are named, per host, with the whole mapping to pass."""

from __future__ import annotations

import json

from sglang_fleet.settings.extra_vars import dropped_keys, mapping_defaults, warnings

WINDOWS = "sglang_server_gate_stall_windows"
INVENTORY = {"n1": {WINDOWS: {"launching": 20, "loading_weights": 10, "warming_up": 15}},
             "n2": {WINDOWS: {"launching": 20, "loading_weights": 10, "warming_up": 15}},
             "n3": {}}


def test_the_mapping_settings_are_the_tables_dicts():
    assert {WINDOWS, "sglang_server_nccl_profile", "sglang_server_overrides"} <= set(
        mapping_defaults())
    assert "sglang_server_tp" not in mapping_defaults()


def test_the_keys_the_inventory_had_and_the_e_value_lacks_are_named_per_host():
    given = {WINDOWS: {"launching": 20}, "sglang_server_tp": 4}
    assert dropped_keys(given, INVENTORY) == {
        WINDOWS: {("loading_weights", "warming_up"): ["n1", "n2"]}}
    (line,) = warnings(given, INVENTORY)
    assert line.startswith(f"WARNING: -e {WINDOWS} replaces the whole mapping")
    assert "on n1, n2 it drops loading_weights: 10, warming_up: 15" in line
    fix = json.loads(line.split("-e '", 1)[1].rstrip("'"))
    assert fix == {WINDOWS: {"launching": 20, "loading_weights": 10, "warming_up": 15}}
    # The whole mapping, or a key added, drops nothing.
    assert warnings({WINDOWS: {**INVENTORY["n1"][WINDOWS], "starting_http": 5}}, INVENTORY) == []
    # A value that is not a mapping is the settings check's business, not this one's.
    assert warnings({WINDOWS: "x"}, INVENTORY) == []


def test_a_dropped_secret_is_named_but_never_shown():
    overrides = "sglang_server_overrides"
    inventory = {"n1": {overrides: {"sglang_server_api_key": "sk-0123456789abcdef",
                                    "sglang_server_tp": 8}}}
    (line,) = warnings({overrides: {"sglang_server_tp": 4}}, inventory)
    assert "sglang_server_api_key" in line and "sk-0123456789abcdef" not in line
