"""What sweep and bisect share: one trial's line, its runner, its JUnit case, the records of
an experiment, and the restore of the configuration that ran before."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sglang_fleet.bench import experiments
from sglang_fleet.bench.results import headline_tok_s
from sglang_fleet.cli.common import UsageError, _failure_text, check_inventory, say
from sglang_fleet.cli.inputs import parse_extra_vars
from sglang_fleet.runs.runner import (
    Interrupted,
)
from sglang_fleet.runs.summary import (
    EXIT_CODES,
    EXIT_HOSTS_FAILED,
    build_summary,
    junit_document,
    write_private,
)

# ---- sweep ---------------------------------------------------------------------------------

def _trial_line(index: int, total: int, trial: experiments.Trial) -> str:
    o = trial.outcome
    if trial.ready and o.benchmark:
        level = o.benchmark["benchmark"]["levels"][0]
        sim = " SIMULATED" if o.benchmark.get("simulated") else ""
        result = (f"ready, {headline_tok_s(o.benchmark):.1f}{sim} tok/s, "
                  f"TTFT {level['ttft_s']['median']:.3f} s")
    elif trial.ready:
        result = "ready"
    else:
        result = _failure_text(o)
        if o.evidence:
            result += f" (evidence {o.evidence})"
    return f"[{index}/{total}] {trial.name}: {result} [{trial.seconds:.0f} s]"


def _runner(args: argparse.Namespace, folder: Path, bench: dict[str, Any]
            ) -> experiments.TrialRunner:
    if not args.limit:
        raise UsageError("--limit is required: name the host (or the multi-node group) the "
                         "experiment deploys to; its server is replaced by each trial")
    check_inventory(args)
    return experiments.TrialRunner(args.inventory, args.limit, folder, folder.name, bench,
                                   parse_extra_vars(args.extra_vars))


def _trial_case(command: str, trial: experiments.Trial) -> tuple[str, str, str | None, str]:
    """A trial as a JUnit test case: failed when its server did not come up ready."""
    o = trial.outcome
    failure = None if trial.ready else (f"{_failure_text(o)}\nevidence: {o.evidence}\n"
                                        f"runner artifacts: {trial.artifacts}\n{o.message}")
    return f"sglang-fleet.{command}.{o.host}", trial.name, failure, _failure_text(o)


def write_experiment_records(folder: Path, command: str, started: float, code: int,
                             trials: list[experiments.Trial], last: experiments.Trial | None,
                             cases: list[tuple[str, str, str | None, str]] | None = None,
                             interrupted: Interrupted | None = None, **extra: Any) -> None:
    """summary.json and junit.xml in an experiment's run folder, as every command leaves
    them: the exit code and result, the hosts as the last deploy left them (the restore, or
    the last trial), and one JUnit test case per trial."""
    final = last.outcomes if last else {}
    summary = build_summary(command, last.rc if last else 0, final, started, time.time(),
                            folder, interrupted_by=interrupted.name if interrupted else None,
                            interrupted_exit=interrupted.exit_code if interrupted else None,
                            **extra)
    # The experiment's own verdict, not the hosts' alone (a sweep with a failed variant
    # that was recovered succeeded).
    summary["exit_code"] = interrupted.exit_code if interrupted else code
    summary["result"] = EXIT_CODES[summary["exit_code"]]
    summary["trials"] = [{"name": t.name, "verdict": _failure_text(t.outcome) if not t.ready
                          else "ready", "status": t.outcome.status,
                          "evidence": t.outcome.evidence, "artifacts": t.artifacts,
                          "seconds": round(t.seconds, 1)} for t in trials]
    all_cases = [_trial_case(command, t) for t in trials] + list(cases or [])
    write_private(folder / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_private(folder / "junit.xml", junit_document(
        f"sglang-fleet {command}", summary["seconds"], all_cases))


def _restore(args: argparse.Namespace, runner: experiments.TrialRunner,
             code: int) -> tuple[int, experiments.Trial | None]:
    if args.no_restore:
        say(f"--no-restore: {args.limit} keeps the last trial's configuration")
        return code, None
    say(f"restoring {args.limit} to the inventory's configuration ...")
    trial = runner.restore()
    if trial.ready:
        say(f"restored {args.limit} to the inventory's configuration: ready")
        return code, trial
    say(f"restoring {args.limit} to the inventory's configuration failed: "
        f"{_failure_text(trial.outcome)}; runner artifacts {trial.artifacts}")
    return EXIT_HOSTS_FAILED, trial


def _restore_cases(command: str, trial: experiments.Trial | None
                   ) -> list[tuple[str, str, str | None, str]]:
    return [_trial_case(command, trial)] if trial else []
