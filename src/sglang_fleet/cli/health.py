"""`sglang-fleet health`: one observation and verdict per host."""

from __future__ import annotations

import argparse

from sglang_fleet.cli.common import run_playbook_command
from sglang_fleet.cli.inputs import parse_extra_vars


def cmd_health(args: argparse.Namespace) -> int:
    return run_playbook_command(args, "health", "playbooks/health.yml",
                                parse_extra_vars(args.extra_vars), require_ready=True)[0]
