"""Which tasks a test run's playbooks ran, how often, and how long each host spent in them:
read from the run folders the runs left (their events), so that the next cut goes where the
count is. A loop's items count one each (a fetch per file counted 20 per recovery).

    .venv/bin/pytest -o addopts= -q -p no:cacheprovider --basetemp=/tmp/suite-tasks \
        tests/integration/test_recover.py
    .venv/bin/python bench/suite_tasks.py /tmp/suite-tasks

The tests point SGLANG_FLEET_STATE_DIR at a folder under pytest's basetemp, which a fixed
--basetemp keeps after the run. A task's seconds are each host's time since that host's
previous event: the task itself plus any wait for the other hosts before it (a play's first
task on a router host counts the servers' play before it), so read them beside the counts.
"""

from __future__ import annotations

import argparse
import collections
from datetime import datetime
from pathlib import Path
from typing import Any

from sglang_fleet.record.build import read_events

RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_item_on_ok",
                 "runner_item_on_failed", "runner_on_unreachable")


def run_folders(root: Path) -> list[Path]:
    """Every run folder under `root` (a CLI run's runner artifacts or a plain run's events)."""
    found = {p.parent for p in root.glob("**/runs/*/run-meta.json")}
    found |= {p.parents[3] for p in root.glob("**/runs/*/runner/artifacts/*/job_events")}
    return sorted(found)


def tally(events: list[dict[str, Any]], counts: collections.Counter,
          seconds: collections.Counter) -> float:
    """Add the events' results to the counts and per-host seconds; the run's span."""
    timed = [(datetime.fromisoformat(e["created"]), e) for e in events if e.get("created")]
    last: dict[str, datetime] = {}
    for when, event in timed:
        data = event.get("event_data") or {}
        if event.get("event") not in RESULT_EVENTS:
            continue
        host, task = data.get("host"), data.get("task") or "?"
        counts[task] += 1
        if host in last and not event["event"].startswith("runner_item"):
            seconds[task] += (when - last[host]).total_seconds()
        if not event["event"].startswith("runner_item"):
            last[host] = when
    return (timed[-1][0] - timed[0][0]).total_seconds() if timed else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="pytest's --basetemp (or any folder of runs)")
    parser.add_argument("--top", type=int, default=30)
    ns = parser.parse_args()
    counts: collections.Counter = collections.Counter()
    seconds: collections.Counter = collections.Counter()
    spans: collections.Counter = collections.Counter()
    folders = run_folders(ns.root)
    for folder in folders:
        kind = folder.name.split("-", 1)[-1].rstrip("-0123456789") or folder.name
        spans[kind] += tally(read_events(folder), counts, seconds)
    print(f"{len(folders)} runs; seconds by command: "
          + ", ".join(f"{k} {v:.0f}" for k, v in spans.most_common()))
    print(f"\n{'results':>8} {'host s':>8}  task (the top {ns.top} by results)")
    for task, n in counts.most_common(ns.top):
        print(f"{n:8d} {seconds[task]:8.1f}  {task[:110]}")


if __name__ == "__main__":
    main()
