"""`sglang-fleet check`: validate the whole inventory as a deploy would first, without
contacting any node."""

from __future__ import annotations

import argparse
import sys

from sglang_fleet.cli.common import _parse_problems, check_inventory, say
from sglang_fleet.cli.inputs import parse_extra_vars
from sglang_fleet.runs.outcomes import REFUSED_RUN_TASK
from sglang_fleet.runs.reasons import group_by_reason, host_order, hosts_text
from sglang_fleet.runs.runner import (
    failures,
    playbook_run,
    task_results,
)
from sglang_fleet.runs.summary import (
    EXIT_OK,
    EXIT_USAGE,
)

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
