"""`sglang-fleet sweep`: deploy, gate and benchmark a baseline and variants that each change
one variable."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sglang_fleet.bench import experiments
from sglang_fleet.bench.report import config_row, markdown_table, write_report
from sglang_fleet.bench.results import headline_tok_s
from sglang_fleet.cli.common import _failure_text, bench_extravars, run_folder, say
from sglang_fleet.cli.trials import (
    _restore,
    _restore_cases,
    _runner,
    _trial_line,
    write_experiment_records,
)
from sglang_fleet.runs.reasons import counted
from sglang_fleet.runs.runner import (
    Interrupted,
)
from sglang_fleet.runs.summary import (
    EXIT_CODES,
    EXIT_HOSTS_FAILED,
    EXIT_OK,
)


def cmd_sweep(args: argparse.Namespace) -> int:
    plan = experiments.load_sweep(args.plan, allow_multiple=args.allow_multiple)
    folder = run_folder(args, "sweep")
    bench = dict(plan.bench)
    bench.update(bench_extravars(args))
    runner = _runner(args, folder, bench)
    steps = [("baseline", {}, [])] + [(v.name, v.settings, v.allow_rules) for v in plan.variants]
    say(f"sweep {args.plan} on {args.limit}: baseline and "
        f"{counted(len(plan.variants), 'variant')}, one trial each; run folder {folder}")
    started = time.time()
    trials: list[tuple[experiments.Trial, dict[str, Any]]] = []
    try:
        for i, (name, changes, allow) in enumerate(steps, 1):
            say(f"[{i}/{len(steps)}] {name}: deploying ...")
            trial = runner.run(name, {**plan.baseline, **changes}, plan.allow_rules + allow)
            trials.append((trial, changes))
            say(_trial_line(i, len(steps), trial))
    except Interrupted as exc:
        write_experiment_records(folder, "sweep", started, exc.exit_code,
                                 [t for t, _ in trials], trials[-1][0] if trials else None,
                                 interrupted=exc, plan=args.plan, limit=args.limit)
        raise
    base = headline_tok_s(trials[0][0].outcome.benchmark) if trials[0][0].ready and \
        trials[0][0].outcome.benchmark else None
    rows = [config_row(t.name, changes, "ready" if t.ready else _failure_text(t.outcome),
                       t.outcome.benchmark if t.ready else None, base, t.outcome.evidence,
                       t.outcome.host, (t.outcome.recovery or {}).get("config_hash") or "")
            for t, changes in trials]
    title = plan.description or f"Sweep {Path(args.plan).name}"
    write_report(rows, folder, "sweep", title, subject=f"sweep {Path(args.plan).name} on "
                                                      f"{args.limit}")
    (folder / "sweep.json").write_text(json.dumps(
        {"plan": args.plan, "baseline": plan.baseline, "limit": args.limit, "rows": rows,
         "trials": [{"name": t.name, "settings": t.settings, "verdict": t.outcome.verdict,
                     "status": t.outcome.status, "evidence": t.outcome.evidence,
                     "artifacts": t.artifacts, "seconds": round(t.seconds, 1)}
                    for t, _ in trials]}, indent=2, default=str) + "\n")
    say()
    say(markdown_table(rows, any(r["simulated"] for r in rows), title))
    code = EXIT_OK
    if base is None:
        say("the baseline did not come up ready: deltas are missing")
        code = EXIT_HOSTS_FAILED
    if any(not t.ready and not t.outcome.recovery for t, _ in trials):
        say("a failed trial was not recovered: check its host before using it")
        code = EXIT_HOSTS_FAILED
    code, restored = _restore(args, runner, code)
    write_experiment_records(folder, "sweep", started, code, [t for t, _ in trials],
                             restored or trials[-1][0], _restore_cases("sweep", restored),
                             plan=args.plan, limit=args.limit)
    say(f"result: {EXIT_CODES[code]} (exit {code}); summary {folder / 'summary.json'}, JUnit "
        f"{folder / 'junit.xml'}; report {folder}/sweep.md, sweep.png, sweep.json")
    return code
