"""Each test's CPU seconds, as `pytest --cpu-by-file` prints them: the test's own process and
the programs it ran and waited for (ansible-playbook, its forked workers and module runs, the
CLI), measured in the worker that ran it. The simulated servers leave the process tree that
started them, so their CPU is not in it (bench/acct_cpu.py counts every process).

CPU seconds stretch less than wall seconds with the machine's load, so the table says where
the suite's work is and which test to make cheaper; two whole runs on one machine still differ
file by file (docs/testing.md), so a cut is shown side by side."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable

from sglang_fleet.testfleet.schedule import file_of

PROPERTY = "cpu_s"


def cpu_now() -> float:
    """This process's CPU seconds and those of its waited-for descendants."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def by_file(per_test: dict[str, float]) -> Counter[str]:
    files: Counter[str] = Counter()
    for nodeid, seconds in per_test.items():
        files[file_of(nodeid)] += seconds
    return files


def table(per_test: dict[str, float], top: int) -> Iterable[str]:
    """The files, then the tests, that took the most CPU, each with its share of the run's."""
    total = sum(per_test.values()) or 1.0
    yield f"CPU seconds (tests and the programs they waited for): {total:.0f} in all"
    for title, rows in (("files", by_file(per_test)), ("tests", Counter(per_test))):
        yield f"the {top} {title} that took the most:"
        for name, seconds in rows.most_common(top):
            yield f"{seconds:9.1f} s {100 * seconds / total:5.1f}%  {name}"
