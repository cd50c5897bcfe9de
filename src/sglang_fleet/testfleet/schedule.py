"""How the test suite spreads over pytest-xdist's workers (`--dist loadgroup
--no-loadscope-reorder`, wired in tests/conftest.py):

- The tests of a file that share a fixture wider than one test (a module's deployed fleet),
  directly or through another test, are one unit of work, run on one worker in the file's
  order: their fleet is deployed once. Every other test is a unit of its own, so the
  independent slow tests of a file (the PD deployments behind a router) spread over the
  workers instead of holding one for their whole length beside the tests of a shared fleet.
- Units are handed out longest first, by tests/durations.json (each test's seconds in the last
  recorded run; `pytest --record-durations` rewrites it). A test not recorded yet counts as the
  median of its folder's recorded tests. The long units then start early and the short ones
  fill the workers at the end, where one long unit started last would leave the others idle.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

# Fixture scopes that outlive a test: the tests using one run together on one worker.
SHARED_SCOPES = frozenset(("class", "module", "package"))
# What an unrecorded test counts as when its folder has no recorded test either (seconds).
FALLBACK = {"integration": 60.0, "reference": 5.0, "unit": 0.1}


def base_nodeid(nodeid: str) -> str:
    """A test's id without the `@group` xdist's loadgroup appends to it."""
    head, at, group = nodeid.rpartition("@")
    return head if at and "]" not in group and "::" not in group else nodeid


def file_of(nodeid: str) -> str:
    """The test file a test's id names (tests/x/test_y.py)."""
    return nodeid.split("::", 1)[0]


def shared_names(fixtures: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The names of the fixtures, of (name, scope) pairs, that outlive a test."""
    return frozenset(name for name, scope in fixtures if scope in SHARED_SCOPES)


def units_of(tests: Sequence[tuple[str, frozenset[str]]]) -> list[str]:
    """Each test's unit of work, from (nodeid, the shared fixtures it uses) in collection
    order: the tests of one file linked by shared fixtures (one fixture in common, or a chain
    of them) are one unit, named by the file and those fixtures; any other test is its own."""
    groups: list[tuple[str, frozenset[str], list[int]]] = []  # file, fixtures, tests
    for index, (nodeid, names) in enumerate(tests):
        if not names:
            continue
        file = file_of(nodeid)
        linked = [g for g in groups if g[0] == file and g[1] & names]
        merged = (file, names.union(*(g[1] for g in linked)),
                  [m for g in linked for m in g[2]] + [index])
        groups = [g for g in groups if g not in linked] + [merged]
    units = [nodeid for nodeid, _ in tests]
    for file, names, members in groups:
        for index in members:
            units[index] = f"{file}#{'+'.join(sorted(names))}"
    return units


def folder_of(nodeid: str) -> str:
    parts = file_of(nodeid).split("/")
    return parts[-2] if len(parts) > 1 else ""


def estimator(durations: dict[str, float]) -> Callable[[str], float]:
    """Each test's expected seconds: recorded, else its folder's median, else FALLBACK."""
    by_folder: dict[str, list[float]] = {}
    for nodeid, seconds in durations.items():
        by_folder.setdefault(folder_of(nodeid), []).append(seconds)
    medians = {folder: statistics.median(values) for folder, values in by_folder.items()}

    def expected(nodeid: str) -> float:
        if nodeid in durations:
            return durations[nodeid]
        folder = folder_of(nodeid)
        return medians.get(folder, FALLBACK.get(folder, 1.0))

    return expected


def longest_first(tests: list[tuple[str, str]], durations: dict[str, float]) -> list[int]:
    """The order to hand out `tests` ((nodeid, unit) in collection order): units by expected
    length, longest first; a unit's tests stay together in their own order. Returns indexes
    into `tests`."""
    expected = estimator(durations)
    units: dict[str, list[int]] = {}
    for index, (_, unit) in enumerate(tests):
        units.setdefault(unit, []).append(index)
    cost = {unit: sum(expected(tests[i][0]) for i in members)
            for unit, members in units.items()}
    # Ties keep collection order (sorted is stable).
    return [i for unit in sorted(units, key=lambda u: -cost[u]) for i in units[unit]]


def read_durations(path: Path) -> dict[str, float]:
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def write_durations(path: Path, measured: dict[str, float], root: Path) -> None:
    """Record this run's seconds per test over the last record (a partial run keeps what it
    did not run), dropping the tests of files that no longer exist under `root`."""
    record = read_durations(path) | measured
    record = {k: v for k, v in record.items() if (root / file_of(k)).is_file()}
    path.write_text(json.dumps({k: round(v, 2) for k, v in sorted(record.items())},
                               indent=0) + "\n")
