"""Render a RouterSpec into the files its host runs: launch script, env file (0600), systemd unit.

The same shapes as a server's (spec.render): the script loads the env file, opens the run with the
separator line in the log and refuses an empty secret. The secrets reach the router through its
own CLI entry point as names of env-file variables (router_spec.LAUNCHER), so the router's
command line, in `ps` and /proc, never holds them.
"""

from __future__ import annotations

import shlex
from typing import Any

from sglang_fleet.launch.render import HEADER, env_file, service_unit
from sglang_fleet.router.spec import SECRET_ARG


def _word(item: Any) -> str:
    if isinstance(item, dict) and "env" in item:
        return SECRET_ARG + item["env"]
    return shlex.quote(str(item))


def launch_script(spec: dict[str, Any]) -> str:
    paths = spec["paths"]
    python, dash_c, code, *args = spec["argv"]
    # One line per option with its value(s), as the router reads them.
    lines_of_args: list[str] = []
    for item in args:
        word = _word(item)
        if lines_of_args and not (isinstance(item, str) and item.startswith("--")) and \
                lines_of_args[-1].startswith("--"):
            lines_of_args[-1] += " " + word
        else:
            lines_of_args.append(word)
    command = " \\\n    ".join([f"{shlex.quote(python)} {dash_c} {shlex.quote(code)}",
                                *lines_of_args])
    return "\n".join([
        "#!/usr/bin/env bash",
        HEADER,
        f"# Router {spec['marker']}, configuration {spec['config_hash']}, sglang-router "
        f"{spec['version']}.",
        "set -euo pipefail",
        "set -a",
        f". {shlex.quote(paths['env_file'])}",
        "set +a",
        f"cd {shlex.quote(paths['root'])}",
        "printf '\\n===== sglang-fleet: start %s config %s at %s =====\\n' "
        f"{shlex.quote(spec['marker'])} {spec['config_hash']} \"$(date '+%Y-%m-%d %H:%M:%S')\"",
        *[f': "${{{name}:?is empty: refusing to start with an empty secret}}"'
          for name in spec["secret_env_names"]],
        "# sglang-router colours its log whatever NO_COLOR says: the colour codes are taken "
        "out",
        "# on the way to the log file, which then reads as plain text.",
        "exec > >(exec sed -u 's/\\x1b\\[[0-9;]*[A-Za-z]//g') 2>&1",
        "exec " + command,
        "",
    ])


def systemd_unit(spec: dict[str, Any]) -> str:
    return service_unit(
        spec, f"SGLang router {spec['marker']} (sglang-fleet, config {spec['config_hash']})")


def render_router_files(spec: dict[str, Any], secrets: dict[str, str] | None = None,
                        masked: bool = False) -> dict[str, str | None]:
    secrets = secrets or {}
    missing = [n for n in spec["secret_env_names"] if not secrets.get(n)]
    if missing and not masked:
        raise ValueError(f"the router needs the secrets {missing} but they resolve empty: set "
                         "sglang_router_api_key / sglang_router_control_plane_api_keys "
                         "(ansible-vault)")
    return {
        "script": launch_script(spec),
        "env": env_file(spec, secrets, masked=masked),
        "unit": systemd_unit(spec) if spec["service"]["manager"] == "systemd" else None,
    }
