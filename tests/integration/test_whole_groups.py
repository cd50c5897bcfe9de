"""A multi-node server is deployed, recovered and stopped whole: a run that holds only part of
its group (through --limit, a serial batch, a canary, or an inventory slice that lost a member)
is refused before any node is touched, naming the group, the nodes left out and the fix."""

from __future__ import annotations

import pytest

from sglang_fleet.testfleet.local import make_tp16_group, run_playbook

pytestmark = pytest.mark.integration


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_run_holding_part_of_a_group_is_refused_before_any_node_is_touched(tmp_path):
    fleet = make_tp16_group(tmp_path)
    try:
        limited = run_playbook("deploy.yml", fleet.inventory, fleet.extra, "--limit",
                               "sim-node-1")
        assert limited.rc == 2, limited.output[-3000:]
        assert ("this run holds sim-node-1 of the multi-node server tp16 but not sim-node-2 "
                "(left out by --limit, or by the inventory's slice)") in flat(limited.output)
        assert "Fix: include the whole group (--limit tp16, or add sim-node-2)" in \
            flat(limited.output)

        serial = run_playbook("deploy.yml", fleet.inventory,
                              {**fleet.extra, "sglang_fleet_serial": 1})
        assert serial.rc == 2, serial.output[-3000:]
        assert ("sglang_fleet_serial=1 puts the nodes of the multi-node server tp16 in "
                "different batches (sim-node-1 in batch 1, sim-node-2 in batch 2)") in \
            flat(serial.output)

        canary = run_playbook("deploy.yml", fleet.inventory,
                              {**fleet.extra, "sglang_fleet_canary": "sim-node-2"})
        assert canary.rc != 0, canary.output[-3000:]
        assert "sglang_fleet_canary names sim-node-2, a node of the multi-node server tp16" in \
            flat(canary.output)

        # An inventory slice holding one node of a group that declares two.
        sliced = run_playbook("deploy.yml", fleet.inventory,
                              {**fleet.extra, "sglang_server_group_nodes": 3})
        assert sliced.rc == 2, sliced.output[-3000:]
        assert "sglang_server_group_nodes=3: this inventory holds 2 of group tp16's nodes" in \
            flat(sliced.output)

        recover = run_playbook("playbooks/recover.yml", fleet.inventory, fleet.extra,
                               "--limit", "sim-node-1")
        assert recover.rc != 0, recover.output[-3000:]
        assert "this run holds sim-node-1 of the multi-node server tp16 but not sim-node-2" in \
            flat(recover.output)

        stop = run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra, "--limit",
                            "sim-node-2")
        assert stop.rc != 0, stop.output[-3000:]
        assert "this run holds sim-node-2 of the multi-node server tp16 but not sim-node-1" in \
            flat(stop.output)

        assert not fleet.root.exists(), "nothing may be written to a node"
    finally:
        fleet.kill_leftovers()
