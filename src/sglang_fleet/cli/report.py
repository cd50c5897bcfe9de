"""`sglang-fleet report`: a run's page (its path; rebuilt from the run's files when it is
missing, or asked), the list of runs with their results, pruning by a keep count."""

from __future__ import annotations

import argparse

from sglang_fleet.cli.common import UsageError, say
from sglang_fleet.record.history import (
    find_run,
    prune_runs,
    run_folders,
    run_line,
    runs_root,
    write_run_record,
)
from sglang_fleet.runs.reasons import counted
from sglang_fleet.runs.summary import EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """A run's page: its path, rebuilt from the run's files when it has none (a run killed
    midway) or when asked; the list of runs with their results; pruning by a keep count."""
    root = runs_root()
    if args.list:
        folders = run_folders(root)
        for folder in folders:
            say(run_line(folder))
        if not folders:
            say(f"no run in {root}")
        return EXIT_OK
    if args.keep is not None:
        removed = prune_runs(root, max(args.keep, 1))
        say(f"removed {counted(len(removed), 'run')} from {root}; each deployment's last good "
            f"run is kept")
        return EXIT_OK
    folder = find_run(args.run, root)
    if folder is None:
        raise UsageError(f"no run {args.run or ''} in {root}: see `sglang-fleet report --list`"
                         .replace("  ", " "))
    page = folder / "run.html"
    if args.rebuild or not page.exists():
        page = write_run_record(folder)
    say(str(page))
    return EXIT_OK
