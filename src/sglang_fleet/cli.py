"""sglang-fleet: the command line. Drives the playbooks through ansible-runner."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

from sglang_fleet import diagnose, experiments
from sglang_fleet.bisect import find_culprit
from sglang_fleet.metrics import prometheus_text, write_textfile
from sglang_fleet.outcomes import HostOutcome, host_outcomes
from sglang_fleet.progress import Progress
from sglang_fleet.report import config_row, markdown_table, write_report
from sglang_fleet.results import headline_tok_s
from sglang_fleet.router_settings import SECRET_SETTINGS as ROUTER_SECRET_SETTINGS
from sglang_fleet.router_view import router_lines
from sglang_fleet.rules import matching_rules
from sglang_fleet.runner import failures, playbook_run, project_dir, task_results
from sglang_fleet.spec import FACT_OF_SETTING, SECRET_SETTINGS
from sglang_fleet.store import state_path
from sglang_fleet.summary import (
    EXIT_HOSTS_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    build_summary,
    exit_code,
    host_table,
    judge_readiness,
    junit_document,
    write_summary,
)

RENDER_TASK = "Show the rendered files (secrets masked)"


class UsageError(Exception):
    pass


def say(text: str = "") -> None:
    print(text, flush=True)


def run_folder(args: argparse.Namespace, command: str) -> Path:
    if args.run_dir:
        return Path(args.run_dir).resolve()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path(state_path("runs", project_dir())) / f"{stamp}-{command}"


def parse_extra_vars(items: list[str] | None) -> dict[str, Any]:
    """-e as ansible-playbook takes it: JSON/YAML mappings or key=value pairs."""
    out: dict[str, Any] = {}
    for item in items or []:
        text = item.strip()
        if text.startswith("{"):
            value = yaml.safe_load(text)
            if not isinstance(value, dict):
                raise UsageError(f"-e {item!r}: not a mapping")
            out.update(value)
            continue
        for pair in text.split():
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise UsageError(f"-e {pair!r}: expected key=value or a JSON mapping")
            out[key] = yaml.safe_load(value) if value else ""
    secret = sorted(set(out) & {*SECRET_SETTINGS, *ROUTER_SECRET_SETTINGS})
    if secret:
        raise UsageError(f"-e {', '.join(secret)}: a secret on the command line ends up in "
                         f"the runner artifacts and the shell history. Fix: keep it in the "
                         f"inventory, encrypted with ansible-vault")
    return out


def check_inventory(args: argparse.Namespace) -> None:
    if args.inventory and not Path(args.inventory).exists():
        raise UsageError(f"--inventory {args.inventory}: no such file or folder")


def run_playbook_command(args: argparse.Namespace, command: str, playbook: str,
                         extra: dict[str, Any], require_ready: bool = False
                         ) -> tuple[int, dict[str, HostOutcome], dict[str, Any]]:
    """Run one playbook with live progress; write summary.json and junit.xml; print the
    host table. Returns the exit code, the outcomes and the summary."""
    check_inventory(args)
    folder = run_folder(args, command)
    started = time.time()
    with playbook_run(playbook, inventory=args.inventory, limit=args.limit, extravars=extra,
                      private_data_dir=str(folder / "runner"),
                      event_handler=Progress()) as run:
        outcomes = host_outcomes(list(run.events), run.stats)
        rc = run.rc
    if require_ready:
        judge_readiness(outcomes)
    summary = build_summary(command, rc, outcomes, started, time.time(), folder,
                            inventory=args.inventory, limit=args.limit)
    json_path = Path(args.json) if getattr(args, "json", None) else folder / "summary.json"
    junit_path = Path(args.junit) if getattr(args, "junit", None) else folder / "junit.xml"
    write_summary(summary, outcomes, json_path, junit_path)
    say()
    say(host_table(summary) if outcomes else "no host ran: check --limit and the inventory")
    say(f"result: {summary['result']} (exit {summary['exit_code']}); summary {json_path}, "
        f"JUnit {junit_path}, runner artifacts {folder / 'runner'}")
    return summary["exit_code"], outcomes, summary


# ---- deploy, health, recover ----------------------------------------------------------------

def cmd_deploy(args: argparse.Namespace) -> int:
    extra = parse_extra_vars(args.extra_vars)
    if args.serial:
        extra["sglang_fleet_serial"] = args.serial
    if args.max_fail_percentage is not None:
        extra["sglang_fleet_max_fail_percentage"] = args.max_fail_percentage
    if args.canary:
        extra["sglang_fleet_canary"] = args.canary
    if args.benchmark:
        extra["sglang_fleet_benchmark"] = True
    if args.recover:
        extra["sglang_recover_on_failure"] = True
    return run_playbook_command(args, "deploy", "deploy.yml", extra)[0]


def cmd_health(args: argparse.Namespace) -> int:
    return run_playbook_command(args, "health", "playbooks/health.yml",
                                parse_extra_vars(args.extra_vars), require_ready=True)[0]


def cmd_recover(args: argparse.Namespace) -> int:
    extra = parse_extra_vars(args.extra_vars)
    if args.clear_reboot_mark:
        extra["sglang_recover_clear_reboot_mark"] = True
    return run_playbook_command(args, "recover", "playbooks/recover.yml", extra)[0]


# ---- render ------------------------------------------------------------------------------

def cmd_render(args: argparse.Namespace) -> int:
    with playbook_run("playbooks/render.yml", inventory=args.inventory, limit=args.host) as run:
        results = task_results(run, RENDER_TASK)
        problems = failures(run)
    if args.host not in results:
        if problems:
            for host, task, msg in problems:
                print(f"{host}: {task}:\n{msg}", file=sys.stderr)
            return EXIT_USAGE
        print(f"host {args.host!r} is not in the sglang_servers group of inventory "
              f"{args.inventory or '(default)'}", file=sys.stderr)
        return EXIT_USAGE
    msg = results[args.host]["msg"]
    spec, files = msg["spec"], msg["files"]
    say(f"# {spec['host']}: deployment {spec['deployment']}, config {spec['config_hash']}, "
        f"SGLang {spec['sglang_version']}, install {spec['install']['mode']}, "
        f"service {spec['service']['manager']}")
    say(f"# ---- {spec['paths']['script']}")
    print(files["script"], end="")
    say(f"# ---- {spec['paths']['env_file']} (mode 0600, secrets masked)")
    print(files["env"], end="")
    if files.get("unit"):
        say(f"# ---- {spec['paths']['unit_file']}")
        print(files["unit"], end="")
    return EXIT_OK


# ---- watch -------------------------------------------------------------------------------

def cmd_watch(args: argparse.Namespace) -> int:
    """Observe the fleet every interval, export verdicts as Prometheus text, and recover hosts
    that turn failed when --recover allows it; stop on SIGINT/SIGTERM, --count or --duration."""
    check_inventory(args)
    extra = parse_extra_vars(args.extra_vars)
    folder = run_folder(args, "watch")
    metrics_path = Path(args.metrics_file) if args.metrics_file else folder / "sglang_fleet.prom"
    stop = {"signal": None}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["signal"] = signal.Signals(signum).name

    def finish_first() -> bool:
        return False  # a signal stops the watch after the observation or recovery in flight

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = time.monotonic() + args.duration if args.duration else None
    recoveries: dict[str, int] = {}
    observations, code = 0, EXIT_OK
    policy = "of " + ",".join(args.recover_verdicts) if args.recover else "off"
    say(f"watching {args.limit or 'sglang_servers'} every {args.interval:g} s; metrics "
        f"{metrics_path}; recovery {policy}")
    try:
        while stop["signal"] is None:
            # Membership follows each verdict: a failed server leaves its routers at once.
            with playbook_run("playbooks/health.yml", inventory=args.inventory,
                              limit=args.limit,
                              extravars={**extra, "sglang_router_follow_verdicts": True},
                              private_data_dir=str(folder / "runner"),
                              rotate_artifacts=args.keep_artifacts,
                              cancel_callback=finish_first) as run:
                events = list(run.events)
                outcomes = host_outcomes(events, run.stats)
                rc = run.rc
            observations += 1
            failed = sorted(h for h, o in outcomes.items()
                            if o.verdict_name in args.recover_verdicts)
            stamp = time.strftime("%H:%M:%S")
            say(f"[{stamp}] #{observations} " + "; ".join(
                f"{h} {o.verdict_name}" for h, o in sorted(outcomes.items())))
            for line in router_lines(events):
                say(f"[{stamp}]   {line}")
            if args.recover and failed and stop["signal"] is None:
                say(f"[{stamp}] recovering {', '.join(failed)}")
                with playbook_run("playbooks/recover.yml", inventory=args.inventory,
                                  limit=",".join(failed), extravars={
                                      **extra, "sglang_recover_verdicts": args.recover_verdicts},
                                  private_data_dir=str(folder / "runner"),
                                  rotate_artifacts=args.keep_artifacts,
                                  cancel_callback=finish_first) as rec:
                    recovered = host_outcomes(list(rec.events), rec.stats)
                for host, o in sorted(recovered.items()):
                    if o.recovery:
                        recoveries[host] = recoveries.get(host, 0) + 1
                    result = "recovered" if o.status == "ok" and o.recovery else \
                        f"not recovered: {_first(o.message)}"
                    say(f"[{time.strftime('%H:%M:%S')}] {host}: {result}"
                        + (f" (evidence {o.evidence})" if o.evidence else ""))
                    if o.status == "ok" and o.recovery:
                        outcomes[host] = o  # its verdict after the redeploy
            write_textfile(metrics_path, prometheus_text(outcomes, time.time(), observations,
                                                         recoveries))
            judge_readiness(outcomes)
            code = exit_code(rc, outcomes)
            if args.count and observations >= args.count:
                break
            if deadline and time.monotonic() >= deadline:
                break
            end = time.monotonic() + args.interval
            while stop["signal"] is None and time.monotonic() < end:
                time.sleep(min(0.2, max(0.0, end - time.monotonic())))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    reason = f"stopped by {stop['signal']}" if stop["signal"] else "done"
    say(f"watch {reason} after {observations} observation(s); metrics {metrics_path}")
    return code


def _first(text: str) -> str:
    return text.strip().splitlines()[0][:160] if text and text.strip() else "failed"


# ---- bench ---------------------------------------------------------------------------------

def bench_extravars(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in experiments.BENCH_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    extra = parse_extra_vars(args.extra_vars)
    extra.update({f"sglang_bench_{k}": v for k, v in bench_extravars(args).items()})
    if args.label:
        extra["sglang_bench_label"] = args.label
    folder = run_folder(args, "bench")
    args.run_dir = str(folder)
    extra["sglang_bench_run_id"] = folder.name
    code, outcomes, _ = run_playbook_command(args, "bench", "playbooks/benchmark.yml", extra)
    rows = []
    for host, o in sorted(outcomes.items()):
        if o.benchmark is None and o.status == "ok":
            continue  # a node that does not serve HTTP (rank > 0 of a multi-node server)
        name = f"{args.label} ({host})" if args.label else host
        rows.append(config_row(name, {}, "measured" if o.benchmark else _failure_text(o),
                               o.benchmark, None, host=host))
    if rows:
        write_report(rows, folder, "bench", "Benchmark")
        say()
        say(markdown_table(rows, any(r["simulated"] for r in rows)))
        say(f"report: {folder}/bench.md, bench.png, bench.json")
    return code


def _failure_text(o: HostOutcome) -> str:
    if o.status == "unreachable":
        return "unreachable"
    v = o.verdict or {}
    text = o.verdict_name
    if v.get("phase") and text not in ("ready", "not observed"):
        text += f" in {v['phase']}"
    if o.recovery:
        text += "; stopped, GPUs freed" if not o.recovery.get("reboot_needed") else \
            "; GPUs still held, node marked for reboot"
    elif text in ("ready", "not observed") and o.message:
        text = o.message.splitlines()[0][:120]
    return text


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
    return experiments.TrialRunner(args.inventory, args.limit, folder, folder.name, bench,
                                   parse_extra_vars(args.extra_vars))


def cmd_sweep(args: argparse.Namespace) -> int:
    plan = experiments.load_sweep(args.plan, allow_multiple=args.allow_multiple)
    folder = run_folder(args, "sweep")
    bench = dict(plan.bench)
    bench.update(bench_extravars(args))
    runner = _runner(args, folder, bench)
    steps = [("baseline", {}, [])] + [(v.name, v.settings, v.allow_rules) for v in plan.variants]
    say(f"sweep {args.plan} on {args.limit}: baseline and {len(plan.variants)} variant(s), "
        f"one trial each; run folder {folder}")
    trials = []
    for i, (name, changes, allow) in enumerate(steps, 1):
        trial = runner.run(name, {**plan.baseline, **changes}, plan.allow_rules + allow)
        trials.append((trial, changes))
        say(_trial_line(i, len(steps), trial))
    base = headline_tok_s(trials[0][0].outcome.benchmark) if trials[0][0].ready and \
        trials[0][0].outcome.benchmark else None
    rows = [config_row(t.name, changes, "ready" if t.ready else _failure_text(t.outcome),
                       t.outcome.benchmark if t.ready else None, base, t.outcome.evidence,
                       t.outcome.host) for t, changes in trials]
    title = plan.description or f"Sweep {Path(args.plan).name}"
    write_report(rows, folder, "sweep", title)
    (folder / "junit.xml").write_text(junit_document(
        f"sglang-fleet sweep {Path(args.plan).name}", round(sum(t.seconds for t, _ in trials), 1),
        [(f"sglang-fleet.sweep.{t.outcome.host}", t.name,
          None if t.ready else f"{_failure_text(t.outcome)}\nevidence: {t.outcome.evidence}\n"
                               f"{t.outcome.message}", _failure_text(t.outcome))
         for t, _ in trials]))
    (folder / "sweep.json").write_text(json.dumps(
        {"plan": args.plan, "baseline": plan.baseline, "limit": args.limit, "rows": rows,
         "trials": [{"name": t.name, "settings": t.settings, "verdict": t.outcome.verdict,
                     "status": t.outcome.status, "evidence": t.outcome.evidence,
                     "artifacts": t.artifacts, "seconds": round(t.seconds, 1)}
                    for t, _ in trials]}, indent=2, default=str) + "\n")
    say()
    say(markdown_table(rows, any(r["simulated"] for r in rows), title))
    say(f"table, chart, JUnit and trial artifacts: {folder}/sweep.md, sweep.png, sweep.json, "
        f"junit.xml")
    code = EXIT_OK
    if base is None:
        say("the baseline did not come up ready: deltas are missing")
        code = EXIT_HOSTS_FAILED
    if any(not t.ready and not t.outcome.recovery for t, _ in trials):
        say("a failed trial was not recovered: check its host before using it")
        code = EXIT_HOSTS_FAILED
    return _restore(args, runner, code)


def _restore(args: argparse.Namespace, runner: experiments.TrialRunner, code: int) -> int:
    if args.no_restore:
        say(f"--no-restore: {args.limit} keeps the last trial's configuration")
        return code
    trial = runner.restore()
    if trial.ready:
        say(f"restored {args.limit} to the inventory's configuration: ready")
        return code
    say(f"restoring {args.limit} to the inventory's configuration failed: "
        f"{_failure_text(trial.outcome)}; runner artifacts {trial.artifacts}")
    return EXIT_HOSTS_FAILED


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
    say(f"bisect on {args.limit}: {len(names)} differing variable(s): {', '.join(names)}; "
        f"run folder {folder}")
    by_subset: dict[frozenset[str], experiments.Trial] = {}

    def trial(subset: tuple[str, ...]) -> bool:
        settings = {k: v for k, v in good.items() if k not in subset}
        settings.update({k: bad[k] for k in subset if k in bad})
        name = "bad values of " + ", ".join(s.removeprefix("sglang_server_") for s in subset)
        result = runner.run(name, settings, allow, benchmark=False)
        by_subset[frozenset(subset)] = result
        say(_trial_line(runner.count, runner.count, result).replace(
            f"[{runner.count}/{runner.count}]", f"trial {runner.count}:"))
        return not result.ready

    found = find_culprit(names, trial)
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
        say(f"culprit after {len(found.trials)} trial(s) ({found.method}): {values}")
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
        say(f"no culprit: the bad configuration did not fail in {len(found.trials)} trial(s)")
        code = EXIT_HOSTS_FAILED
    (folder / "bisect.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    say(f"trial record: {folder / 'bisect.json'}")
    return _restore(args, runner, code)


# ---- parser --------------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser, limit_help: str = "hosts to act on") -> None:
    p.add_argument("-i", "--inventory", help="inventory path (default: ansible.cfg's)")
    p.add_argument("-l", "--limit", help=limit_help)
    p.add_argument("-e", "--extra-vars", action="append", metavar="VARS",
                   help="extra variables, key=value or JSON, as ansible-playbook takes them")
    p.add_argument("--run-dir", help="where the report and runner artifacts go (default: "
                                     ".sglang-fleet/runs/<time>-<command>)")


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", help="write the JSON summary here too (default: run folder)")
    p.add_argument("--junit", help="write the JUnit XML here (default: run folder)")


def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-len", dest="input_len", type=int, help="prompt tokens (1024)")
    p.add_argument("--output-len", dest="output_len", type=int, help="output tokens (256)")
    p.add_argument("--warmup", type=int, help="warm-up requests (1)")
    p.add_argument("--repetitions", type=int, help="measured runs per level (3)")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                   help="comma-separated levels (1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-fleet", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 every host ready (or the command succeeded), 1 some hosts failed, "
               "2 usage or inventory error (no node touched), 3 unreachable hosts, 4 internal "
               "error.\nEach run writes summary.json, junit.xml and the ansible-runner artifacts "
               "to .sglang-fleet/runs/<time>-<command>/ (--run-dir moves it).")
    sub = parser.add_subparsers(dest="command", required=True)

    deploy = sub.add_parser("deploy", help="deploy and gate servers (the rollout)")
    _common(deploy)
    _report_args(deploy)
    deploy.add_argument("--serial", help="hosts per batch, a number or a percentage")
    deploy.add_argument("--max-fail-percentage", dest="max_fail_percentage", type=int,
                        help="stop the rollout when more than this share of a batch fails")
    deploy.add_argument("--canary", help="deploy and benchmark this host first; stop the "
                                         "rollout when its decode speed drops")
    deploy.add_argument("--benchmark", action="store_true", help="benchmark each ready server")
    deploy.add_argument("--recover", action="store_true",
                        help="recover hosts the gate judges failed")
    deploy.set_defaults(func=cmd_deploy)

    health = sub.add_parser("health", help="one observation and verdict per host")
    _common(health)
    _report_args(health)
    health.set_defaults(func=cmd_health)

    recover = sub.add_parser("recover", help="recover the hosts whose verdict is failed")
    _common(recover)
    _report_args(recover)
    recover.add_argument("--clear-reboot-mark", action="store_true",
                         help="after rebooting a node marked for reboot, clear its mark")
    recover.set_defaults(func=cmd_recover)

    watch = sub.add_parser("watch", help="observe the fleet every interval, export Prometheus "
                                         "metrics, recover failed hosts if allowed")
    _common(watch)
    watch.add_argument("--interval", type=float, default=30.0, help="seconds between "
                                                                    "observations (30)")
    watch.add_argument("--count", type=int, help="stop after this many observations")
    watch.add_argument("--duration", type=float, help="stop after this many seconds")
    watch.add_argument("--metrics-file", help="Prometheus textfile to write, e.g. "
                       "/var/lib/node_exporter/textfile_collector/sglang_fleet.prom")
    watch.add_argument("--recover", action="store_true",
                       help="recover hosts whose verdict turns to one of --recover-verdicts "
                            "(the crash-loop guard still applies)")
    watch.add_argument("--recover-verdicts", type=lambda s: s.split(","),
                       default=["stalled", "crashed", "unhealthy"],
                       help="comma-separated (stalled,crashed,unhealthy)")
    watch.add_argument("--keep-artifacts", type=int, default=20,
                       help="runner artifact folders to keep (20)")
    watch.set_defaults(func=cmd_watch)

    render = sub.add_parser("render", help="print the launch files deploy would write for HOST")
    render.add_argument("-i", "--inventory", help="inventory path (default: ansible.cfg's)")
    render.add_argument("host")
    render.set_defaults(func=cmd_render)

    bench = sub.add_parser("bench", help="measure ready servers as bench_one_batch_server does")
    _common(bench)
    _report_args(bench)
    _bench_args(bench)
    bench.add_argument("--label", help="name of the configuration in the results store")
    bench.set_defaults(func=cmd_bench)

    sweep = sub.add_parser("sweep", help="deploy, gate and benchmark a baseline and variants "
                                         "that each change one variable")
    sweep.add_argument("plan", help="sweep file (YAML): baseline, variants, benchmark")
    _common(sweep, "the host (or multi-node group) to experiment on")
    _bench_args(sweep)
    sweep.add_argument("--allow-multiple", action="store_true",
                       help="let a variant change more than one variable")
    sweep.add_argument("--no-restore", action="store_true",
                       help="leave the last trial's configuration running")
    sweep.set_defaults(func=cmd_sweep)

    bisect = sub.add_parser("bisect", help="find the variables that make a configuration fail")
    bisect.add_argument("--good", required=True, help="YAML of sglang_server_* that works")
    bisect.add_argument("--bad", required=True, help="YAML of sglang_server_* that fails")
    _common(bisect, "the host (or multi-node group) to experiment on")
    bisect.add_argument("--no-restore", action="store_true",
                        help="leave the last trial's configuration running")
    bisect.set_defaults(func=cmd_bisect)

    diag = sub.add_parser("diagnose", help="read one SGLang server log: phase, progress, "
                                           "timeline, failures, the gate's conclusion")
    diag.add_argument("logfile", help="the server's log, a `docker logs` capture, or - for "
                                      "standard input")
    diag.add_argument("--json", action="store_true", help="print one JSON object")
    diag.set_defaults(func=diagnose.command)  # exit 0 no fatal failure, 1 fatal, 2 unreadable
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except (UsageError, experiments.PlanError) as exc:
        print(f"sglang-fleet {args.command}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except FileNotFoundError as exc:
        print(f"sglang-fleet: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except Exception:  # a bug: say so, with the traceback, and exit with the internal code
        traceback.print_exc()
        print(f"sglang-fleet {args.command}: internal error (exit {EXIT_INTERNAL})",
              file=sys.stderr)
        code = EXIT_INTERNAL
    sys.exit(code)
