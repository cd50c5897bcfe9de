"""sglang-fleet: the command line. Drives the playbooks through ansible-runner."""

from __future__ import annotations

import argparse
import configparser
import json
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from sglang_fleet import diagnose, experiments, slices
from sglang_fleet.bisect import find_culprit
from sglang_fleet.extra_vars import replacement_warnings
from sglang_fleet.inputs import InputError, check_inventory_files, parse_extra_vars
from sglang_fleet.inventory_read import read_servers
from sglang_fleet.metrics import is_router, prometheus_text, write_textfile
from sglang_fleet.outcomes import REFUSED_RUN_TASK, HostOutcome, host_outcomes
from sglang_fleet.pd import PD_SIDE_VARS, decodes_beside
from sglang_fleet.progress import Progress
from sglang_fleet.reasons import counted, group_by_reason, host_order, hosts_text
from sglang_fleet.report import config_row, markdown_table, write_report
from sglang_fleet.results import headline_tok_s
from sglang_fleet.router_view import router_lines
from sglang_fleet.rules import matching_rules
from sglang_fleet.run_history import (
    find_run,
    keep_count,
    prune_runs,
    run_folders,
    run_line,
    runs_root,
    write_meta,
    write_run_record,
)
from sglang_fleet.runner import (
    Interrupted,
    failures,
    playbook_run,
    project_config,
    project_dir,
    recap,
    scrub_artifacts,
    task_results,
)
from sglang_fleet.spec import FACT_OF_SETTING
from sglang_fleet.store import state_path
from sglang_fleet.summary import (
    EXIT_CODES,
    EXIT_HOSTS_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_USAGE,
    build_summary,
    exit_code,
    host_table,
    judge_readiness,
    junit_document,
    rc_after_recovery,
    write_private,
    write_summary,
)
from sglang_fleet_node.sglang_fleet_text import inert
from sglang_fleet_node.sglang_fleet_vocab import verdict_phrase

RENDER_TASK = "Show the rendered files (secrets masked)"


class UsageError(Exception):
    pass


def say(text: str = "") -> None:
    """A line of the CLI's output; what came from a node in it is shown inert."""
    print(inert(text), flush=True)


def run_folder(args: argparse.Namespace, command: str) -> Path:
    """The run's folder, created private (0700): its records name settings and evidence."""
    if args.run_dir:
        folder = Path(args.run_dir).resolve()
    else:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        folder = Path(state_path("runs", project_dir())) / f"{stamp}-{command}"
        # Old runs go by the keep count; each deployment's last good run stays.
        prune_runs(folder.parent, keep_count())
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def default_inventory() -> Path | None:
    """The inventory ansible.cfg names (used when -i is not given)."""
    cfg = configparser.ConfigParser(interpolation=None)
    path = project_config(project_dir())
    if path is None:
        return None
    cfg.read(path)
    value = cfg.get("defaults", "inventory", fallback="").split(",")[0].strip()
    return (path.parent / value).resolve() if value else None


def check_inventory(args: argparse.Namespace) -> None:
    """Refuse, before Ansible starts, an inventory that is missing or whose YAML Ansible
    could not read or could read only at a cost without bound (InputError: exit 2)."""
    if args.inventory and not Path(args.inventory).exists():
        raise UsageError(f"--inventory {args.inventory}: no such file or folder")
    inventory = Path(args.inventory) if args.inventory else default_inventory()
    if inventory and inventory.exists():
        check_inventory_files(inventory)
        # A mapping setting given with -e replaces the inventory's whole mapping: say what
        # it drops before the run.
        given = parse_extra_vars(getattr(args, "extra_vars", None))
        for line in replacement_warnings(inventory, given, getattr(args, "limit", None)):
            say(line)


def _parse_problems(run: Any) -> list[str]:
    """Ansible's own lines saying why no host ran (an inventory it could not parse, ...)."""
    try:
        text = run.stdout.read()
    except (OSError, ValueError, AttributeError):
        return []
    keep = ("unable to parse", "failed to parse", "error!", "could not match supplied host",
            "no inventory was parsed", "provided hosts list is empty")
    return [line.strip() for line in text.splitlines()
            if any(k in line.lower() for k in keep)][:12]


