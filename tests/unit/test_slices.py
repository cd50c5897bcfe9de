"""The slice planner: every multi-node group whole in one slice, every host in exactly one,
the GPUs balanced; bad counts refused with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_fleet.runs.slices import (
    ServerHost,
    SliceError,
    plan_lines,
    plan_slices,
    read_server_hosts,
    write_limit_files,
)
from sglang_fleet.runs.whole_groups import split_group_errors

SLICED64 = Path(__file__).parents[1] / "fixtures" / "inventories" / "sliced64"


@pytest.fixture(scope="module")
def fleet64():
    return read_server_hosts(str(SLICED64))


def test_the_inventory_is_read_with_its_groups_and_gpus(fleet64):
    servers, routers = fleet64
    assert len(servers) == 64 and routers == ["router-1"]
    by_name = {s.name: s for s in servers}
    assert by_name["gpu-001"].group == "dsv3_a" and by_name["gpu-001"].gpus == 8
    assert by_name["gpu-064"].group is None and by_name["gpu-064"].gpus == 4


def test_four_slices_of_64_hosts_keep_the_four_tp16_groups_whole_and_balance_gpus(fleet64):
    servers, _ = fleet64
    slices = plan_slices(servers, 4)
    hosts = [h for s in slices for h in s.hosts]
    assert sorted(hosts) == sorted(s.name for s in servers)  # each host once
    members: dict[str, list[str]] = {}
    for s in servers:
        if s.group:
            members.setdefault(s.group, []).append(s.name)
    for s in slices:
        for group, nodes in members.items():
            # No slice holds part of a group: the deploy's own check agrees.
            assert split_group_errors(group, nodes, s.hosts) == [] or \
                not set(nodes) & set(s.hosts)
    assert sorted(g for s in slices for g in s.groups) == ["dsv3_a", "dsv3_b", "dsv3_c",
                                                           "dsv3_d"]
    assert [s.gpus for s in slices] == [120, 120, 120, 120]


def test_a_hand_cut_slice_is_what_the_deploy_refuses(fleet64):
    servers, _ = fleet64
    every_16th = [s.name for s in servers][::16]  # as AWX job slicing would cut it
    errors = split_group_errors("dsv3_a", ["gpu-001", "gpu-002"], every_16th)
    assert errors and "not gpu-002" in errors[0]


def test_uneven_units_go_largest_first_to_the_lightest_slice():
    hosts = [ServerHost("a1", "big", 8), ServerHost("a2", "big", 8), ServerHost("a3", "big", 8),
             ServerHost("b", None, 8), ServerHost("c", None, 4), ServerHost("d", None, 4),
             ServerHost("e", "lonely", 8)]  # a group of one node is a single-node server
    slices = plan_slices(hosts, 2)
    assert [s.hosts for s in slices] == [["a1", "a2", "a3"], ["b", "e", "c", "d"]]
    assert [s.gpus for s in slices] == [24, 24]
    assert slices[0].groups == ["big"] and slices[1].groups == []


@pytest.mark.parametrize(("count", "words"), [
    (0, "--slices 0: a plan needs at least one slice. Fix: --slices 1 or more"),
    (3, "--slices 3: the fleet's 3 hosts make 2 units to share (multi-node groups, "
        "single-node hosts), so some slices would be empty. Fix: --slices 2 or fewer"),
])
def test_a_count_the_fleet_cannot_fill_is_refused_with_the_fix(count, words):
    hosts = [ServerHost("a1", "g", 8), ServerHost("a2", "g", 8), ServerHost("b", None, 8)]
    with pytest.raises(SliceError) as refused:
        plan_slices(hosts, count)
    assert str(refused.value) == words


def test_a_gpu_count_that_is_not_a_number_names_the_host_and_variable(tmp_path):
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    sglang_servers:\n      hosts:\n        n1:\n"
        "          sglang_server_gpu_count: eight\n")
    with pytest.raises(SliceError, match="n1: sglang_server_gpu_count='eight' is not a whole"):
        read_server_hosts(str(tmp_path))


def test_limit_files_hold_a_host_per_line_and_the_lines_name_them(tmp_path):
    slices = plan_slices([ServerHost("a1", "g", 8), ServerHost("a2", "g", 8),
                          ServerHost("b", None, 8)], 2)
    paths = write_limit_files(slices, tmp_path / "out")
    assert [p.read_text() for p in paths] == ["a1\na2\n", "b\n"]
    assert not list((tmp_path / "out").glob("*.tmp"))
    lines = plan_lines(slices, ["r1"], tmp_path / "out")
    assert lines[0] == "routers first, in one run: --limit sglang_routers (r1)"
    assert lines[1] == f"slice 1: 2 hosts, 16 GPUs, groups g: --limit @{paths[0]}"
    assert plan_lines(slices, [], None)[1] == "slice 2: 1 host, 8 GPUs: --limit b"
