"""`sglang-fleet bisect`: find the variables that make a configuration fail."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import yaml

from sglang_fleet.bench import experiments
from sglang_fleet.bench.bisect import find_culprit
from sglang_fleet.cli.common import UsageError, _failure_text, run_folder, say
from sglang_fleet.cli.trials import (
    _restore,
    _restore_cases,
    _runner,
    _trial_line,
    write_experiment_records,
)
from sglang_fleet.known.rules import matching_rules
from sglang_fleet.launch.spec import FACT_OF_SETTING
from sglang_fleet.runs.reasons import counted
from sglang_fleet.runs.runner import (
    Interrupted,
)
from sglang_fleet.runs.summary import (
    EXIT_CODES,
    EXIT_HOSTS_FAILED,
    EXIT_OK,
)

# ---- bisect --------------------------------------------------------------------------------

def proposed_rule(run_id: str, host: str, culprit: tuple[str, ...], good: dict[str, Any],
                  recovery: dict[str, Any] | None) -> dict[str, Any]:
    """A Rule for review, from the culprit's failing trial (or the rule that already covers it)."""
    facts = {k: v for k, v in ((recovery or {}).get("facts") or {}).items() if v is not None}
    known = matching_rules(facts) if facts else []
    if known:
        return {"known_rule": known[0].id, "note": f"already covered by rule {known[0].id} "
                                                   f"(allowed for this bisect)"}
    variable = culprit[0]
    rule = {
        "id": f"bisect-{run_id}-{variable.removeprefix('sglang_server_')}",
        "match": facts,
        "symptom": f"{(recovery or {}).get('verdict')} in {(recovery or {}).get('phase')}: "
                   f"{(recovery or {}).get('reason')}",
        "source": f"sglang-fleet bisect {run_id} on {host}",
        "fix": {"variable": variable, "value": good.get(variable)},
    }
    notes = []
    if len(culprit) > 1:
        notes.append(f"fails only together with {', '.join(culprit[1:])}")
    unmatched = [v for v in culprit if v not in FACT_OF_SETTING]
    if unmatched:
        # Rules match LaunchSpec facts only: this match is every configuration on this
        # hardware and backend, far wider than the culprit. Narrow it before adopting it.
        notes.append(f"Rules cannot match on {', '.join(unmatched)}: as written this Rule "
                     f"matches every configuration with these facts; narrow it by hand")
    if notes:
        rule["note"] = "; ".join(notes)
    return rule


def cmd_bisect(args: argparse.Namespace) -> int:
    good, good_allow = experiments.load_settings(args.good)
    bad, bad_allow = experiments.load_settings(args.bad)
    names = experiments.differing(good, bad)
    if not names:
        raise UsageError(f"{args.good} and {args.bad} set the same values: nothing to bisect")
    folder = run_folder(args, "bisect")
    runner = _runner(args, folder, {})
    allow = sorted(set(good_allow) | set(bad_allow))
    say(f"bisect on {args.limit}: {counted(len(names), 'differing variable')}: {', '.join(names)}; "
        f"run folder {folder}")
    by_subset: dict[frozenset[str], experiments.Trial] = {}
    ran: list[experiments.Trial] = []
    started = time.time()
    records = {"good": args.good, "bad": args.bad, "limit": args.limit}

    def trial(subset: tuple[str, ...]) -> bool:
        settings = {k: v for k, v in good.items() if k not in subset}
        settings.update({k: bad[k] for k in subset if k in bad})
        name = "bad values of " + ", ".join(s.removeprefix("sglang_server_") for s in subset)
        say(f"trial {runner.count + 1}: {name}: deploying ...")
        result = runner.run(name, settings, allow, benchmark=False)
        by_subset[frozenset(subset)] = result
        ran.append(result)
        say(_trial_line(runner.count, runner.count, result).replace(
            f"[{runner.count}/{runner.count}]", f"trial {runner.count}:"))
        return not result.ready

    try:
        found = find_culprit(names, trial)
    except Interrupted as exc:
        write_experiment_records(folder, "bisect", started, exc.exit_code, ran,
                                 ran[-1] if ran else None, interrupted=exc, **records)
        raise
    culprit_trial = by_subset.get(frozenset(found.culprit))
    say()
    summary: dict[str, Any] = {
        "good": args.good, "bad": args.bad, "limit": args.limit, "differing": names,
        "trials": [{"bad_values_of": list(s), "failed": f,
                    "verdict": by_subset[frozenset(s)].outcome.verdict,
                    "evidence": by_subset[frozenset(s)].outcome.evidence,
                    "artifacts": by_subset[frozenset(s)].artifacts} for s, f in found.trials],
        "method": found.method, "culprit": list(found.culprit), "confirmed": found.confirmed,
    }
    code = EXIT_OK
    if found.confirmed and culprit_trial is not None:
        o = culprit_trial.outcome
        values = ", ".join(f"{k}={bad.get(k)!r} (good: {good.get(k)!r})" for k in found.culprit)
        say(f"culprit after {counted(len(found.trials), 'trial')} ({found.method}): {values}")
        say(f"  fails as: {_failure_text(o)}: {(o.verdict or {}).get('reason', o.message)}")
        say(f"  evidence: {o.evidence or culprit_trial.artifacts}")
        rule = proposed_rule(folder.name, o.host, found.culprit, good, o.recovery)
        summary["rule"] = rule
        if "known_rule" in rule:
            say(f"  {rule['note']}")
        else:
            (folder / "proposed-rule.yml").write_text(
                "# Proposed by sglang-fleet bisect. Review, then move into "
                "src/sglang_fleet/data/rules.yml.\n" + yaml.safe_dump([rule], sort_keys=False))
            say(f"  proposed rule: {folder / 'proposed-rule.yml'}")
            say("    " + yaml.safe_dump(rule, sort_keys=False).replace("\n", "\n    ").rstrip())
    else:
        say(f"no culprit: the bad configuration did not fail in "
            f"{counted(len(found.trials), 'trial')}")
        code = EXIT_HOSTS_FAILED
    (folder / "bisect.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    culprit_case = ("sglang-fleet.bisect", "culprit", None if code == EXIT_OK else
                    f"no culprit: the bad configuration did not fail in "
                    f"{counted(len(found.trials), 'trial')}", "no culprit")
    code, restored = _restore(args, runner, code)
    write_experiment_records(folder, "bisect", started, code, ran, restored or ran[-1],
                             [culprit_case] + _restore_cases("bisect", restored),
                             culprit=list(found.culprit), confirmed=found.confirmed, **records)
    say(f"result: {EXIT_CODES[code]} (exit {code}); summary {folder / 'summary.json'}, JUnit "
        f"{folder / 'junit.xml'}; trial record {folder / 'bisect.json'}")
    return code