def _interruption_lines(exc: Interrupted) -> list[str]:
    killed = (f"; {exc.ended} of its processes did not stop on SIGTERM and were killed"
              if exc.ended else "")
    return [f"interrupted by {exc.name}: this run's ansible-playbook and its workers are "
            f"stopped{killed}.",
            "The servers keep starting: what the run had started on the nodes keeps running. "
            "See where they are with `sglang-fleet health`."]


def run_playbook_command(args: argparse.Namespace, command: str, playbook: str,
                         extra: dict[str, Any], require_ready: bool = False
                         ) -> tuple[int, dict[str, HostOutcome], dict[str, Any]]:
    """Run one playbook with live progress; write summary.json and junit.xml; print the
    host table. Returns the exit code, the outcomes and the summary. A command that only
    observes (require_ready: health) says one line per host, its verdict, then the table."""
    check_inventory(args)
    folder = run_folder(args, command)
    groups = host_groups(args)
    write_meta(folder, {"groups": groups})
    started = time.time()
    interrupted: Interrupted | None = None
    problems: list[str] = []
    # Each event as runner hands it over: read again from its files, 64 hosts' events took
    # seconds. The artifacts are scrubbed after the summary and the page are written.
    events: list[dict[str, Any]] = []
    scrub: list[str] = []

    def handler(event: dict[str, Any]) -> bool:
        events.append(event)
        return progress(event)

    try:
        with Progress(final_only=require_ready) as progress, playbook_run(
                playbook, inventory=args.inventory, limit=args.limit, extravars=extra,
                private_data_dir=str(folder / "runner"), event_handler=handler,
                defer_scrub=scrub) as run:
            stats, rc = recap(events), run.rc
            problems = [] if stats else _parse_problems(run)
    except Interrupted as exc:
        interrupted = exc
    try:
        return _report_run(args, command, folder, events, stats, rc, interrupted, problems,
                           require_ready, started, groups)
    finally:
        for path in scrub:
            scrub_artifacts(path)


def _report_run(args: argparse.Namespace, command: str, folder: Path,
                events: list[dict[str, Any]], stats: dict[str, Any] | None, rc: int,
                interrupted: Interrupted | None, problems: list[str], require_ready: bool,
                started: float, groups: dict[str, list[str]]
                ) -> tuple[int, dict[str, HostOutcome], dict[str, Any]]:
    """The run's summary, JUnit file and page, then the host table and the result line."""
    outcomes = host_outcomes(events, stats, interrupted=interrupted is not None)
    if require_ready:
        judge_readiness(outcomes)
    summary = build_summary(command, rc, outcomes, started, time.time(), folder,
                            interrupted_by=interrupted.name if interrupted else None,
                            interrupted_exit=interrupted.exit_code if interrupted else None,
                            inventory=args.inventory, limit=args.limit)
    json_path = Path(args.json) if getattr(args, "json", None) else folder / "summary.json"
    junit_path = Path(args.junit) if getattr(args, "junit", None) else folder / "junit.xml"
    write_summary(summary, outcomes, json_path, junit_path)
    page = write_record(folder, events, summary, groups)
    say()
    if outcomes:
        # On a terminal the reasons wrap to its width; in a log each stays one line.
        say(host_table(summary, shutil.get_terminal_size().columns - 1
                       if sys.stdout.isatty() else None))
    elif problems:
        say("no host ran; Ansible said:")
        for line in problems:
            say(f"  {line}")
    else:
        say("no host ran: check --limit and the inventory")
    for line in _interruption_lines(interrupted) if interrupted else []:
        say(line)
    say(f"result: {summary['result']} (exit {summary['exit_code']}); summary {json_path}, "
        f"JUnit {junit_path}, runner artifacts {folder / 'runner'}")
    if page:
        say(f"run record: {page}")
    return summary["exit_code"], outcomes, summary


