"""sglang-fleet: the command line. Drives the playbooks through ansible-runner."""

from __future__ import annotations

import argparse
import sys

from sglang_fleet.runner import failures, playbook_run, task_results

EXIT_OK = 0
EXIT_HOSTS_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 4

RENDER_TASK = "Show the rendered files (secrets masked)"


def cmd_render(args: argparse.Namespace) -> int:
    with playbook_run("playbooks/render.yml", inventory=args.inventory, limit=args.host) as run:
        results = task_results(run, RENDER_TASK)
        problems = failures(run)
    if args.host not in results:
        if problems:
            for host, task, msg in problems:
                print(f"{host}: {task}:\n{msg}", file=sys.stderr)
            return EXIT_USAGE
        print(f"host {args.host!r} is not in the sglang_servers group of inventory "
              f"{args.inventory or '(default)'}", file=sys.stderr)
        return EXIT_USAGE
    msg = results[args.host]["msg"]
    spec, files = msg["spec"], msg["files"]
    print(f"# {spec['host']}: deployment {spec['deployment']}, config {spec['config_hash']}, "
          f"SGLang {spec['sglang_version']}, install {spec['install']['mode']}, "
          f"service {spec['service']['manager']}")
    print(f"# ---- {spec['paths']['script']}")
    print(files["script"], end="")
    print(f"# ---- {spec['paths']['env_file']} (mode 0600, secrets masked)")
    print(files["env"], end="")
    if files.get("unit"):
        print(f"# ---- {spec['paths']['unit_file']}")
        print(files["unit"], end="")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-fleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render", help="print the launch files deploy would write for HOST")
    render.add_argument("-i", "--inventory", help="inventory path (default: ansible.cfg's)")
    render.add_argument("host")
    render.set_defaults(func=cmd_render)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except FileNotFoundError as exc:
        print(f"sglang-fleet: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    sys.exit(code)
