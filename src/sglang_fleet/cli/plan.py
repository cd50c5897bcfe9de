"""`sglang-fleet plan`: split the fleet into --limit slices for runs side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from sglang_fleet.cli.common import UsageError, check_inventory, default_inventory, say
from sglang_fleet.runs import slices
from sglang_fleet.runs.summary import (
    EXIT_OK,
)

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
