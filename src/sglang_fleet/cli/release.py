"""`sglang-fleet release`: the SGLang releases this controller has learnt from their packages.

    sglang-fleet release add 0.5.22 [--wheelhouse DIR]   build its environment and catalogue
    sglang-fleet release list                            what is cached, and where from
    sglang-fleet release diff 0.5.23 0.5.24              flags added, removed, renamed, changed

With --router, add and diff work on sglang-router releases the same way. Every command works
from the release's own package (release_cache, refenv, router.release); nothing in the toolkit
changes when a release is added.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_fleet.known import refenv, release_cache
from sglang_fleet.known.catalogue import Catalogue, catalogue, catalogue_source, known_versions
from sglang_fleet.router import catalogue as router_catalogue
from sglang_fleet.router import release as router_release

EXIT_OK, EXIT_USAGE = 0, 2


class ReleaseError(RuntimeError):
    pass


def _catalogue_of(version: str, router: bool = False) -> Catalogue:
    """A release's catalogue, built from its package first where this controller has none."""
    if router:
        if version not in router_catalogue.known_versions():
            try:
                router_release.ensure_catalogue(version)
            except refenv.RefEnvError as exc:
                raise ReleaseError(str(exc)) from None
        return router_catalogue.router_catalogue(version)
    if version not in known_versions():
        try:
            refenv.ensure_catalogue(version)
        except refenv.RefEnvError as exc:
            raise ReleaseError(str(exc)) from None
    return catalogue(version)


def cmd_add(args: argparse.Namespace) -> int:
    wheelhouse = Path(args.wheelhouse).resolve() if args.wheelhouse else None
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise ReleaseError(f"--wheelhouse {args.wheelhouse}: no such folder")
    if args.router:
        return _add_router(args.version, wheelhouse)
    started = time.monotonic()
    try:
        env = refenv.ensure(args.version, wheelhouse=wheelhouse)
        path = refenv.ensure_catalogue(args.version, wheelhouse=wheelhouse)
    except refenv.RefEnvError as exc:
        raise ReleaseError(str(exc)) from None
    data = json.loads(path.read_text())
    print(f"SGLang {args.version}: {len(data['options'])} options, "
          f"{len(data.get('environment') or [])} environment variables, read from its own "
          f"package ({time.monotonic() - started:.1f} s)")
    print(f"  catalogue:   {path}")
    print(f"  environment: {env.python} with {env.sglang_dir}")
    return EXIT_OK


def _add_router(version: str, wheelhouse: Path | None) -> int:
    started = time.monotonic()
    try:
        path = router_release.ensure_catalogue(version, wheelhouse=wheelhouse)
    except refenv.RefEnvError as exc:
        raise ReleaseError(str(exc)) from None
    data = json.loads(path.read_text())
    print(f"sglang-router {version}: {len(data['options'])} options, read from its own "
          f"package ({time.monotonic() - started:.1f} s)")
    print(f"  catalogue: {path}")
    print(f"  package:   {router_release.package_dir(version)}")
    return EXIT_OK


def _verdicts_cached(version: str) -> int:
    folder = release_cache.root() / "verdicts" / version
    return sum(1 for _ in folder.glob("*.json")) if folder.is_dir() else 0


def _origin(source: Path | None, root: Path) -> str:
    return ("built from its package" if source and source.is_relative_to(root)
            else "shipped with the toolkit")


def cmd_list(args: argparse.Namespace) -> int:
    root = release_cache.root()
    print(f"SGLang releases on this controller ({root}):")
    print(f"{'release':14} {'catalogue':28} {'environment':12} {'verdicts':>8}")
    for version in known_versions():
        origin = _origin(catalogue_source(version), root)
        ready = (root / f"sglang-{version}" / ".ready").exists()
        print(f"{version:14} {origin:28} {'ready' if ready else 'not built':12} "
              f"{_verdicts_cached(version):>8}")
    print()
    print("sglang-router releases:")
    print(f"{'release':14} {'catalogue':28}")
    for version in router_catalogue.known_versions():
        print(f"{version:14} {_origin(router_catalogue.catalogue_source(version), root):28}")
    return EXIT_OK


@dataclass
class Diff:
    old: str
    new: str
    program: str = "SGLang"
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    defaults: list[tuple[str, Any, Any]] = field(default_factory=list)
    choices: list[tuple[str, list[Any], list[Any]]] = field(default_factory=list)
    deprecated: list[str] = field(default_factory=list)


