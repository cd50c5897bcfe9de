"""`-e` of one key of a mapping setting replaces the inventory's whole mapping (Ansible's extra
variables replace a variable whole): the CLI names what it drops, on which hosts, and the
whole mapping to pass instead, before the run."""

from __future__ import annotations

import json
import subprocess

import pytest

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet

pytestmark = pytest.mark.integration


def check(fleet, *more):
    return subprocess.run(
        [str(BIN / "sglang-fleet"), "check", "-i", str(fleet.inventory), *more],
        cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300)


def test_an_e_of_one_window_names_the_windows_it_drops(tmp_path):
    fleet = make_fleet(tmp_path, hosts=2)
    fleet.set_host_vars("sim-node-2", {"sglang_server_gate_stall_windows": {"launching": 20,
                                                                            "warming_up": 40}})
    one = json.dumps({"sglang_server_gate_stall_windows": {"launching": 20}})
    proc = check(fleet, "-e", one, "-e", json.dumps(fleet.extra))
    assert proc.returncode == 0, proc.stdout[-3000:]
    text = " ".join(proc.stdout.split())
    # The local inventory sets six windows for the group; sim-node-2 its own two.
    assert ("WARNING: -e sglang_server_gate_stall_windows replaces the whole mapping, it does "
            "not merge into it (Ansible's extra variables replace a variable): on sim-node-1 "
            "it drops loading_weights: 10, allocating_kv_cache: 10, capturing_cuda_graph: 15, "
            "starting_http: 10, warming_up: 15, which fall back to the role's defaults.") in text
    assert "on sim-node-2 it drops warming_up: 40" in text
    assert ("Fix: pass the whole mapping, -e '{\"sglang_server_gate_stall_windows\": "
            "{\"launching\": 20, \"warming_up\": 40}}'") in text
    # --limit: only the hosts of the run.
    limited = check(fleet, "-e", one, "-e", json.dumps(fleet.extra), "--limit", "sim-node-2")
    assert "sim-node-1" not in limited.stdout and "drops warming_up: 40" in limited.stdout
    # The whole mapping: no warning.
    whole = json.dumps({"sglang_server_gate_stall_windows": {"launching": 20, "warming_up": 40}})
    quiet = check(fleet, "-e", whole, "-e", json.dumps(fleet.extra), "--limit", "sim-node-2")
    assert quiet.returncode == 0 and "WARNING: -e" not in quiet.stdout, quiet.stdout[-2000:]
