"""sglang-fleet: the command line. Drives the playbooks through ansible-runner."""

from __future__ import annotations

import argparse
import sys
import traceback

from sglang_fleet.bench import experiments
from sglang_fleet.cli import release
from sglang_fleet.cli.bench import cmd_bench
from sglang_fleet.cli.check import cmd_check
from sglang_fleet.cli.common import UsageError, _interruption_lines
from sglang_fleet.cli.deploy import cmd_deploy
from sglang_fleet.cli.experiments.bisect import cmd_bisect
from sglang_fleet.cli.experiments.sweep import cmd_sweep
from sglang_fleet.cli.health import cmd_health
from sglang_fleet.cli.plan import cmd_plan
from sglang_fleet.cli.recover import cmd_recover, cmd_rollback
from sglang_fleet.cli.render import cmd_render
from sglang_fleet.cli.report import cmd_report
from sglang_fleet.cli.watch import cmd_watch
from sglang_fleet.cli.weights import cmd_weights
from sglang_fleet.recovery import diagnose
from sglang_fleet.runs import slices
from sglang_fleet.runs.inputs import InputError
from sglang_fleet.runs.runner import (
    Interrupted,
)
from sglang_fleet.runs.summary import (
    EXIT_INTERNAL,
    EXIT_SIGINT,
    EXIT_USAGE,
)

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
    deploy.add_argument("--canary", help="deploy this host (hosts, comma-separated, or a share "
                                         "of the servers, e.g. 10%%) first and judge it under "
                                         "live traffic against the servers still on the "
                                         "baseline; roll it back and stop the rollout when it "
                                         "fails")
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

    rollback = sub.add_parser(
        "rollback", help="drain, stop and restart servers on the configuration that was "
                         "ready before the one they run; the ledger rejects the one they ran")
    _common(rollback)
    _report_args(rollback)
    rollback.set_defaults(func=cmd_rollback)

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

    weights = sub.add_parser("weights", help="staged model weights: make a revision's manifest")
    what = weights.add_subparsers(dest="weights_command", required=True)
    manifest = what.add_parser("manifest", help="print the manifest of a model folder (every "
                                                "file's size and SHA-256, and each piece's)")
    manifest.add_argument("folder", help="the revision's folder (config.json, shards, index)")
    manifest.add_argument("--name", help="the model's name (default: the folder's name)")
    manifest.add_argument("--revision", default="", help="the revision's name")
    manifest.add_argument("--piece-size", type=int, default=16 << 20,
                          help="bytes per piece (default %(default)s)")
    manifest.set_defaults(func=cmd_weights)
    release.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except (UsageError, InputError, experiments.PlanError, slices.SliceError,
            release.ReleaseError) as exc:
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