def diff(old: Catalogue, new: Catalogue) -> Diff:
    """What changed between two releases' flags. A flag is renamed where the new release
    keeps its destination under another name, or where SGLang's own replacement rule finds
    the flag it was split or prefixed into."""
    out = Diff(old.version, new.version)
    new_dests = {o.dest: o for o in new.options}
    for option in old.options:
        gone = [f for f in option.flags if f not in new.by_flag]
        if gone and option.dest in new_dests and gone == list(option.flags):
            out.renamed.append((option.name, new_dests[option.dest].name))
        elif gone:
            hint = new.replacements(gone[0])
            if hint:
                out.renamed.append((gone[0], " or ".join(hint)))
            else:
                out.removed.extend(gone)
    renamed_to = {n for _, names in out.renamed for n in names.split(" or ")}
    out.added = sorted(f for o in new.options for f in o.flags[:1]
                       if f not in old.by_flag and f not in renamed_to)
    for option in new.options:
        before = old.by_flag.get(option.name)
        if before is None:
            continue
        if before.default != option.default:
            out.defaults.append((option.name, before.default, option.default))
        if before.choices != option.choices and None not in (before.choices, option.choices):
            out.choices.append((option.name, list(before.choices or ()),
                                list(option.choices or ())))
        if option.deprecated and not before.deprecated:
            out.deprecated.append(option.name)
    return out


def _show(values: list[Any], limit: int = 12) -> str:
    text = ", ".join(str(v) for v in values[:limit])
    return text + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def print_diff(d: Diff, full: bool) -> None:
    limit = 10**6 if full else 40
    print(f"{d.program} {d.old} -> {d.new} (from each release's own parser):")
    print(f"  renamed ({len(d.renamed)}):")
    for old, new in d.renamed[:limit]:
        print(f"    {old} -> {new}")
    print(f"  removed ({len(d.removed)}):")
    for flag in d.removed[:limit]:
        print(f"    {flag}")
    print(f"  deprecated ({len(d.deprecated)}): {_show(d.deprecated, limit)}")
    print(f"  default changed ({len(d.defaults)}):")
    for flag, before, after in d.defaults[:limit]:
        print(f"    {flag}: {before!r} -> {after!r}")
    print(f"  choices changed ({len(d.choices)}):")
    for flag, before, after in d.choices[:limit]:
        gone = [c for c in before if c not in after]
        new = [c for c in after if c not in before]
        print(f"    {flag}: " + "; ".join(part for part in (
            f"dropped {_show(gone)}" if gone else "", f"added {_show(new)}" if new else "")
            if part))
    print(f"  added ({len(d.added)}): {_show(d.added, limit)}")
    if not full:
        print("  (--full lists every line)")


def cmd_diff(args: argparse.Namespace) -> int:
    d = diff(_catalogue_of(args.old, args.router), _catalogue_of(args.new, args.router))
    if args.router:
        d.program, d.old, d.new = "sglang-router", args.old, args.new
    print_diff(d, args.full)
    return EXIT_OK


def add_parser(sub: Any) -> None:
    release = sub.add_parser("release", help="SGLang releases this controller knows from their "
                                             "own packages: add, list, diff")
    rsub = release.add_subparsers(dest="release_command", required=True)
    add = rsub.add_parser("add", help="build a release's CPU-only environment and catalogue "
                                      "from its package, ahead of its first use")
    add.add_argument("version", help="an SGLang release, e.g. 0.5.22 (with --router: an "
                     "sglang-router release, e.g. 0.3.1)")
    add.add_argument("--wheelhouse", metavar="DIR", help="install from this folder of wheels "
                     "only (a controller without registry access)")
    add.add_argument("--router", action="store_true", help="an sglang-router release")
    add.set_defaults(func=cmd_add)
    listing = rsub.add_parser("list", help="the releases cached on this controller")
    listing.set_defaults(func=cmd_list)
    changes = rsub.add_parser("diff", help="flags added, removed, renamed, deprecated and "
                                           "changed in default or choices between releases")
    changes.add_argument("old")
    changes.add_argument("new")
    changes.add_argument("--full", action="store_true", help="every line, not the first 40")
    changes.add_argument("--router", action="store_true", help="sglang-router releases")
    changes.set_defaults(func=cmd_diff)
