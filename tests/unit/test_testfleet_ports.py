"""The test fleet's ports: two pytest-xdist workers never promise the same port, and one
process never hands out a port twice (a block is promised long before its servers bind it)."""

from __future__ import annotations

from sglang_fleet.testfleet import local


def test_each_xdist_worker_draws_from_a_slice_of_its_own(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(set(local._port_range(10000, 32768)))
    assert all(len(s) > 7000 for s in slices)
    assert not slices[0] & slices[1] and not slices[1] & slices[2] and not slices[0] & slices[2]


def test_one_process_alone_draws_from_the_whole_range(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert local._port_range(10000, 32768) == range(10000, 32768)


def test_blocks_handed_out_by_one_process_never_overlap():
    # This process's own slice (under xdist, its worker's), as a test fleet draws them: a
    # block checked by binding in another worker's slice could meet that worker's bind.
    mine = local.own_ports()
    taken: set[int] = set()
    for _ in range(50):
        base = local.free_port_block(4)
        block = set(range(base, base + 4))
        assert not block & taken and block <= set(mine)
        taken |= block
