"""The suite's wall time on N xdist workers, modelled from tests/durations.json (each test's
recorded seconds): whole files handed out by test count (`--dist loadfile`, xdist's default
order) against the units of sglang_fleet.testfleet.schedule handed out longest first (a file
whose tests share a fleet is one unit, every other test its own).

    .venv/bin/python bench/suite_schedule.py [--workers 3] [--durations tests/durations.json]

A model: each unit goes to the worker that frees first, and a test takes its recorded time
whatever runs beside it. It shows what the order and the split do with the same tests; the
suite's measured times are in docs/testing.md. Which tests share a fleet is read from the
collection (pytest --collect-only), so run it from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import io
from pathlib import Path

import pytest

from sglang_fleet.testfleet import schedule

REPO = Path(__file__).resolve().parents[1]


def makespan(units: list[float], workers: int) -> float:
    """Greedy list scheduling: each unit, in order, to the worker that frees first."""
    free = [0.0] * workers
    for seconds in units:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free)


class _Units:
    """Reads each collected test's unit: the xdist_group tests/conftest.py marks, or itself."""

    def __init__(self) -> None:
        self.tests: list[tuple[str, str]] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            group = item.get_closest_marker("xdist_group")
            self.tests.append((item.nodeid, group.args[0] if group else item.nodeid))


def collected_units() -> list[tuple[str, str]]:
    """(nodeid, unit) for every test of the suite, in collection order."""
    units = _Units()
    with contextlib.redirect_stdout(io.StringIO()):
        pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                     str(REPO / "tests")], plugins=[units])
    return units.tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--durations", type=Path, default=REPO / "tests" / "durations.json")
    args = parser.parse_args()
    durations = schedule.read_durations(args.durations)
    expected = schedule.estimator(durations)
    tests = collected_units()
    files: dict[str, list[str]] = {}
    for nodeid, _ in tests:
        files.setdefault(schedule.file_of(nodeid), []).append(nodeid)
    by_count = sorted(files.values(), key=len, reverse=True)
    loadfile = makespan([sum(map(expected, ids)) for ids in by_count], args.workers)
    units: dict[str, float] = {}
    for i in schedule.longest_first(tests, durations):
        nodeid, unit = tests[i]
        units[unit] = units.get(unit, 0.0) + expected(nodeid)
    spread = makespan(list(units.values()), args.workers)
    total = sum(expected(nodeid) for nodeid, _ in tests)
    recorded = sum(1 for nodeid, _ in tests if nodeid in durations)
    print(f"MODELLED from {args.durations.name} ({recorded} of {len(tests)} tests recorded, "
          f"the others at their folder's median): {total:.0f} s of tests on "
          f"{args.workers} workers")
    print(f"  --dist loadfile, files by test count: {loadfile:7.0f} s")
    print(f"  units, longest first:                 {spread:7.0f} s "
          f"({loadfile / spread:.2f}x faster)")
    print(f"  lower bound (total / workers):        {total / args.workers:7.0f} s")


if __name__ == "__main__":
    main()
