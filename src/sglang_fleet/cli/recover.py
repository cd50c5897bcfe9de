"""`sglang-fleet recover`: recover the hosts whose verdict is failed; `sglang-fleet rollback`:
return servers to the configuration that was ready before the one they run (the same
playbook, every server of the run taken whatever its verdict)."""

from __future__ import annotations

import argparse

from sglang_fleet.cli.common import check_inventory, pd_unit_limit, run_playbook_command
from sglang_fleet.runs.inputs import parse_extra_vars


def cmd_recover(args: argparse.Namespace) -> int:
    extra = parse_extra_vars(args.extra_vars)
    if args.clear_reboot_mark:
        extra["sglang_recover_clear_reboot_mark"] = True
    elif args.limit:
        check_inventory(args)
        args.limit = pd_unit_limit(args, args.limit)
    return run_playbook_command(args, "recover", "playbooks/recover.yml", extra)[0]


def cmd_rollback(args: argparse.Namespace) -> int:
    extra = parse_extra_vars(args.extra_vars)
    extra["sglang_recover_rollback"] = True
    if args.limit:
        check_inventory(args)
        args.limit = pd_unit_limit(args, args.limit)
    return run_playbook_command(args, "rollback", "playbooks/recover.yml", extra)[0]
