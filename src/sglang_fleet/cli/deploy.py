"""`sglang-fleet deploy`: deploy and gate servers (the rollout)."""

from __future__ import annotations

import argparse

from sglang_fleet.cli.common import run_playbook_command
from sglang_fleet.cli.inputs import parse_extra_vars

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
