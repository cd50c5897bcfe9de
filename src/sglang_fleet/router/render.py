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
from sglang_fleet.settings.router import OWNED_FLAGS

# The installed router's own parser, the one behind `sglang-router launch`.
ROUTER_PARSER = "sglang_router.launch_router:parse_router_args"


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


def router_node(spec: dict[str, Any], secrets: dict[str, str], admin_key: str = "",
                api_key: str = "") -> dict[str, Any]:
    """The router as its host is given it (sglang_router_node's `router` option): its folders
    and files as the deployment file writer takes them (the env file apart: it holds the
    secrets), its service, its install, the command its own parser checks (secrets masked),
    where it answers once started, the key its workers are read with and the client key of
    the report's request."""
    paths, service = spec["paths"], spec["service"]
    rendered = render_router_files(spec, secrets)
    files = [{"path": paths["script"], "content": rendered["script"], "mode": "0755"}]
    if rendered["unit"] is not None:
        files.append({"path": paths["unit_file"], "content": rendered["unit"], "mode": "0644"})
    return {
        "marker": spec["marker"],
        "config_hash": spec["config_hash"],
        "version": spec["version"],
        "folders": [{"path": paths["root"], "mode": "0755"},
                    {"path": paths["conf_dir"], "mode": "0750"},
                    {"path": paths["run_dir"], "mode": "0755"},
                    {"path": paths["log_dir"], "mode": "0755"}],
        "files": files,
        "secret_files": [{"path": paths["env_file"], "content": rendered["env"],
                          "mode": "0600"}],
        "service": {"manager": service["manager"], "unit_name": service["unit_name"],
                    "state_file": paths["pid_file"], "script": paths["script"],
                    "log_file": paths["log_file"], "workdir": paths["root"],
                    "user": service["user"], "stop_timeout": service["stop_timeout"]},
        "install": {"mode": spec["install"]["mode"], "python": spec["install"]["python"],
                    "router_python": spec["install"]["router_python"], "venv": paths["venv"],
                    "requirements": spec["install"]["pip_requirements"]},
        "args": spec["router_args"][1:],
        "args_parser": ROUTER_PARSER,
        "argcheck_record": f"{paths['run_dir']}/{spec['name']}.argcheck.json",
        "liveness_url": f"{spec['admin_url']}/liveness",
        "url": spec["url"],
        "admin_url": spec["admin_url"],
        "admin_key": admin_key,
        "api_key": api_key,
        "policy": spec["policy"],
        # What this start has of the router's keys (names and fingerprints, never values),
        # kept on the host at each start: a later start that would drop one is refused.
        "running_spec_file": paths["running_spec"],
        "secrets": {"names": spec["secret_env_names"], "variables": spec["secret_variables"],
                    "drops": spec["secret_drops"], "fingerprints": spec["secret_fingerprints"]},
        # The variable behind each option, for the refusal of one the installed router rejects.
        "flag_variables": dict(OWNED_FLAGS),
    }
