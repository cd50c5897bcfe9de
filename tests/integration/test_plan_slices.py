"""`sglang-fleet plan --slices N`: limits for runs side by side that keep every multi-node
group whole. The planned slices deploy at the same time, each its own ansible-playbook run;
a slice cut by hand through a group is refused by `check` before any node is touched."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_fleet.testfleet.local import (
    add_tp16_group,
    http_status,
    make_fleet,
    run_playbook,
    sglang_fleet,
)

pytestmark = pytest.mark.integration


def test_planned_slices_deploy_side_by_side_and_a_hand_cut_slice_is_refused(tmp_path):
    fleet = add_tp16_group(make_fleet(tmp_path, hosts=4), tmp_path)
    out = tmp_path / "slices"
    try:
        plan = sglang_fleet("plan", "--slices", "2", "-i", str(fleet.inventory),
                            "--out", str(out))
        assert plan.returncode == 0, plan.stdout
        assert "slice 1: 2 hosts, 16 GPUs, groups tp16" in plan.stdout, plan.stdout
        limits = sorted(out.glob("slice-*.limit"))
        held = [p.read_text().split() for p in limits]
        assert held == [["sim-node-1", "sim-node-2"], ["sim-node-3", "sim-node-4"]]
        assert not fleet.root.exists(), "planning touches no node"

        # A slice that cuts the group is refused before the run touches anything.
        cut = sglang_fleet("check", "-i", str(fleet.inventory), "--limit",
                           "sim-node-1,sim-node-3", "-e", json.dumps(fleet.extra))
        assert cut.returncode == 2, cut.stdout[-3000:]
        assert "holds sim-node-1 of the multi-node server tp16 but not sim-node-2" in \
            " ".join(cut.stdout.split())

        # The planned slices run at once, as parallel runner or AWX jobs would.
        with ThreadPoolExecutor(len(limits)) as pool:
            runs = list(pool.map(lambda p: run_playbook(
                "deploy.yml", fleet.inventory, fleet.extra, "--limit", f"@{p}"), limits))
        for run in runs:
            assert run.rc == 0, run.output[-3000:]
        assert {h for run in runs for h in run.recap} == set(fleet.hosts)
        for host in ("sim-node-1", "sim-node-3", "sim-node-4"):  # sim-node-2 is rank 1
            assert http_status(fleet.url(host) + "/health") == 200, host
    finally:
        fleet.kill_leftovers()
