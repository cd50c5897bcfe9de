"""sglang-router releases learnt from their own package, as SGLang's are (known/refenv).

The router's parser (`sglang_router.router_args.RouterArgs.add_cli_args`) imports only the
standard library and the package's own Rust extension, so a release needs no environment of its
own: its wheel is installed `--no-deps` into `<root>/sglang-router-VERSION/` and probed with this
Python on PYTHONPATH. The catalogue lands beside SGLang's in the release cache
(`<root>/catalogue/sglang-router-VERSION.json`); nothing in the toolkit changes.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from sglang_fleet.known import refenv, release_cache
from sglang_fleet.router import catalogue
from sglang_fleet.router.catalogue import PROGRAM

# The first release with sglang_router/router_args.py (0.1.9 has none: its options lived in
# launch_router.py alone).
MIN_SUPPORTED = "0.2.0"


def package_dir(version: str) -> Path:
    return release_cache.root() / f"{PROGRAM}-{version}"


def name_problem(version: str) -> str | None:
    """Why `version` cannot name a router release this builder supports, before any fetch."""
    return refenv.release_name_problem(
        version, PROGRAM, MIN_SUPPORTED, "have no sglang_router.router_args "
        "(RouterArgs.add_cli_args), the parser the catalogue is read from")


def ensure(version: str, wheelhouse: Path | None = None) -> Path:
    """The release's package folder, installed from its wheel on first use. A failed install
    leaves nothing behind; the project's .venv is never written (pip's --target)."""
    problem = name_problem(version)
    if problem:
        raise refenv.RefEnvError(problem)
    target = package_dir(version)
    if (target / "sglang_router").is_dir():
        return target
    with release_cache.locked(f"{PROGRAM}-{version}"):
        if (target / "sglang_router").is_dir():
            return target
        partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            # A wheel only: its sdist builds the Rust extension, which no controller needs.
            refenv.pip_install(sys.executable, "--no-deps", "--only-binary", ":all:",
                               "--target", str(partial), f"{PROGRAM}=={version}",
                               wheelhouse=wheelhouse)
        except refenv.RefEnvError as exc:
            raise refenv.explain_install_failure(version, str(exc), wheelhouse,
                                                 package=PROGRAM) from None
        finally:
            if not (partial / "sglang_router").is_dir():
                shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


def ensure_catalogue(version: str, wheelhouse: Path | None = None) -> Path:
    """The release's catalogue on this controller: the cached one, or read from its package."""
    path = release_cache.catalogue_file(PROGRAM, version)
    if path.exists():
        return path
    try:
        dump = catalogue.probe(sys.executable, pythonpath=ensure(version, wheelhouse))
    except RuntimeError as exc:
        raise refenv.RefEnvError(str(exc)) from None
    if dump["router_version"] != version:
        raise refenv.RefEnvError(f"asked for sglang-router {version}, its package says "
                                 f"{dump['router_version']}")
    release_cache.write_json(path, dump)
    catalogue.router_catalogue.cache_clear()
    return path
