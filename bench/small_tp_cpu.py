"""What a test's server size costs: a PD deployment of 2 prefills and 2 decodes behind the
router (test_pd_router.py's fleet) deployed and stopped, at the inventory's TP=8 (A) against
testfleet's SMALL_TP (B), in alternating pairs, each trial under bench/suite_cpu.py (every
process it started counted, the simulated servers and the router included).

    .venv/bin/python bench/small_tp_cpu.py --pairs 3

Prints each trial's wall and CPU seconds, the schedulers' share, and the medians with A/B.
One deploy of each side runs first, unmeasured: it starts the release check's warm probe
(which outlives a run by design, and would hold suite_cpu.py for its idle minutes) and caches
both command lines' verdicts, as most of a test suite's deploys find them.
Simulated servers on a 2-core machine: the figures are the simulator's and the toolkit's cost,
not a real server's."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import suite_cpu  # bench/, beside this script


class Figures(NamedTuple):
    wall: float
    cpu: float
    schedulers: float


def trial(tp: int | None, folder: Path) -> None:
    """One deploy and stop of the PD fleet (run inside suite_cpu.py)."""
    from sglang_fleet.testfleet.local import make_pd_fleet
    from sglang_fleet.testfleet.router import router_venv

    fleet = make_pd_fleet(folder / "fleet", router=router_venv(folder.parent), tp=tp,
                          prefills=2, decodes=2)
    try:
        run = fleet.deploy()
        if run.rc != 0:
            sys.exit(f"deploy failed (rc {run.rc}):\n{run.output[-3000:]}")
    finally:
        fleet.stop()
        fleet.kill_leftovers()


def measure(tp: int | None, work: Path, index: int) -> Figures:
    """One trial in a process of its own, every process it starts counted by suite_cpu.py."""
    folder = work / f"trial-{index}"
    folder.mkdir()
    status, wall, cpu = suite_cpu.run([sys.executable, __file__, "--trial", str(tp or 0),
                                       str(folder)])
    if status != 0:
        sys.exit(f"the trial at TP={tp or 8} failed (exit {status}); its output is above")
    return Figures(wall, sum(cpu.values()), cpu["simulated server: scheduler"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--trial", nargs=2, metavar=("TP", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        tp = int(args.trial[0]) or None
        trial(tp, Path(args.trial[1]))
        return
    from sglang_fleet.known import refenv
    from sglang_fleet.testfleet.local import SMALL_TP
    from sglang_fleet.testfleet.router import router_venv

    sides = {"A (TP=8)": None, f"B (TP={SMALL_TP})": SMALL_TP}
    results: dict[str, list[Figures]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory(prefix="small-tp-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        router_venv(work)  # built once here (when not given), not inside the first trial
        for side, tp in enumerate(sides.values()):
            warm = work / f"warm-up-{side}"
            warm.mkdir()
            trial(tp, warm)
        try:
            run_pairs(sides, results, work, args.pairs)
        finally:
            refenv.stop_warm_probes()
    report(results, args.pairs)


def run_pairs(sides: dict[str, int | None], results: dict[str, list[Figures]], work: Path,
              pairs: int) -> None:
    for pair in range(pairs):
        for side, (name, tp) in enumerate(sides.items()):
            figures = measure(tp, work, 2 * pair + side)
            results[name].append(figures)
            print(f"pair {pair + 1} {name}: {figures.wall:.1f} s wall, {figures.cpu:.1f} CPU s "
                  f"(schedulers {figures.schedulers:.1f})", flush=True)


def report(results: dict[str, list[Figures]], pairs: int) -> None:
    medians = {name: Figures(*(statistics.median(column) for column in zip(*runs, strict=True)))
               for name, runs in results.items()}
    (a_name, a), (b_name, b) = medians.items()
    print(f"\nmedians of {pairs} pairs: PD 2 prefills + 2 decodes behind the router, "
          "deploy and stop (simulated servers)")
    print(f"  {'':12s} {'wall s':>8s} {'CPU s':>8s} {'schedulers':>11s}")
    for name, m in medians.items():
        print(f"  {name:12s} {m.wall:8.1f} {m.cpu:8.1f} {m.schedulers:11.1f}")
    print(f"  A/B CPU: {a.cpu / b.cpu:.2f}  ({a_name} over {b_name})")


if __name__ == "__main__":
    main()
