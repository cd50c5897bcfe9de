"""Where the controller keeps what it learnt from each SGLang release's own package.

    <root>/venv/                    one CPU-only Python shared by the releases (refenv)
    <root>/sglang-VERSION/          a release installed --no-deps, with `.ready` once usable
    <root>/catalogue/PROG-VERSION.json   its flag catalogue, read from its own parser
    <root>/verdicts/VERSION/KEY.json     its resolution pipeline's verdict on one command line
    <root>/models/KEY/config.json   a model's config.json, as the pipeline reads it

The root is `.cache/sglang-ref/` of the project, or SGLANG_FLEET_REF_DIR. Nothing here is part
of the package: a release is added on the controller (`sglang-fleet release add`), never by
changing the toolkit.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[3]


def root() -> Path:
    return Path(os.environ.get("SGLANG_FLEET_REF_DIR") or PROJECT / ".cache" / "sglang-ref")


def catalogue_file(program: str, version: str) -> Path:
    return root() / "catalogue" / f"{program}-{version}.json"


def cached_versions(program: str = "sglang") -> tuple[str, ...]:
    """Releases with a catalogue in the cache, oldest first."""
    from packaging.version import InvalidVersion, Version

    folder = root() / "catalogue"
    names = [p.name.removeprefix(f"{program}-").removesuffix(".json")
             for p in folder.glob(f"{program}-*.json")] if folder.is_dir() else []
    good = []
    for name in names:
        try:
            Version(name)
        except InvalidVersion:
            continue  # sglang-router-X.json also matches sglang-*
        good.append(name)
    return tuple(sorted(good, key=Version))


def write_text(path: Path, text: str) -> Path:
    """Whole or not at all: a reader (or a Python running the file) never sees half of it.
    The temporary name is the writer's own, so concurrent writers never share one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


@contextmanager
def locked(name: str) -> Iterator[None]:
    """One builder at a time per release: Ansible's forked workers may all ask for it."""
    path = root() / f".{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