def host_groups(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each host's inventory groups, for the run record's filter (read before the run, so
    the page is written as soon as it ends); none when the inventory cannot be read here."""
    from ansible.errors import AnsibleError

    inventory = args.inventory or default_inventory()
    try:
        read = read_servers(str(inventory) if inventory else None, ())
    except (AnsibleError, OSError):
        return {}
    out: dict[str, list[str]] = {}
    for group, hosts in read.groups.items():
        if group in ("all", "ungrouped"):
            continue
        for host in hosts:
            out.setdefault(host, []).append(group)
    return out


def write_record(folder: Path, events: list[dict[str, Any]] | None = None,
                 summary: dict[str, Any] | None = None,
                 groups: dict[str, list[str]] | None = None) -> Path | None:
    """The run's page and its JSON in the run folder; a failure to write them is said, and
    never changes the run's result."""
    try:
        return write_run_record(folder, events, summary, groups)
    except Exception as exc:  # noqa: BLE001 - the run's own result stands
        say(f"warning: the run record was not written: {type(exc).__name__}: {exc}; "
            f"rebuild it with `sglang-fleet report {folder}`")
        return None


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
    return run_playbook_command(args, "deploy", "playbooks/deploy.yml", extra)[0]


def cmd_health(args: argparse.Namespace) -> int:
    return run_playbook_command(args, "health", "playbooks/health.yml",
                                parse_extra_vars(args.extra_vars), require_ready=True)[0]


def pd_unit_limit(args: argparse.Namespace, limit: str) -> str:
    """`limit` with the decodes of each PD prefill it selects (pd.decodes_beside): a PD
    deployment recovers as a unit, its decodes back in the routers with its prefill. The
    limit as given when the inventory cannot be read here (the playbook then says why)."""
    from ansible.errors import AnsibleError

    inventory = args.inventory or default_inventory()
    try:
        read = read_servers(str(inventory) if inventory else None, PD_SIDE_VARS, limit)
    except AnsibleError:
        return limit
    sides = {h: (v[PD_SIDE_VARS[0]], v[PD_SIDE_VARS[1]]) for h, v in read.values.items()}
    more = decodes_beside(read.selected, sides, read.groups)
    if not more:
        return limit
    say(f"with {hosts_text(more)}: the decodes of the PD prefills named, back in the routers "
        f"once a prefill of theirs is ready")
    return ",".join([limit, *more])


def cmd_recover(args: argparse.Namespace) -> int:
    extra = parse_extra_vars(args.extra_vars)
    if args.clear_reboot_mark:
        extra["sglang_recover_clear_reboot_mark"] = True
    elif args.limit:
        check_inventory(args)
        args.limit = pd_unit_limit(args, args.limit)
    return run_playbook_command(args, "recover", "playbooks/recover.yml", extra)[0]


# ---- render ------------------------------------------------------------------------------

def cmd_render(args: argparse.Namespace) -> int:
    """The files a deploy with the same inventory, --limit and -e would write, secrets
    masked: for HOST, or every host the limit selects."""
    check_inventory(args)
    limit = args.host or args.limit
    with playbook_run("playbooks/render.yml", inventory=args.inventory, limit=limit,
                      extravars=parse_extra_vars(args.extra_vars)) as run:
        results = task_results(run, RENDER_TASK)
        problems = failures(run)
    if problems or not results or (args.host and args.host not in results):
        for host, task, msg in problems:
            print(f"{host}: {task}:\n{msg}", file=sys.stderr)
        if not problems:
            print(f"no host {limit or ''} in the sglang_servers group of inventory "
                  f"{args.inventory or '(default)'}", file=sys.stderr)
        return EXIT_USAGE
    for host in sorted(results, key=host_order):
        _show_rendered(results[host]["msg"])
    return EXIT_OK


def _show_rendered(msg: dict[str, Any]) -> None:
    spec, files = msg["spec"], msg["files"]
    say(f"# {spec['host']}: deployment {spec['deployment']}, config {spec['config_hash']}, "
        f"SGLang {spec['sglang_version']}, install {spec['install']['mode']}, "
        f"service {spec['service']['manager']}")
    say(f"# ---- {spec['paths']['script']}")
    print(files["script"], end="")
    say(f"# ---- {spec['paths']['env_file']} (mode 0600, secrets masked)")
    print(files["env"], end="")
    say(f"# ---- {spec['paths']['config_file']} (mode 0600, secrets masked)")
    print(files["config"], end="")
    if files.get("unit"):
        say(f"# ---- {spec['paths']['unit_file']}")
        print(files["unit"], end="")


# ---- check ---------------------------------------------------------------------------------

VALIDATE_PLAYBOOK = "playbooks/validate.yml"
SPEC_CHECKS = ("Refuse an invalid LaunchSpec, naming each variable, its value and the fix",
               "Refuse invalid router settings, naming each variable, its value and the fix")


def cmd_check(args: argparse.Namespace) -> int:
    """The whole validation a deploy starts with, alone: every host's LaunchSpec and every
    router's RouterSpec, on the controller, no node contacted. Exit 0, or 2 with every
    problem of every host."""
    check_inventory(args)
    extra = parse_extra_vars(args.extra_vars)
    with playbook_run(VALIDATE_PLAYBOOK, inventory=args.inventory, limit=args.limit,
                      extravars=extra) as run:
        problems = [(host, msg) for host, task, msg in failures(run) if task != REFUSED_RUN_TASK]
        # A host refused before its spec checks ran (its variables did not resolve) counts.
        checked = {host for task in SPEC_CHECKS for host in task_results(run, task)}
        checked |= {host for host, _ in problems}
        warnings = [(host, res["msg"]) for task in SPEC_CHECKS
                    for host, res in task_results(run, task).items()
                    if not res["_failed"] and res.get("msg") not in (None, "", "All assertions "
                                                                      "passed")]
        stats = run.stats
    if not stats and not checked:
        for line in _parse_problems(run) or ["no host matched: check --limit and the "
                                             "inventory"]:
            print(line, file=sys.stderr)
        return EXIT_USAGE
    for hosts, reason in group_by_reason(warnings):
        say(f"warning [{hosts_text(hosts)}]:")
        for line in reason.splitlines():
            say(f"    {line}")
    for hosts, reason in group_by_reason(problems):
        say(f"refused [{hosts_text(hosts)}]:")
        for line in reason.splitlines():
            say(f"    {line}")
    refused = sorted({host for host, _ in problems}, key=host_order)
    if refused:
        say(f"result: refused (exit {EXIT_USAGE}): {len(refused)} of {len(checked)} hosts have "
            f"problems; no node was contacted")
        return EXIT_USAGE
    say(f"result: ok (exit {EXIT_OK}): {len(checked)} hosts checked; no node was contacted")
    return EXIT_OK


# ---- watch -------------------------------------------------------------------------------

def cmd_plan(args: argparse.Namespace) -> int:
    """Slices of the fleet for runs side by side, every multi-node group whole in one."""
    check_inventory(args)
    inventory = args.inventory or default_inventory()
    servers, routers = slices.read_server_hosts(str(inventory) if inventory else None)
    if not servers:
        raise UsageError(f"no host in the {slices.SERVERS_GROUP} group of inventory "
                         f"{inventory or '(default)'}")
    planned = slices.plan_slices(servers, args.slices)
    out = Path(args.out) if args.out else None
    if out:
        slices.write_limit_files(planned, out)
    for line in slices.plan_lines(planned, routers, out):
        say(line)
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    """Observe the fleet every interval, export verdicts as Prometheus text, and recover hosts
    that turn failed when --recover allows it; stop on SIGINT/SIGTERM, --count or --duration."""
    check_inventory(args)
    extra = parse_extra_vars(args.extra_vars)
    folder = run_folder(args, "watch")
    groups = host_groups(args)
    write_meta(folder, {"groups": groups})
    metrics_path = Path(args.metrics_file) if args.metrics_file else folder / "sglang_fleet.prom"
    stop = {"signal": None}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["signal"] = signal.Signals(signum).name

    def finish_first() -> bool:
        return False  # a signal stops the watch after the observation or recovery in flight

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    recoveries: dict[str, int] = {}
    result = {"code": EXIT_OK}
    policy = "of " + ",".join(args.recover_verdicts) if args.recover else "off"
    say(f"watching {args.limit or 'sglang_servers'} every {args.interval:g} s; metrics "
        f"{metrics_path}; recovery {policy}")

    def rejudge_routers(outcomes: dict[str, HostOutcome]) -> None:
        """A router that failed beside servers this observation recovered (a PD router left
        without its prefill's side) is judged again: its verdict after the recovery, as the
        servers' own."""
        down = sorted(h for h, o in outcomes.items() if is_router(o) and o.status == "failed")
        if not down:
            return
        with playbook_run("playbooks/health.yml", inventory=args.inventory,
                          limit=",".join(down), extravars=extra,
                          private_data_dir=str(folder / "runner"),
                          rotate_artifacts=args.keep_artifacts,
                          cancel_callback=finish_first) as again:
            for host, o in host_outcomes(list(again.events), again.stats).items():
                if host in down and is_router(o):
                    outcomes[host] = o

    def observe(number: int) -> None:
        started = time.time()
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
        # A router is not recovered as a server is: its own verdict says what to do.
        failed = sorted(h for h, o in outcomes.items()
                        if o.verdict_name in args.recover_verdicts and not is_router(o))
        failed_here = {h for h, o in outcomes.items() if o.status == "failed"}
        stamp = time.strftime("%H:%M:%S")
        say(f"[{stamp}] #{number} " + "; ".join(
            f"{h} {o.verdict_name}" for h, o in sorted(outcomes.items())))
        for line in router_lines(events):
            say(f"[{stamp}]   {line}")
        if args.recover and failed and stop["signal"] is None:
            say(f"[{stamp}] recovering {', '.join(failed)}")
            with Progress(indent="  ") as progress, playbook_run(
                    "playbooks/recover.yml", inventory=args.inventory,
                    limit=pd_unit_limit(args, ",".join(failed)), extravars={
                        **extra, "sglang_recover_verdicts": args.recover_verdicts},
                    private_data_dir=str(folder / "runner"),
                    rotate_artifacts=args.keep_artifacts, event_handler=progress,
                    cancel_callback=finish_first) as rec:
                recovered = host_outcomes(list(rec.events), rec.stats)
            for host, o in sorted(recovered.items()):
                if host not in failed:
                    continue  # a decode held beside its prefill (pd_unit_limit)
                if o.recovery:
                    recoveries[host] = recoveries.get(host, 0) + 1
                done = "recovered" if o.status == "ok" and o.recovery else \
                    f"not recovered: {_first(o.message)}"
                say(f"[{time.strftime('%H:%M:%S')}] {host}: {done}"
                    + (f" (evidence {o.evidence})" if o.evidence else ""))
                if o.status == "ok" and o.recovery:
                    outcomes[host] = o  # its verdict after the redeploy
            rejudge_routers(outcomes)
        write_textfile(metrics_path, prometheus_text(outcomes, time.time(), number,
                                                     recoveries))
        judge_readiness(outcomes)
        result["code"] = exit_code(rc_after_recovery(rc, failed_here, outcomes), outcomes)
        # The run folder's contract: the last observation's summary and JUnit file.
        summary = build_summary("watch", rc, outcomes, started, time.time(), folder,
                                observations=number, recoveries=recoveries)
        write_summary(summary, outcomes, folder / "summary.json", folder / "junit.xml")
        write_record(folder, summary=summary, groups=groups)

    try:
        observations = watch_loop(observe, args.interval, args.count, args.duration,
                                  stopped=lambda: stop["signal"] is not None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    reason = f"stopped by {stop['signal']}" if stop["signal"] else "done"
    say(f"watch {reason} after {counted(observations, 'observation')}; metrics {metrics_path}; "
        f"run record {folder / 'run.html'}")
    return result["code"]


def watch_loop(observe: Callable[[int], None], interval: float, count: int | None,
               duration: float | None, stopped: Callable[[], bool],
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> int:
    """Call observe(1), observe(2), ... every `interval` seconds, start to start: the time
    an observation takes counts in the interval, and one that takes longer is followed at
    once by the next. Ends after `count` observations, when the next one would start
    `duration` seconds or more after the first, or when stopped() (checked between
    observations, never in one). Returns how many ran."""
    began = clock()
    number = 0
    while not stopped():
        started = clock()
        number += 1
        observe(number)
        due = started + interval
        if (count and number >= count) or (duration and due - began >= duration):
            break  # the next observation would start after --duration
        while not stopped() and clock() < due:
            sleep(min(0.2, max(0.0, due - clock())))
    return number


def _first(text: str) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else "failed"


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
        hosts = ", ".join(r["host"] for r in rows) if len(rows) <= 4 else f"{len(rows)} servers"
        write_report(rows, folder, "bench", f"Benchmark of {hosts}"
                     + (f" ({args.label})" if args.label else ""), subject=f"run {folder.name}")
        say()
        say(markdown_table(rows, any(r["simulated"] for r in rows)))
        say(f"report: {folder}/bench.md, bench.png, bench.json")
    return code


def _failure_text(o: HostOutcome) -> str:
    if o.status == "unreachable":
        return "unreachable"
    v = o.verdict or {}
    text = verdict_phrase(o.verdict_name, v.get("phase"))
    if o.recovery:
        text += "; stopped, GPUs freed" if not o.recovery.get("reboot_needed") else \
            "; GPUs still held, node marked for reboot"
    elif text in ("ready", "not observed") and o.message:
        text = o.message.strip().splitlines()[0]
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
    write_record(folder, summary=summary)


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


# ---- report --------------------------------------------------------------------------------

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
               "error, 130/143 interrupted by SIGINT/SIGTERM (the servers keep starting)."
               "\nEach run writes summary.json, junit.xml and the ansible-runner artifacts "
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

    check = sub.add_parser("check", help="validate the whole inventory as a deploy would "
                                         "first, without contacting any node")
    _common(check)
    check.set_defaults(func=cmd_check)

    plan = sub.add_parser("plan", help="split the fleet into --limit slices for runs side by "
                                       "side, each multi-node group whole in one slice")
    plan.add_argument("-i", "--inventory", help="inventory path (default: ansible.cfg's)")
    plan.add_argument("--slices", type=int, required=True, metavar="N",
                      help="how many slices (runs) to plan")
    plan.add_argument("--out", metavar="DIR",
                      help="write slice-K.limit files here, for --limit @DIR/slice-K.limit")
    plan.set_defaults(func=cmd_plan)

    render = sub.add_parser("render", help="print the launch files a deploy would write, for "
                                           "HOST or the hosts --limit selects (with -e too)")
    _common(render)
    render.add_argument("host", nargs="?", help="one host (or give --limit)")
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

    report = sub.add_parser("report", help="the page of a run (the newest by default): its "
                                           "path, rebuilt from the run's files if missing")
    report.add_argument("run", nargs="?", help="a run folder, or its name under the runs "
                                               "folder (default: the newest run)")
    report.add_argument("--list", action="store_true", help="list the runs with their results")
    report.add_argument("--rebuild", action="store_true",
                        help="write the page again from the run's files")
    report.add_argument("--keep", type=int, metavar="N",
                        help="remove all but the newest N runs, keeping each deployment's "
                             "last good run")
    report.set_defaults(func=cmd_report)

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
    except (UsageError, InputError, experiments.PlanError, slices.SliceError) as exc:
        print(f"sglang-fleet {args.command}: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except FileNotFoundError as exc:
        print(f"sglang-fleet: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except Interrupted as exc:  # between or inside the playbook runs of sweep, bisect, ...
        for line in _interruption_lines(exc):
            print(line, file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C outside a playbook run: nothing of ours is running
        print(f"sglang-fleet {args.command}: interrupted (exit {EXIT_SIGINT})", file=sys.stderr)
        code = EXIT_SIGINT
    except Exception:  # a bug: say so, with the traceback, and exit with the internal code
        traceback.print_exc()
        print(f"sglang-fleet {args.command}: internal error (exit {EXIT_INTERNAL})",
              file=sys.stderr)
        code = EXIT_INTERNAL
    sys.exit(code)
