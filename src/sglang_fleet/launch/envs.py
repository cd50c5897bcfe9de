"""Release environments on a node: one per pinned requirement set, so that releases stand side
by side and a rollback to one still there is a restart, not an install.

A pip environment (install_mode pip, or the simulator with sglang_server_sim_pip) lives in
<root>/envs/<id>, the id a short hash of its sorted requirement lines; its marker file records
the requirements and when it last served ready (plugins/module_utils/deploy/envs.py prunes by
it). An existing interpreter, or the simulator on sglang_server_python, is the operator's: it
has no folder of ours and is never pruned.
"""

from __future__ import annotations

import hashlib
from typing import Any

PREFIX = "sglang_server_"
MARKER = "sglang-fleet-env.json"


def pip_requirements(package: str, version: str, extras: list[str] | None) -> list[str]:
    """What pip installs for a release: the pinned package, then the extra packages."""
    return [f"{package}=={version}", *list(extras or [])]


def env_id(requirements: list[str]) -> str:
    """The environment's name: the same requirement lines in any order give the same id."""
    lines = "\n".join(sorted(line.strip() for line in requirements))
    return hashlib.sha256(lines.encode()).hexdigest()[:12]


def environment(mode: str, sim_pip: bool, root: str, requirements: list[str],
                python: str) -> dict[str, Any]:
    """The LaunchSpec's install.env: kind, id, folder, marker file and server Python."""
    if mode == "pip" or (mode == "simulator" and sim_pip):
        ident = env_id(requirements)
        path = f"{root}/envs/{ident}"
        return {"kind": "pip", "id": ident, "path": path, "marker": f"{path}/{MARKER}",
                "python": f"{path}/bin/python", "requirements": list(requirements)}
    return {"kind": mode, "id": None, "path": None, "marker": None, "python": python,
            "requirements": []}


def env_of_settings(settings: dict[str, Any], defaults: dict[str, Any]) -> str | None:
    """The id of the pip environment a configuration recorded in the ledger runs on (its
    settings with the overrides applied; `defaults` for variables it does not record), or None
    when it runs on an interpreter of the operator's."""
    eff = {**settings, **(settings.get(PREFIX + "overrides") or {})}

    def get(name: str) -> Any:
        return eff.get(PREFIX + name, defaults.get(PREFIX + name))

    mode = get("install_mode")
    if not (mode == "pip" or (mode == "simulator" and get("sim_pip"))):
        return None
    return env_id(pip_requirements(get("pip_package"), get("version"),
                                   get("pip_extra_packages")))
