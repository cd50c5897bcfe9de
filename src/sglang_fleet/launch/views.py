"""The LaunchSpec's shape and its views: what each module that acts on a deployment takes from
it. A task gives the LaunchSpec (or a deployment's identity) as the module's `from_spec`; the
module's action plugin (sglang_fleet.launch.action) turns it into options here, on the
controller, so that no playbook maps its fields by hand and one file says what every module
reads. The options a task gives beside `from_spec` are its own logic (a timeout, a verdict).

A LaunchSpec carries `schema`, the version of this shape. A LaunchSpec recorded on a node by a
release from before the field existed has the shape of schema 1 (recovery reads such a record
when the inventory no longer builds); one of a newer schema is refused, naming both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from sglang_fleet.node.deploy.lock import lease_for

# The version of the LaunchSpec's shape: raise it when a field a view reads moves or changes
# meaning, and teach the views to read the older shape while nodes still record it.
SCHEMA = 1


class LaunchSpec(TypedDict):
    """One host's LaunchSpec, as spec.build_launch_spec returns it (nested parts as mappings:
    their fields are the views' business, below)."""

    schema: int
    host: str
    deployment: str
    marker: str
    config_hash: str
    sglang_version: str
    argv: list[str]
    config_options: list[list[str]]
    server_args: list[str]
    env: dict[str, str]
    secret_env_names: list[str]
    secret_variables: list[list[str]]
    secret_fingerprints: dict[str, str]
    secret_drops: list[str]
    service: dict[str, Any]
    paths: dict[str, Any]
    install: dict[str, Any]
    gpu: dict[str, Any]
    model: dict[str, Any]
    group: dict[str, Any]
    http: dict[str, Any]
    binds: dict[str, Any]
    pd: dict[str, Any] | None
    weights_from_instance: dict[str, Any] | None
    facts: dict[str, Any]
    settings: dict[str, Any]
    gate: dict[str, Any]
    allowed_rules: list[str]
    sim: dict[str, Any] | None
    kernel_cache: dict[str, Any] | None


class Identity(TypedDict):
    """A deployment's identity (spec.build_identity): the LaunchSpec's fields that name it,
    all that a stop or a removal from the routers reads."""

    schema: int
    host: str
    deployment: str
    marker: str
    paths: dict[str, Any]
    service: dict[str, Any]
    group: dict[str, Any]
    http: dict[str, Any]
    settings: dict[str, Any]  # the listen address only


def schema_problem(spec: Any, kind: str = "LaunchSpec") -> str | None:
    """Why `spec` is not a LaunchSpec (or identity) these views read, or None. `kind`: what
    the module takes (a router's modules take a RouterSpec, which has the first shape)."""
    if not isinstance(spec, dict):
        return f"must be a {kind} (a mapping), got {type(spec).__name__}"
    schema = spec.get("schema", 1)  # recorded before the field existed: the first shape
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        return f"has schema {schema!r}, which is not a LaunchSpec schema (a positive integer)"
    if schema > SCHEMA:
        return (f"is a LaunchSpec of schema {schema}, newer than this release of sglang-fleet "
                f"reads (schema {SCHEMA}): run the release that built it, or rebuild it with "
                f"this one")
    return None


# ---- the options the modules share (plugins/module_utils/common/args.py) ----------------

def deployment_view(spec: dict[str, Any]) -> dict[str, Any]:
    """The options naming a deployment's processes and service (DEPLOYMENT_ARGS)."""
    return {"marker": spec["marker"], "state_file": spec["paths"]["pid_file"],
            "manager": spec["service"]["manager"], "unit_name": spec["service"]["unit_name"]}


def gpu_view(spec: dict[str, Any]) -> dict[str, Any]:
    """The options naming where its GPU facts come from (GPU_ARGS)."""
    return {"gpu_backend": spec["gpu"]["backend"], "sim_dir": spec["gpu"]["sim_dir"]}


