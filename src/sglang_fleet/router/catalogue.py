"""The option catalogue of each sglang-router release, generated from the release's own parser.

The router (the `sglang-router` wheel, the SGLang Model Gateway) parses `sglang-router launch`
with `RouterArgs.add_cli_args`, the parser that also prints `--help`. Its options are recorded
here exactly as SGLang's are (flags, destination, argparse kind, type, nargs, choices, default),
so the router role validates its settings and `sglang_router_extra_args` on the controller with
the same Catalogue code, before anything is installed:

    python -m sglang_fleet.router.catalogue write --python ROUTER_VENV/bin/python
    python -m sglang_fleet.router.catalogue check --python ROUTER_VENV/bin/python

`write` stores data/router_catalogue/sglang-router-VERSION.json; `check` exits 1 when the shipped
file differs from what the installed router reports.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from sglang_fleet.known.catalogue import Catalogue, CatalogueFiles

PROGRAM = "sglang-router"
FILES = CatalogueFiles(Path(__file__).resolve().parents[1] / "data" / "router_catalogue",
                       PROGRAM)
CATALOGUE_DIR = FILES.folder

# Runs inside the router's environment (standard library + sglang_router only). Choices that
# the Rust extension reports (tool-call parsers) come in set order: sorted, so dumps compare.
_PROBE = r"""
import argparse, json, sys
from importlib.metadata import version
from sglang_router.router_args import RouterArgs

KINDS = {"_StoreAction": "store", "_StoreTrueAction": "store_true",
         "_StoreFalseAction": "store_false", "_AppendAction": "append",
         "_StoreConstAction": "store_const", "_CountAction": "count"}
parser = argparse.ArgumentParser(prog="sglang-router launch")
RouterArgs.add_cli_args(parser, use_router_prefix=False)
options = []
for a in parser._actions:
    name = type(a).__name__
    if name == "_HelpAction":
        continue
    if name not in KINDS:
        raise SystemExit("router_catalogue: unknown argparse action %s for %s"
                         % (name, a.option_strings))
    entry = {"flags": list(a.option_strings), "dest": a.dest, "kind": KINDS[name],
             "type": None if a.type is None else getattr(a.type, "__name__", repr(a.type)),
             "nargs": a.nargs,
             "choices": None if a.choices is None else sorted(a.choices),
             "default": a.default if isinstance(a.default, (type(None), bool, int, float, str,
                                                             list)) else repr(a.default),
             "required": bool(a.required)}
    if a.const is not None:
        entry["const"] = a.const
    options.append(entry)
json.dump({"router_version": version("sglang-router"), "prog": parser.prog,
           "allow_abbrev": parser.allow_abbrev, "options": options}, sys.stdout)
"""


def catalogue_path(version: str) -> Path:
    return FILES.path(version)


def shipped_versions() -> tuple[str, ...]:
    return FILES.versions()


def known_versions() -> tuple[str, ...]:
    """Releases with a catalogue here: shipped, or read from their package on this controller
    (router.release), oldest first."""
    return FILES.known_versions()


def catalogue_source(version: str) -> Path | None:
    return FILES.source(version)


def probe(python: str, pythonpath: Path | None = None) -> dict[str, Any]:
    """The installed router's options, read from its own parser (with `pythonpath`: the
    package installed in that folder). A clean environment: some defaults come from variables
    (ATP_*, REDIS_URL) and must not leak into the catalogue."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env,
                              timeout=120)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{python} took over 120 s to describe sglang-router's options"
                           ) from None
    if proc.returncode != 0:
        raise RuntimeError(f"{python} could not describe sglang-router's options: "
                           f"{proc.stderr.strip()[-800:]}")
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(f"{python} described sglang-router's options in no JSON: "
                           f"{proc.stdout.strip()[-800:]}") from None


def write_catalogue(dump: dict[str, Any]) -> Path:
    return FILES.write(dump, dump["router_version"])


@cache
def router_catalogue(version: str) -> Catalogue:
    """One release's options, through the same Catalogue code that checks SGLang's flags (its
    messages read "SGLang router VERSION")."""
    path = catalogue_source(version)
    if path is None:
        raise KeyError(f"no catalogue for sglang-router {version}; known: "
                       f"{', '.join(known_versions()) or 'none'}")
    data = json.loads(path.read_text())
    return Catalogue({**data, "sglang_version": f"router {data['router_version']}"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.router.catalogue",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("write", "check"))
    parser.add_argument("--python", required=True,
                        help="Python of an environment with sglang-router installed")
    args = parser.parse_args(argv)
    dump = probe(args.python)
    if args.command == "write":
        print(f"wrote {write_catalogue(dump)}")
        return 0
    path = catalogue_path(dump["router_version"])
    if not path.exists() or json.loads(path.read_text()) != json.loads(json.dumps(dump)):
        print(f"{path} differs from sglang-router {dump['router_version']}'s parser: rerun "
              f"with `write`", file=sys.stderr)
        return 1
    print(f"{path}: matches the installed sglang-router {dump['router_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
