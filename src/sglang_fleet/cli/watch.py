"""`sglang-fleet watch`: observe the fleet every interval, export Prometheus metrics, recover
failed hosts if allowed."""

from __future__ import annotations

import argparse
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_fleet.cli.common import check_inventory, pd_unit_limit, run_folder, say
from sglang_fleet.cli.inputs import parse_extra_vars
from sglang_fleet.router.view import router_lines
from sglang_fleet.runs.metrics import is_router, prometheus_text, write_textfile
from sglang_fleet.runs.outcomes import HostOutcome, host_outcomes
from sglang_fleet.runs.progress import Progress
from sglang_fleet.runs.reasons import counted
from sglang_fleet.runs.runner import (
    playbook_run,
)
from sglang_fleet.runs.summary import (
    EXIT_OK,
    build_summary,
    exit_code,
    judge_readiness,
    rc_after_recovery,
    write_summary,
)


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

    try:
        observations = watch_loop(observe, args.interval, args.count, args.duration,
                                  stopped=lambda: stop["signal"] is not None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    reason = f"stopped by {stop['signal']}" if stop["signal"] else "done"
    say(f"watch {reason} after {counted(observations, 'observation')}; metrics {metrics_path}")
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
