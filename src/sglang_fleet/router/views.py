"""The RouterSpec's views: what each module that acts on a router takes from it, as
sglang_fleet.launch.views says for a server's LaunchSpec. A task gives the RouterSpec
(sglang_router__spec, or a router of `sglang_fleet_routers_of`) as the module's `from_spec`;
its action plugin (plugins/plugin_utils/spec_view.py) turns it into options here, on the
controller, so that no task maps its fields by hand. The options a task gives beside it are
its own logic (a state, a worker, a verdict) and win. A router's stop takes its RouterSpec
through sglang_service's view (launch.views.service_module_args)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_fleet.router.render import render_router_files
from sglang_fleet.router.spec import admin_key, router_secrets
from sglang_fleet.settings.router import OWNED_FLAGS

# The installed router's own parser, the one behind `sglang-router launch`.
ROUTER_PARSER = "sglang_router.launch_router:parse_router_args"


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


def secret_values_of(spec: dict[str, Any], host_vars: Any) -> dict[str, Any]:
    """The values of the RouterSpec's secret settings, by inventory variable, read from the
    router host's variables where a task needs them (never kept as a fact)."""
    return {name: host_vars.get(name) for _, name in spec["secret_variables"]}


def node_view(spec: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """sglang_router_node's options: the router as its host is given it, its env file written
    with `values` (secret_values_of: consumed on the controller, never an option of their own)."""
    return {"host_name": spec["host"],
            "router": router_node(spec, router_secrets(values),
                                  admin_key(values.get("sglang_router_control_plane_api_keys")),
                                  str(values.get("sglang_router_api_key") or ""))}


def probe_view(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_router_probe's options: where its host reaches the router, and the router as its
    report line names it."""
    return {"url": spec["admin_url"],
            "report": {"name": spec["host"], "url": spec["url"], "version": spec["version"],
                       "policy": spec["policy"]}}


def member_view(spec: dict[str, Any], key_from_host: bool = False) -> dict[str, Any]:
    """sglang_router_member's options: the router's API and metrics, and how long its joins
    and drains may take. `key_from_host` (a stop, which may find the inventory's keys refused):
    the admin key the router was started with is read from its env file on its host when the
    task gives none."""
    membership = spec["membership"]
    view = {"router_url": spec["admin_url"], "router_metrics_url": spec["metrics_url"],
            "join_timeout": membership["join_timeout"],
            "drain_timeout": membership["drain_timeout"],
            "drain_poll_interval": membership["drain_poll_interval"]}
    if key_from_host:
        view["admin_key_file"] = spec["paths"]["env_file"]
    return view


def _yes(value: Any) -> bool:
    # A task's flag, as YAML or a template gives it ("False" is no).
    return value is True or str(value).strip().lower() in ("true", "yes", "on", "1")


# Module -> its view of (the RouterSpec, the task's options), looked up by its action plugin.
View = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
VIEWS: dict[str, View] = {
    "sglang_router_node": lambda spec, args: node_view(spec, dict(args.get("secret_values")
                                                                  or {})),
    "sglang_router_probe": lambda spec, args: probe_view(spec),
    "sglang_router_member": lambda spec, args: member_view(spec,
                                                           _yes(args.get("key_from_host"))),
}
# The options a view consumes on the controller: never sent to the node.
CONTROLLER_OPTIONS: dict[str, tuple[str, ...]] = {
    "sglang_router_node": ("secret_values",),
    "sglang_router_member": ("key_from_host",),
}
