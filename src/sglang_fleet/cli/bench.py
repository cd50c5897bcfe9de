"""`sglang-fleet bench`: measure ready servers as bench_one_batch_server does."""

from __future__ import annotations

import argparse

from sglang_fleet.bench.report import config_row, markdown_table, write_report
from sglang_fleet.cli.common import (
    _failure_text,
    bench_extravars,
    run_folder,
    run_playbook_command,
    say,
)
from sglang_fleet.cli.inputs import parse_extra_vars


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
