"""How the test suite spreads over pytest-xdist's workers (`--dist loadgroup
--no-loadscope-reorder`, wired in tests/conftest.py):

- A test file whose tests share a fixture wider than one test (a module's deployed fleet) is
  one unit of work, run on one worker in the file's order: its fleet is deployed once. Every
  other test is a unit of its own, so a file of independent slow tests (the PD deployments
  behind a router) spreads over the workers instead of holding one for its whole length.
- Units are handed out longest first, by tests/durations.json (each test's seconds in the last
  recorded run; `pytest --record-durations` rewrites it). A test not recorded yet counts as the
  median of its folder's recorded tests. The long units then start early and the short ones
  fill the workers at the end, where one long unit started last would leave the others idle.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable
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


def shares_fixtures(scopes: Iterable[str]) -> bool:
    return any(scope in SHARED_SCOPES for scope in scopes)


def unit_of(nodeid: str, scopes: Iterable[str]) -> str:
    """The unit of work a test belongs to: its file when it shares a wider fixture, else the
    test alone."""
    return file_of(nodeid) if shares_fixtures(scopes) else nodeid


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
