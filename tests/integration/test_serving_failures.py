"""Failures after start-up and across nodes, as SGLang 0.5.23 has them, through the toolkit:
a multi-node group whose second node never started, a generation hang that SGLang's watchdog
ends, a stopped scheduler that hangs the endpoints that wait on it, and a queue that
overflows. Each is judged, recovered or ridden out by real playbook runs, as a user would."""

from __future__ import annotations

import re

import pytest

from sglang_fleet.testfleet.local import (
    FAST_GATE,
    make_tp16_group,
    run_playbook,
    wait_for,
)
from sglang_fleet_node import sglang_fleet_procs as procs

pytestmark = pytest.mark.integration


def words(text: str) -> str:
    return " ".join(text.split())  # Ansible's output folds long lines


# ---- a TP=16 group with one node not started --------------------------------------------------

def test_a_group_whose_second_node_never_started_is_never_ready(tmp_path):
    """Rank 0 waits at the rendezvous for ranks 8-15: the gate names them while it waits,
    calls the group stalled in launching, never ready, and crashed with torch's own store
    timeout once --dist-timeout has passed."""
    fleet = make_tp16_group(tmp_path)
    extra = {**fleet.extra, "sglang_server_extra_args": ["--dist-timeout", "30"],
             "sglang_server_gate_stall_windows": {
                 **FAST_GATE["sglang_server_gate_stall_windows"], "launching": 4},
             "sglang_server_gate_poll_interval": 1}
    try:
        run = run_playbook("deploy.yml", fleet.inventory, extra, "--limit", "sim-node-1")
        assert run.rc != 0, run.output[-3000:]
        out = words(run.output)
        waits = r"TP0-7 wait at the rendezvous on 127\.0\.0\.1:\d+ for TP8-15 \(node rank 1\)"
        assert re.search(r"progressing: launching: " + waits, out), out[-3000:]
        assert re.search(r"sim-node-1: stalled in launching: no progress for \d+ s \(window 4 "
                         r"s\); " + waits, out), out[-3000:]
        assert "a rank or node never joined: check that every node of the group started" in out
        assert "sim-node-1: ready" not in out
        log = fleet.log_file("sim-node-1")
        wait_for(lambda: not procs.deployment_processes(fleet.marker("sim-node-1")),
                 timeout=90, interval=0.5)
        assert "Load weight begin" not in log.read_text()
        health = run_playbook("playbooks/health.yml", fleet.inventory, extra,
                              "--limit", "sim-node-1")
        said = words(health.output)
        assert ("sim-node-1: crashed in launching: TP0: torch.distributed.DistStoreError: Timed "
                "out after 31 seconds waiting for clients. 8/16 clients joined.") in said, \
            said[-3000:]
        assert "sim-node-1: ready" not in said
    finally:
        run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
        fleet.kill_leftovers()


def test_the_groups_nodes_meet_and_the_group_is_ready(tmp_path):
    fleet = make_tp16_group(tmp_path)
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]
        text = fleet.log_file("sim-node-1").read_text()
        assert re.search(r" TP0\] Init parallel ends\. elapsed=", text)
        assert "sim-node-1: ready at" in run.output
    finally:
        run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
        fleet.kill_leftovers()
