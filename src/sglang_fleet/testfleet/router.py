"""Test and benchmark helpers for the real router (sglang-router) in front of a simulated fleet."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from sglang_fleet.settings.router import BY_NAME

VERSION = BY_NAME["version"].default
# Point this at a virtualenv that already has the pinned sglang-router to skip the install.
VENV_VAR = "SGLANG_FLEET_TEST_ROUTER_VENV"


def router_venv(folder: Path) -> Path:
    """A virtualenv with the pinned sglang-router: $SGLANG_FLEET_TEST_ROUTER_VENV when set, else
    built once in `folder` (about 40 s; the role's pip step then finds it installed). Test
    workers sharing `folder` build it once: the first builds it under a lock, the others wait
    for it."""
    given = os.environ.get(VENV_VAR)
    if given:
        return Path(given)
    venv = folder / f"sglang-router-{VERSION}"
    ready = venv / ".ready"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".sglang-router-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            python = venv / "bin" / "python"
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q",
                            f"sglang-router=={VERSION}"], check=True)
            ready.touch()
    return venv


def router_workers(url: str, key: str | None = None) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answer = requests.get(f"{url}/workers", headers=headers, timeout=10)
    answer.raise_for_status()
    return answer.json()["workers"]


def registered(url: str, key: str | None = None) -> dict[str, bool]:
    """Worker URL -> is_healthy, as the router lists them."""
    return {w["url"].rstrip("/"): bool(w["is_healthy"]) for w in router_workers(url, key)}
