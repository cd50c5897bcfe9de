"""What every command shares: the run folder, the inventory check, one playbook run with its
summary, JUnit and report lines, and the usage error."""

from __future__ import annotations

import argparse
import configparser
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from sglang_fleet.bench import experiments
from sglang_fleet.cli.inputs import check_inventory_files, parse_extra_vars
from sglang_fleet.launch.pd import PD_SIDE_VARS, decodes_beside
from sglang_fleet.node.common.text import inert
from sglang_fleet.node.common.vocab import verdict_phrase
from sglang_fleet.runs.inventory_read import read_servers
from sglang_fleet.runs.outcomes import HostOutcome, host_outcomes
from sglang_fleet.runs.progress import Progress
from sglang_fleet.runs.reasons import hosts_text
from sglang_fleet.runs.runner import (
    Interrupted,
    playbook_run,
    project_config,
    project_dir,
)
from sglang_fleet.runs.store import state_path
from sglang_fleet.runs.summary import (
    build_summary,
    host_table,
    judge_readiness,
    write_summary,
)
from sglang_fleet.settings.extra_vars import replacement_warnings

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
    started = time.time()
    interrupted: Interrupted | None = None
    problems: list[str] = []
    try:
        with Progress(final_only=require_ready) as progress, playbook_run(
                playbook, inventory=args.inventory, limit=args.limit, extravars=extra,
                private_data_dir=str(folder / "runner"), event_handler=progress) as run:
            events, stats, rc = list(run.events), run.stats, run.rc
            problems = [] if stats else _parse_problems(run)
    except Interrupted as exc:
        interrupted = exc
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
    return summary["exit_code"], outcomes, summary


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


# ---- bench ---------------------------------------------------------------------------------

def bench_extravars(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in experiments.BENCH_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    return out


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