# ---- the gate and the node check ---------------------------------------------------------

# The gate's stack sampling options (sglang_health's), as the LaunchSpec's gate view holds them.
STACK_OPTIONS = ("stack_sampling", "py_spy", "stack_interval", "stack_window")


def lock_lease(spec: dict[str, Any], hosts: Any = 1, forks: Any = 1) -> float:
    """The lease a run declares on a deployment's lock: its gate's whole budget for each wave
    of `forks` hosts among the play's `hosts` (see module_utils/deploy/lock.lease_for)."""
    gate = spec["gate"]
    return lease_for(float(gate["max_polls"]) * float(gate["poll_interval"]), hosts, forks)


def gate_module_args(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_health's options for a LaunchSpec's server (wait and poll excepted), as
    sglang_node takes them to observe a server that runs unchanged."""
    return {
        **deployment_view(spec),
        **gpu_view(spec),
        "log_file": spec["paths"]["log_file"],
        "gate_state_file": spec["gate"]["state_file"],
        "host": spec["gate"]["host"],
        "port": spec["http"]["port"],
        "serves_http": spec["group"]["serves_http"],
        # A prefill's rank 0 runs the KV bootstrap server (in its tokenizer process).
        "bootstrap_port": spec["pd"]["bootstrap_port"] if spec.get("pd") and
        spec["pd"]["mode"] == "prefill" and spec["group"]["serves_http"] else None,
        "health_timeout": spec["gate"]["health_timeout"],
        "kernel_log": spec["gate"]["kernel_log"],
        "cuda_graph": spec["facts"]["cuda_graph"],
        "stall_windows": spec["gate"]["stall_windows"],
        "ceilings": spec["gate"]["ceilings"],
        # A LaunchSpec recorded before these fields existed samples with the module's defaults.
        **{k: spec["gate"][k] for k in STACK_OPTIONS if k in spec["gate"]},
    }


def argcheck_record(spec: dict[str, Any]) -> str:
    """Where the node records the arguments the installed SGLang parsed (sglang_argcheck)."""
    return f"{spec['paths']['run_dir']}/{spec['deployment']}.argcheck.json"


def node_module_args(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_node's options that follow from the LaunchSpec alone; the files, the gate, the
    lock, the write and the start depend on the run and are the task's."""
    paths, model, gpu = spec["paths"], spec["model"], spec["gpu"]
    # sglang_node's `service` is sglang_service's view with the user under its own name and
    # no stop timeout (the node check never stops a server).
    service = service_module_args(spec)
    service["user"] = service.pop("service_user")
    del service["stop_timeout"]
    return {
        **gpu_view(spec),
        "host_name": spec["host"],
        "server_python": spec["install"]["server_python"],
        "reboot_mark": paths["reboot_mark"],
        "gpu_count": gpu["count"],
        "compute_capability": gpu["compute_capability"],
        "sim": {**spec["sim"], "model_dir": model["path"], "family": model["family"],
                "shm_dir": paths["shm_dir"]} if spec["sim"] else None,
        "running_spec_file": paths["running_spec"],
        "settings": spec["settings"],
        "secrets": {"names": spec["secret_env_names"], "variables": spec["secret_variables"],
                    "drops": spec["secret_drops"]},
        "model": {"path": model["path"], **model["check"]},
        "shm_dir": paths["shm_dir"],
        "service": service,
        "argcheck_record": argcheck_record(spec),
        "args_parser": spec["install"]["args_parser"],
        "args": spec["server_args"],
    }


# ---- the service -------------------------------------------------------------------------

def service_module_args(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_service's options naming a LaunchSpec's (or an identity's) server and its
    service: all a stop needs; a start adds start_module_args. A RouterSpec names its router
    the same way (one process group, no multi-node group: node rank 0)."""
    service, paths = spec["service"], spec["paths"]
    return {
        **deployment_view(spec),
        "service_user": service["user"],
        "node_rank": (spec.get("group") or {}).get("node_rank", 0),
        "script": paths["script"],
        "log_file": paths["log_file"],
        "workdir": paths["root"],
        "stop_timeout": service["stop_timeout"],
    }


def start_module_args(spec: dict[str, Any], group_hosts: list[str] | None = None
                      ) -> dict[str, Any]:
    """What a start of a LaunchSpec's server needs besides its service (sglang_service's
    options of that name), as the service step and sglang_node's `start` take them.
    `group_hosts`: the inventory hosts of its multi-node group, whose nodes may hold its port
    on a shared machine."""
    paths, argv = spec["paths"], spec["argv"]
    pd = spec.get("pd") or {}
    return {
        "config_files": [paths["script"], paths["env_file"], paths["config_file"]]
        + ([paths["unit_file"]] if paths["unit_file"] else []),
        "config_hash": spec["config_hash"],
        "launch_spec": spec,
        "running_spec_file": paths["running_spec"],
        "baseline_file": paths["baseline_file"],
        "host": argv[argv.index("--host") + 1] if "--host" in argv else "",
        "port": spec["http"]["port"],
        # A prefill's KV bootstrap server binds beside the HTTP server, on the same address.
        "bootstrap_port": pd["bootstrap_port"] if pd.get("mode") == "prefill" else None,
        "group_markers": [f"{host}:{spec['deployment']}" for host in group_hosts or ()]
        if spec["group"]["name"] else [],
        "model_path": spec["model"]["path"],
    }


def pending_start_args(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_service's options for asking (in check mode) whether a start would (re)start
    the server: its service and the launch files whose change restarts it."""
    view = service_module_args(spec)
    del view["workdir"], view["stop_timeout"]  # a question starts and stops nothing
    # The same files as the start's digest (start_module_args): with fewer, a running server
    # with secret options would always read as about to restart, and be drained for nothing.
    view["config_files"] = start_module_args(spec)["config_files"]
    return view


# ---- the lock ------------------------------------------------------------------------------

def lock_view(spec: dict[str, Any], state: str = "acquired", purpose: str = "change",
              hosts: Any = 1, forks: Any = 1) -> dict[str, Any]:
    """sglang_lock's options for a deployment's lock. A run that takes it for a LaunchSpec
    declares its gate's lease; a stop (an identity, with no gate) keeps the module's own."""
    view: dict[str, Any] = {"path": spec["paths"]["recover_lock"], "name": spec["marker"]}
    if state == "acquired" and purpose != "stop" and "gate" in spec:
        view["lease"] = lock_lease(spec, hosts, forks)
    return view


# ---- the launch files and their parse ----------------------------------------------------

def argcheck_view(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_argcheck's options: the installed SGLang's parser, the server's own arguments
    and the record sglang_node compares with them."""
    return {"python": spec["install"]["server_python"], "parser": spec["install"]["args_parser"],
            "args": spec["server_args"], "record_file": argcheck_record(spec)}


def deployment_files_view(spec: dict[str, Any], secret_values: dict[str, str]
                          ) -> dict[str, Any]:
    """sglang_deployment_files' options: the deployment's folders and files, rendered with the
    secrets' values (on the controller: they never become an option of their own)."""
    from sglang_fleet.launch.render import deployment_files

    files = deployment_files(spec, secret_values)
    return {"folders": files["folders"], "files": files["files"],
            "secret_files": files["secret_files"]}


# ---- recovery: evidence, stop, cleanup -----------------------------------------------------

def _running_spec_file(spec: dict[str, Any]) -> str:
    # A LaunchSpec a node recorded before `running_spec` was a path of its own.
    paths = spec["paths"]
    return paths.get("running_spec") or \
        f"{paths['run_dir']}/{spec['deployment']}.running-spec.json"


def evidence_view(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_evidence's options: where the deployment's processes, log and GPUs are, and the
    LaunchSpec itself (kept in the bundle when the node recorded none)."""
    paths = spec["paths"]
    return {
        **deployment_view(spec),
        **gpu_view(spec),
        "log_file": paths["log_file"],
        "evidence_dir": paths["evidence_dir"],
        "launch_spec": spec,
        "running_spec_file": _running_spec_file(spec),
        "kernel_log": spec["gate"]["kernel_log"],
        "server_python": spec["install"]["server_python"],
    }


def stop_view(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_stop's options: the deployment's processes and service, its GPUs, the baseline
    they are verified free against and the reboot mark it leaves when they are not."""
    paths = spec["paths"]
    return {
        **deployment_view(spec),
        **gpu_view(spec),
        "service_user": spec["service"]["user"],
        "node_rank": spec["group"]["node_rank"],
        "log_file": paths["log_file"],
        "baseline_file": paths["baseline_file"],
        "reboot_mark": paths["reboot_mark"],
    }


def shm_cleanup_view(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_shm_cleanup's options: the stopped run's shared-memory folder, and what tells its
    segments from everyone else's."""
    return {"shm_dir": spec["paths"]["shm_dir"], "state_file": spec["paths"]["pid_file"],
            "marker": spec["marker"], "service_user": spec["service"]["user"]}


def kernel_cache_places(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_kernel_cache's options: the key and the node's folders of the server's kernel
    caches (sglang_server_kernel_cache), and who owns the live folder."""
    view = spec.get("kernel_cache")  # absent from a LaunchSpec recorded before it existed
    if not view:
        raise ValueError("kernel_cache: sglang_server_kernel_cache is off for this server")
    return {"root": spec["paths"]["root"], "key": view["key"], "live": view["live"],
            "snapshots": view["snapshots"], "user": spec["service"]["user"]}


def env_view(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_env's options: the server's pip release environment (launch/envs.py) and how
    many of them the node keeps."""
    env = spec["install"]["env"]
    if env["kind"] != "pip":
        raise ValueError(f"install.env: a server on install mode {env['kind']} has no "
                         "release environment of its own")
    return {"envs_dir": spec["paths"]["envs_dir"], "env_id": env["id"],
            "requirements": env["requirements"], "keep": spec["install"]["env_keep"]}


# ---- routers and benchmarks ----------------------------------------------------------------

def port_owner_view(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_port_owner's options: the server's port and listen address, and its marker."""
    return {"port": spec["http"]["port"],
            "host": (spec.get("settings") or {}).get("sglang_server_host") or "",
            "marker": spec["marker"]}


def bench_view(spec: dict[str, Any]) -> dict[str, Any]:
    """sglang_bench's options: where the node reaches the server, and the env file holding
    its API key."""
    return {"host": spec["gate"]["host"], "port": spec["http"]["port"],
            "env_file": spec["paths"]["env_file"]}


# ---- the modules whose action plugin is plugins/plugin_utils/spec_view.py's -----------------

View = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def _of_spec(view: Callable[[dict[str, Any]], dict[str, Any]]) -> View:
    return lambda spec, args: view(spec)


# Module -> its view of (the LaunchSpec, the task's options), looked up by its action plugin.
VIEWS: dict[str, View] = {
    "sglang_argcheck": _of_spec(argcheck_view),
    "sglang_deployment_files": lambda spec, args: deployment_files_view(
        spec, dict(args.get("secret_values") or {})),
    "sglang_evidence": _of_spec(evidence_view),
    "sglang_stop": _of_spec(stop_view),
    "sglang_shm_cleanup": _of_spec(shm_cleanup_view),
    "sglang_port_owner": _of_spec(port_owner_view),
    "sglang_bench": _of_spec(bench_view),
    "sglang_kernel_cache": _of_spec(kernel_cache_places),
    "sglang_env": _of_spec(env_view),
}
# The options a view consumes on the controller: never sent to the node.
CONTROLLER_OPTIONS: dict[str, tuple[str, ...]] = {"sglang_deployment_files": ("secret_values",)}
