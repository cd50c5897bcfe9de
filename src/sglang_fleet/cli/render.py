"""`sglang-fleet render`: print the launch files a deploy would write."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sglang_fleet.cli.common import RENDER_TASK, check_inventory, say
from sglang_fleet.cli.inputs import parse_extra_vars
from sglang_fleet.runs.reasons import host_order
from sglang_fleet.runs.runner import (
    failures,
    playbook_run,
    task_results,
)
from sglang_fleet.runs.summary import (
    EXIT_OK,
    EXIT_USAGE,
)

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
