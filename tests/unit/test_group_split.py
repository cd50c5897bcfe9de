"""Whether a run holds each multi-node server whole: Ansible's own serial batches, the nodes a
--limit or a slice leaves out, a canary inside a group, and a group smaller than it says."""

from __future__ import annotations

import pytest

from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.runs.whole_groups import (
    CanaryError,
    canary_hosts,
    serial_batches,
    serial_with_routers,
    split_group_errors,
)
from sglang_fleet.testfleet.local import role_defaults

HOSTS = ["a1", "a2", "b1", "b2", "c"]


@pytest.mark.parametrize("serial,batches", [
    (None, [HOSTS]),
    ("100%", [HOSTS]),
    (2, [["a1", "a2"], ["b1", "b2"], ["c"]]),
    ("40%", [["a1", "a2"], ["b1", "b2"], ["c"]]),
    ([1, "60%"], [["a1"], ["a2", "b1", "b2"], ["c"]]),
    (0, [HOSTS]),
])
def test_serial_batches_are_cut_as_ansible_playbook_cuts_them(serial, batches):
    assert serial_batches(HOSTS, serial) == batches


def test_a_whole_group_passes_and_a_single_node_server_is_never_a_group():
    assert split_group_errors("a", ["a2", "a1"], HOSTS) == []
    assert split_group_errors("a", ["a1", "a2"], HOSTS, serial=2) == []
    assert split_group_errors("", [], ["c"]) == []
    assert split_group_errors("solo", ["c"], ["c"]) == []


def test_a_limit_that_leaves_out_a_member_names_it_and_the_fix():
    [error] = split_group_errors("a", ["a1", "a2"], ["a1", "c"])
    assert error.startswith("this run holds a1 of the multi-node server a but not a2")
    assert "Fix: include the whole group (--limit a, or add a2)" in error
    assert "sglang-fleet plan --slices N" in error


def test_a_serial_batch_that_splits_a_group_is_refused():
    [error] = split_group_errors("a", ["a1", "a2"], HOSTS, serial=[1, 4])
    assert error.startswith("sglang_fleet_serial=[1, 4] puts the nodes of the multi-node "
                            "server a in different batches (a1 in batch 1, a2 in batch 2)")
    # Another group, whole in its batch, passes.
    assert split_group_errors("b", ["b1", "b2"], HOSTS, serial=[1, 4]) == []


def test_a_canary_inside_a_group_is_refused():
    [error] = split_group_errors("a", ["a1", "a2"], ["a1"], canaries=["a1"])
    assert error.startswith("sglang_fleet_canary names a1, a node of the multi-node server a")
    # The deploy play runs without the canary: its batches leave it out (b1 and b2 together).
    assert split_group_errors("b", ["b1", "b2"], ["c", "b1", "b2"], serial=2,
                              canaries=["c"]) == []


def test_a_canary_is_a_host_hosts_or_a_share_of_the_runs_servers():
    servers = [f"n{i}" for i in range(1, 11)]
    assert canary_hosts("", servers) == [] and canary_hosts(None, servers) == []
    assert canary_hosts("n3", servers) == ["n3"]
    assert canary_hosts("n3, n5", servers) == ["n3", "n5"]
    assert canary_hosts("10%", servers) == ["n1"]
    assert canary_hosts("25%", servers) == ["n1", "n2", "n3"]  # 2.5 rounds up
    assert canary_hosts("1%", servers) == ["n1"]  # at least one
    for bad in ("abc%", "0%", "100%", "-5%"):
        with pytest.raises(CanaryError, match=r"sglang_fleet_canary=.* Fix: "):
            canary_hosts(bad, servers)
    with pytest.raises(CanaryError, match="no baseline would be left"):
        canary_hosts("60%", ["n1", "n2"])


def settings(**more):
    return {**role_defaults(), **more}


def test_a_group_smaller_than_it_declares_is_refused_naming_what_the_inventory_holds():
    """An inventory slice (AWX job slicing drops a group's other hosts from the group) holds
    one node of a group that has two: the LaunchSpec is refused, never built for one node."""
    built = build_launch_spec(settings(sglang_server_group="tp16", sglang_server_tp=16,
                                       sglang_server_group_nodes=2), "gpu-a01", ["gpu-a01"],
                              "10.0.0.1")
    assert not built["ok"]
    said = "sglang_server_group_nodes=2: this inventory holds 1 of group tp16's nodes (gpu-a01)"
    assert any(e.startswith("host gpu-a01: " + said) for e in built["errors"]), built["errors"]
    whole = build_launch_spec(settings(sglang_server_group="tp16", sglang_server_tp=16,
                                       sglang_server_group_nodes=2), "gpu-a01",
                              ["gpu-a01", "gpu-a02"], "10.0.0.1")
    assert whole["ok"], whole["errors"]


def test_a_node_count_without_a_group_contradicts_itself():
    built = build_launch_spec(settings(sglang_server_group_nodes=2), "gpu-a01")
    said = "sglang_server_group_nodes=2: a node count without a multi-node group"
    assert any(e.startswith("host gpu-a01: " + said) for e in built["errors"]), built["errors"]


def test_the_routers_join_the_first_batch_and_each_batch_keeps_its_servers():
    """deploy.yml's servers' play runs the routers first, in its first batch: the batches of
    servers are those sglang_fleet_serial gives, its percentages of the servers alone."""
    servers = ["s1", "s2", "s3", "s4"]

    def batches(serial, routers=("r1",)):
        return serial_batches([*routers, *servers],
                              serial_with_routers(serial, servers, len(routers)))

    assert batches(2) == [["r1", "s1", "s2"], ["s3", "s4"]]
    assert batches("25%") == [["r1", "s1"], ["s2"], ["s3"], ["s4"]]
    assert batches([1, "50%"]) == [["r1", "s1"], ["s2", "s3"], ["s4"]]
    assert batches(1, ("r1", "r2")) == [["r1", "r2", "s1"], ["s2"], ["s3"], ["s4"]]
    assert serial_with_routers("100%", servers, 1) == serial_with_routers(None, servers, 1) \
        == "100%"
    assert serial_with_routers(4, servers, 1) == "100%"
    # No router in the run: the play's serial as given.
    assert serial_with_routers(2, servers, 0) == 2
    assert batches(2, ()) == [["s1", "s2"], ["s3", "s4"]]


def test_no_batch_of_a_deploy_holds_a_whole_pd_side():
    """Prefills p1, p2 and decodes d1, d2 in one batch (no sglang_fleet_serial) would all
    restart at once: the batches are cut so that one server of each side serves meanwhile."""
    servers = ["p1", "p2", "d1", "d2"]
    sides = [{"p1", "p2"}, {"d1", "d2"}]

    def batches(serial, routers=("r1",), sides=sides):
        return serial_batches([*routers, *servers],
                              serial_with_routers(serial, servers, len(routers), sides))

    assert batches(None) == [["r1", "p1"], ["p2", "d1"], ["d2"]]
    assert batches(2) == [["r1", "p1"], ["p2"], ["d1"], ["d2"]]
    assert batches(1) == [["r1", "p1"], ["p2"], ["d1"], ["d2"]]
    assert batches(None, ()) == [["p1"], ["p2", "d1"], ["d2"]]
    # Sides the inventory lets go whole (none qualifies): one batch, as before.
    assert serial_with_routers(None, servers, 1, []) == "100%"
    assert serial_with_routers(None, servers, 0, []) is None
