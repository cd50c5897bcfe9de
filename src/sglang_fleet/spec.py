"""The LaunchSpec: everything needed to start one server on one node, built in this one place.

Input is the host's `sglang_server_*` variables (role defaults already applied by Ansible, or
loaded from the role's defaults file by tests). Output is a plain dict, so that Ansible facts,
the CLI and the simulator all carry the same structure, plus a list of errors that each name the
host, the variable, the bad value and the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from sglang_fleet.catalog import nccl_did_you_mean, nccl_variable_names, sglang_versions
from sglang_fleet.rules import matching_rules
from sglang_fleet_node.sglang_fleet_vocab import PHASES, default_windows

PREFIX = "sglang_server_"
MARKER_VAR = "SGLANG_FLEET_DEPLOYMENT"
CONFIG_VAR = "SGLANG_FLEET_CONFIG"
API_KEY_VAR = "SGLANG_FLEET_API_KEY"
HF_TOKEN_VAR = "HF_TOKEN"

INSTALL_MODES = ("pip", "existing", "simulator")
SERVICE_MANAGERS = ("systemd", "supervisor")
MODEL_FAMILIES = ("MLA", "MHA")
INTERCONNECTS = ("pcie", "nvlink")

_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True,
               "false": False, "no": False, "off": False, "0": False}
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# NCCL takes words, numbers and comma lists; anything else is a typo or an injection.
_NCCL_VALUE = re.compile(r"[A-Za-z0-9_.,:/+-]{1,256}")
_DEPLOYMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Flags the toolkit renders from its own variables: setting them in extra_args would fight them.
_RENDERED_FLAGS = {
    "--model-path": "model_path",
    "--served-model-name": "served_model_name",
    "--tp-size": "tp",
    "--tp": "tp",
    "--dp-size": "dp",
    "--dp": "dp",
    "--nnodes": "group",
    "--node-rank": "group",
    "--dist-init-addr": "group",
    "--host": "host",
    "--port": "port",
    "--attention-backend": "attention_backend",
    "--num-continuous-decode-steps": "num_continuous_decode_steps",
    "--disable-custom-all-reduce": "disable_custom_all_reduce",
    "--mem-fraction-static": "mem_fraction_static",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--api-key": "api_key",
    "--enable-metrics": "enable_metrics",
    "--trust-remote-code": "trust_remote_code",
    "--quantization": "quantization",
}


SECRET_SETTINGS = (PREFIX + "api_key", PREFIX + "hf_token")


# The inventory variable behind each LaunchSpec fact that Rules match on.
FACT_OF_SETTING = {
    PREFIX + "attention_backend": "attention_backend", PREFIX + "model_family": "model_family",
    PREFIX + "gpu_compute_capability": "compute_capability",
    PREFIX + "interconnect": "interconnect", PREFIX + "tp": "tp",
    PREFIX + "disable_custom_all_reduce": "custom_all_reduce",
    PREFIX + "cuda_graph": "cuda_graph", PREFIX + "version": "sglang_version",
}

# Facts the role publishes under its own prefix: outputs, never inputs of a LaunchSpec.
OUTPUT_FACTS = (PREFIX + "launch_spec", PREFIX + "verdict")


def public_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The sglang_server_* settings without the secrets: safe for facts, ledgers, reports."""
    return {k: v for k, v in settings.items()
            if k.startswith(PREFIX) and k not in SECRET_SETTINGS
            and k not in OUTPUT_FACTS and not k.startswith(PREFIX + "_")}


@dataclass(frozen=True)
class SpecError:
    host: str
    variable: str
    value: Any
    problem: str
    fix: str

    def __str__(self) -> str:
        shown = repr(self.value)
        if len(shown) > 120:  # a huge value is named, not pasted
            shown = f"{shown[:100]}... ({len(shown)} characters)"
        return f"host {self.host}: {self.variable}={shown}: {self.problem}. Fix: {self.fix}"


class _Checker:
    """Collects every error at once so an operator fixes an inventory in one pass."""

    def __init__(self, host: str, settings: dict[str, Any]):
        self.host = host
        self.settings = settings
        self.errors: list[SpecError] = []
        self.warnings: list[str] = []

    def get(self, short: str) -> Any:
        return self.settings.get(PREFIX + short)

    def error(self, short: str, problem: str, fix: str, value: Any = None) -> None:
        name = short if short.startswith(PREFIX) or short.isupper() else PREFIX + short
        shown = self.get(short) if value is None else value
        self.errors.append(SpecError(self.host, name, shown, problem, fix))

    def integer(self, short: str, low: int, high: int) -> int | None:
        value = self.get(short)
        # `-e name=8` arrives as a string; accept what Ansible's own type checks accept.
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,12}", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(short, "must be an integer", f"set an integer between {low} and {high}")
            return None
        if not low <= value <= high:
            self.error(short, f"out of range {low}..{high}", f"set a value in {low}..{high}")
            return None
        return value

    def boolean(self, short: str) -> bool:
        value = self.get(short)
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        if not isinstance(value, bool):
            self.error(short, "must be a boolean", "set true or false (unquoted)")
            return False
        return value

    def text(self, short: str, required: bool = True) -> str | None:
        value = self.get(short)
        if value is None or value == "":
            if required:
                self.error(short, "is required", "set it in the inventory")
            return None
        if not isinstance(value, str):
            self.error(short, f"must be a string, got {type(value).__name__}", "quote the value")
            return None
        if "\n" in value or "\x00" in value:
            self.error(short, "contains a newline or NUL byte", "remove control characters")
            return None
        return value

    def choice(self, short: str, choices: tuple[str, ...] | list[str]) -> str | None:
        value = self.get(short)
        if value not in choices:
            self.error(short, "is not a valid choice", f"use one of: {', '.join(choices)}")
            return None
        return value


def _compute_capability(value: Any) -> str:
    # "12.0", 12.0 and 12 all mean SM120; normalise to "major.minor".
    text = str(value)
    return text if "." in text else f"{text}.0"


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def config_hash(spec_core: dict[str, Any]) -> str:
    """A stable name for a configuration: same inputs, same hash, secrets excluded."""
    blob = json.dumps(spec_core, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_launch_spec(
    settings: dict[str, Any],
    host: str,
    group_members: list[str] | None = None,
    dist_init_host: str | None = None,
) -> dict[str, Any]:
    """Build and validate one host's LaunchSpec.

    Returns {"ok": bool, "errors": [str], "error_details": [...], "warnings": [str],
    "spec": dict or None}. group_members is the sorted membership of the host's
    `sglang_server_group` (None for a single-node server); dist_init_host is the address of
    the group's rank 0.
    """
    c = _Checker(host, settings)

    version = str(c.get("version"))
    catalog = sglang_versions()
    if version not in catalog:
        c.error("version", "is not a SGLang release this toolkit knows",
                f"pin one of: {', '.join(catalog)}")
        return _result(c, None)
    release = catalog[version]

    model_path = c.text("model_path")
    served = c.text("served_model_name", required=False)
    if served is None and model_path:
        served = model_path.rstrip("/").split("/")[-1]
    family = c.choice("model_family", MODEL_FAMILIES)
    c.integer("model_size_b", 1, 100_000)
    trust_remote_code = c.boolean("trust_remote_code")
    quantization = c.text("quantization", required=False)

    c.text("gpu_model")
    cc_raw = c.get("gpu_compute_capability")
    cc = _compute_capability(cc_raw)
    if not re.fullmatch(r"\d{1,2}\.\d", cc):
        c.error("gpu_compute_capability", "is not a compute capability",
                'write it as "major.minor", e.g. "12.0" for RTX PRO 6000 Blackwell')
    gpu_count = c.integer("gpu_count", 1, 64)
    interconnect = c.choice("interconnect", INTERCONNECTS)

    tp = c.integer("tp", 1, 1024)
    dp = c.integer("dp", 1, 1024)
    nnodes = 1
    node_rank = 0
    dist_init_addr = None
    group = c.get("group")
    if group:
        members = list(group_members or [])
        if host not in members:
            c.error("group", f"host is not a member of inventory group {group!r}",
                    "add the host to that group or unset sglang_server_group")
        else:
            nnodes = len(members)
            explicit_rank = c.get("node_rank")
            node_rank = members.index(host) if explicit_rank is None else explicit_rank
            if not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
                c.error("node_rank", f"must be in 0..{nnodes - 1} for a {nnodes}-node group",
                        "unset it to derive ranks from group order")
        port = c.integer("dist_init_port", 1, 65535)
        if not dist_init_host:
            c.error("dist_init_host", "no address for the group's rank 0",
                    "set sglang_server_dist_init_host or ansible_host on the first member")
        elif port:
            dist_init_addr = f"{dist_init_host}:{port}"
    elif c.get("node_rank") is not None:
        c.error("node_rank", "a node rank without a multi-node group contradicts itself",
                "set sglang_server_group to the group's inventory name, or unset node_rank")

    if tp and dp and gpu_count:
        if tp % nnodes:
            c.error("tp", f"is not divisible by the group's {nnodes} nodes",
                    f"use a multiple of {nnodes}")
        elif (tp // nnodes) * dp > gpu_count:
            c.error("tp", f"tp x dp = {tp * dp} needs {(tp // nnodes) * dp} GPUs per node but "
                    f"sglang_server_gpu_count is {gpu_count} (nodes in group: {nnodes})",
                    f"lower tp/dp, or add nodes to sglang_server_group "
                    f"(tp x dp <= {gpu_count * nnodes})")
        elif (tp // nnodes) * dp < gpu_count:
            c.warnings.append(f"host {host}: tp x dp uses {(tp // nnodes) * dp} of "
                              f"{gpu_count} GPUs per node")

    backend = c.get("attention_backend")
    if backend is not None:
        backends = release["attention_backends"]
        if backend not in backends:
            import difflib

            close = difflib.get_close_matches(str(backend), backends, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            c.error("attention_backend", f"is not an attention backend of SGLang {version}",
                    f"{hint}valid: {', '.join(backends)}; or null for SGLang's default")
    # SGLang's own default: MLA models get triton (SM120 and elsewhere safe), MHA get flashinfer.
    effective_backend = backend or ("triton" if family == "MLA" else "flashinfer")

    steps = c.integer("num_continuous_decode_steps", 1, 64)
    disable_car = c.boolean("disable_custom_all_reduce")
    cuda_graph = c.boolean("cuda_graph")
    max_bs = c.get("cuda_graph_max_bs")
    if max_bs is not None:
        max_bs = c.integer("cuda_graph_max_bs", 1, 4096)
    mem_frac = c.get("mem_fraction_static")
    if isinstance(mem_frac, str):
        with contextlib.suppress(ValueError):
            mem_frac = float(mem_frac)
    if mem_frac is not None and (
        isinstance(mem_frac, bool) or not isinstance(mem_frac, int | float)
        or not 0 < float(mem_frac) < 1
    ):
        c.error("mem_fraction_static", "must be a number between 0 and 1",
                "e.g. 0.85, or null for SGLang's default")
        mem_frac = None
    kv_dtype = c.text("kv_cache_dtype")
    listen_host = c.text("host")
    port = c.integer("port", 1, 65535)
    enable_metrics = c.boolean("enable_metrics")
    api_key = c.get("api_key") or ""
    hf_token = c.get("hf_token") or ""
    for secret in ("api_key", "hf_token"):
        value = c.get(secret)
        if value not in (None, "") and (not isinstance(value, str) or "\n" in value):
            c.error(secret, "must be a one-line string", "quote the secret (use ansible-vault)",
                    value="<secret>")

    extra_args = c.get("extra_args") or []
    if not isinstance(extra_args, list) or not all(isinstance(a, str) for a in extra_args):
        c.error("extra_args", "must be a list of strings", 'e.g. ["--log-level", "info"]')
        extra_args = []
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if "\n" in arg or "\x00" in arg:
            c.error("extra_args", "an argument contains a newline or NUL byte",
                    "remove control characters", value=arg)
        elif flag in release["removed_flags"]:
            c.error("extra_args", f"{flag} was removed in SGLang {version}",
                    release["removed_flags"][flag], value=arg)
        elif flag in release["deprecated_flags"]:
            c.warnings.append(f"host {host}: {flag} is deprecated in SGLang {version}: "
                              f"{release['deprecated_flags'][flag]}")
        elif flag in _RENDERED_FLAGS:
            c.error("extra_args", f"{flag} is rendered by the toolkit",
                    f"set {PREFIX}{_RENDERED_FLAGS[flag]} instead", value=arg)

    env: dict[str, str] = {}
    nccl = c.get("nccl_profile") or {}
    if not isinstance(nccl, dict):
        c.error("nccl_profile", "must be a mapping of NCCL_* variables",
                "e.g. {NCCL_P2P_LEVEL: SYS}")
        nccl = {}
    known = nccl_variable_names()
    for name, value in nccl.items():
        if not str(name).startswith("NCCL_"):
            c.error("nccl_profile", f"{name} is not an NCCL variable",
                    "move it to sglang_server_extra_env", value=name)
        elif name not in known:
            guess = nccl_did_you_mean(name)
            fix = f"did you mean {guess}?" if guess else "check the NCCL environment docs"
            c.error("nccl_profile", f"{name} is not a known NCCL variable", fix, value=name)
        elif not _NCCL_VALUE.fullmatch(_env_value(value)):
            c.error("nccl_profile", f"{name}={value!r} is not a plain NCCL value",
                    "use a word or number such as SYS, LL or 8", value=value)
        else:
            env[name] = _env_value(value)
    extra_env = c.get("extra_env") or {}
    if not isinstance(extra_env, dict):
        c.error("extra_env", "must be a mapping", "e.g. {SGLANG_ENABLE_JIT_DEEPGEMM: 0}")
        extra_env = {}
    for name, value in extra_env.items():
        if not _ENV_NAME.match(str(name)) or name in (MARKER_VAR, CONFIG_VAR, API_KEY_VAR):
            c.error("extra_env", f"{name!r} is not a usable environment variable name",
                    "use UPPER_CASE names; the SGLANG_FLEET_* names are reserved", value=name)
        elif name.startswith("NCCL_"):
            c.error("extra_env", f"{name} belongs in the NCCL profile",
                    "move it to sglang_server_nccl_profile", value=name)
        elif "\n" in str(value) or "\x00" in str(value):
            c.error("extra_env", f"value of {name} contains a newline or NUL byte",
                    "remove control characters", value=name)
        else:
            env[name] = _env_value(value)

    install_mode = c.choice("install_mode", INSTALL_MODES)
    manager = c.choice("service_manager", SERVICE_MANAGERS)
    root = c.text("root")
    if root and not root.startswith("/"):
        c.error("root", "must be an absolute path", "e.g. /opt/sglang-fleet")
    python = c.text("python")
    stop_timeout = c.integer("stop_timeout", 1, 3600)
    deployment = c.get("deployment_name") or (f"{served}-{port}" if served and port else None)
    if deployment is not None and not _DEPLOYMENT_NAME.match(str(deployment)):
        c.error("deployment_name", "must be 1-63 characters of letters, digits, '.', '_', '-'",
                "set sglang_server_deployment_name explicitly", value=deployment)

    facts = {
        "attention_backend": effective_backend,
        "model_family": family,
        "compute_capability": cc,
        "interconnect": interconnect,
        "tp": tp,
        "custom_all_reduce": not disable_car,
        "cuda_graph": cuda_graph,
        "sglang_version": version,
    }
    allowed = c.get("allow_rules") or []
    matched = matching_rules(facts)
    for rule in matched:
        if rule.id not in allowed:
            c.error(rule.fix_variable, f"matches known-bad {rule.describe()}",
                    f"set {rule.fix_variable}: {rule.fix_value!r}, or deploy anyway with "
                    f"sglang_server_allow_rules: [{rule.id}]",
                    value=c.get(rule.fix_variable.removeprefix(PREFIX)))
        else:
            c.warnings.append(f"host {host}: deploying despite {rule.id} "
                              f"(allowed by sglang_server_allow_rules)")

    windows, ceilings = default_windows(c.get("model_size_b"))
    for short, target in (("gate_stall_windows", windows), ("gate_ceilings", ceilings)):
        overrides = c.get(short) or {}
        if not isinstance(overrides, dict):
            c.error(short, "must map phases to seconds", "e.g. {capturing_cuda_graph: 900}")
            continue
        for phase, seconds in overrides.items():
            if phase not in PHASES[:-1]:
                c.error(short, f"{phase!r} is not a start-up phase",
                        f"use one of: {', '.join(PHASES[:-1])}", value=phase)
            elif isinstance(seconds, bool) or not isinstance(seconds, int | float) \
                    or seconds <= 0:
                c.error(short, f"{phase} must be a positive number of seconds",
                        "e.g. 300", value=seconds)
            else:
                target[phase] = seconds
    poll = c.integer("gate_poll_interval", 1, 300)
    health_timeout = c.integer("health_timeout", 21, 600)

    if c.errors:
        return _result(c, None)

    assert root and python and served and port and deployment  # narrowed by the checks above
    paths = {
        "root": root,
        "conf_dir": f"{root}/conf",
        "run_dir": f"{root}/run",
        "log_dir": f"{root}/logs",
        "script": f"{root}/conf/{deployment}.launch.sh",
        "env_file": f"{root}/conf/{deployment}.env",
        "pid_file": f"{root}/run/{deployment}.pid",
        # The LaunchSpec last started, copied there by the service at each start (0600).
        "running_spec": f"{root}/run/{deployment}.running-spec.json",
        "log_file": f"{root}/logs/{deployment}.log",
        "venv": f"{root}/venv",
        "baseline_file": f"{root}/run/{deployment}.baseline.json",
        "recover_lock": f"{root}/run/{deployment}.recover.lock",
        "evidence_dir": f"{root}/evidence",
        # Written when GPU memory stays held after a kill; deploys refuse the node until it
        # is cleared (playbooks/recover.yml -e sglang_recover_clear_reboot_mark=true).
        "reboot_mark": f"{root}/NEEDS_REBOOT",
        "shm_dir": c.get("shm_dir") or "/dev/shm",
    }
    unit_name = f"sglang-{deployment}.service"
    paths["unit_file"] = (
        f"/etc/systemd/system/{unit_name}" if manager == "systemd" else None
    )

    if install_mode == "pip":
        server_python = f"{paths['venv']}/bin/python"
        launch = [server_python, "-m", release["launch_module"]]
        args_parser = release["args_parser"]
    elif install_mode == "existing":
        server_python = python
        launch = [python, "-m", release["launch_module"]]
        args_parser = release["args_parser"]
    else:
        server_python = python
        launch = [python, "-m", "sglang_fleet.sim.launch_server"]
        args_parser = "sglang_fleet.sim.server_args:prepare_server_args"

    args: list[Any] = ["--model-path", model_path, "--served-model-name", served,
                       "--tp-size", str(tp)]
    if dp != 1:
        args += ["--dp-size", str(dp)]
    if nnodes > 1:
        args += ["--nnodes", str(nnodes), "--node-rank", str(node_rank),
                 "--dist-init-addr", dist_init_addr]
    args += ["--host", listen_host, "--port", str(port)]
    if backend:
        args += ["--attention-backend", backend]
    if steps != 1:
        args += ["--num-continuous-decode-steps", str(steps)]
    if disable_car:
        args.append("--disable-custom-all-reduce")
    if not cuda_graph:
        args += list(release["disable_cuda_graph_args"])
    if max_bs is not None:
        args += [release["cuda_graph_max_bs_flag"], str(max_bs)]
    if mem_frac is not None:
        args += ["--mem-fraction-static", str(mem_frac)]
    if kv_dtype and kv_dtype != "auto":
        args += ["--kv-cache-dtype", kv_dtype]
    if quantization:
        args += ["--quantization", quantization]
    if trust_remote_code:
        args.append("--trust-remote-code")
    if enable_metrics:
        args.append("--enable-metrics")
    if api_key:
        # A reference, expanded by the launch script from the 0600 env file: the key never
        # appears in the script, the spec, Ansible output or the runner artifacts.
        args += ["--api-key", {"env": API_KEY_VAR}]
    args += list(extra_args)

    marker = f"{host}:{deployment}"
    env[MARKER_VAR] = marker
    # SGLang renames its workers with setproctitle, which by default reuses the environ area
    # and so erases the marker from /proc/PID/environ; SPT_NOENV keeps the environment intact.
    env["SPT_NOENV"] = "1"
    if install_mode == "simulator":
        env.update({
            "SGLANG_SIM_GPU_DIR": f"{root}/sim/gpus",
            "SGLANG_SIM_SHM_DIR": paths["shm_dir"],
            "SGLANG_SIM_PROFILE": str(c.get("sim_profile")),
            "SGLANG_SIM_TIME_FACTOR": _env_value(c.get("sim_time_factor")),
            "SGLANG_SIM_FAULT": str(c.get("sim_fault") or ""),
        })
    secret_env_names = []
    if api_key:
        secret_env_names.append(API_KEY_VAR)
    if hf_token:
        secret_env_names.append(HF_TOKEN_VAR)

    core = {
        "argv": launch + args,
        "env": env,
        "secret_env_names": secret_env_names,
        "service": {"manager": manager, "unit_name": unit_name, "stop_timeout": stop_timeout,
                    "user": c.get("user") or "root"},
    }
    chash = config_hash(core)
    env[CONFIG_VAR] = chash
    connect_host = "127.0.0.1" if listen_host in ("0.0.0.0", "::") else listen_host
    spec = {
        "host": host,
        "deployment": deployment,
        "marker": marker,
        "config_hash": chash,
        "sglang_version": version,
        "argv": launch + args,
        # The server's own arguments with secrets masked: for parsing checks and display.
        "server_args": [a if isinstance(a, str) else "********" for a in args],
        "env": env,
        "secret_env_names": secret_env_names,
        "service": core["service"],
        "paths": paths,
        "install": {
            "mode": install_mode,
            "python": python,
            "server_python": server_python,
            "pip_requirements": [f"{c.get('pip_package')}=={version}",
                                 *list(c.get("pip_extra_packages") or [])],
            "args_parser": args_parser,
        },
        "gpu": {"backend": "simulated" if install_mode == "simulator" else "nvml",
                "count": gpu_count, "compute_capability": cc, "model": c.get("gpu_model"),
                "used_per_node": (tp // nnodes) * dp,
                "sim_dir": f"{root}/sim/gpus" if install_mode == "simulator" else None},
        "model": {"path": model_path, "served_name": served, "family": family,
                  "size_b": c.get("model_size_b")},
        "group": {"name": group or None, "nnodes": nnodes, "node_rank": node_rank,
                  "dist_init_addr": dist_init_addr, "serves_http": node_rank == 0},
        "http": {"url": f"http://{connect_host}:{port}", "port": port},
        "facts": facts,
        # The inputs, secrets left out: what recovery compares with the last known good.
        "settings": public_settings(settings),
        "gate": {
            "stall_windows": windows,
            "ceilings": ceilings,
            "poll_interval": poll,
            # Enough polls to outlast every phase's ceiling back to back.
            "max_polls": int(sum(ceilings.values()) // poll) + 1,
            "health_timeout": health_timeout,
            "kernel_log": (f"{root}/sim/kmsg" if install_mode == "simulator"
                           else c.get("kernel_log") or "kmsg"),
            "state_file": f"{root}/run/{deployment}.gate.json",
            "host": connect_host,
        },
        "allowed_rules": [r.id for r in matched],
        # The simulated node's own hardware, independent of what the inventory claims, so
        # that preflight's comparison means the same on a simulated node as on a real one.
        "sim": {"gpu_count": c.get("sim_gpu_count"),
                "compute_capability": _compute_capability(c.get("sim_compute_capability")),
                "profile": str(c.get("sim_profile"))} if install_mode == "simulator" else None,
    }
    spec["group"]["fingerprint"] = config_hash(_group_view(spec))
    return _result(c, spec)


def _group_view(spec: dict[str, Any]) -> dict[str, Any]:
    """What every node of a multi-node server must agree on: argv without the node rank."""
    argv = list(spec["argv"])
    if "--node-rank" in argv:
        i = argv.index("--node-rank")
        del argv[i:i + 2]
    return {"argv": argv[1:], "version": spec["sglang_version"],
            # The simulator's SGLANG_SIM_* name each node's own simulated hardware.
            "env": {k: v for k, v in spec["env"].items() if k.startswith(("NCCL_", "SGLANG_"))
                    and not k.startswith("SGLANG_SIM_") and k not in (MARKER_VAR, CONFIG_VAR)}}


def group_consistency_errors(specs: dict[str, dict[str, Any]]) -> list[str]:
    """Errors when the nodes of one multi-node server disagree (ranks, address, arguments)."""
    errors: list[str] = []
    by_group: dict[str, list[dict[str, Any]]] = {}
    for spec in specs.values():
        if spec and spec["group"]["name"]:
            by_group.setdefault(spec["group"]["name"], []).append(spec)
    for name, members in sorted(by_group.items()):
        ranks: dict[int, str] = {}
        for spec in members:
            rank = spec["group"]["node_rank"]
            if rank in ranks:
                errors.append(f"group {name}: hosts {ranks[rank]} and {spec['host']} both have "
                              f"node rank {rank}. Fix: unset sglang_server_node_rank to derive "
                              f"ranks from group order, or give each node a unique rank")
            ranks[rank] = spec["host"]
        addrs = {s["group"]["dist_init_addr"] for s in members}
        if len(addrs) > 1:
            errors.append(f"group {name}: members disagree on the dist-init address "
                          f"{sorted(addrs)}. Fix: set sglang_server_dist_init_host once, in "
                          f"group_vars/{name}")
        prints = {s["group"]["fingerprint"] for s in members}
        if len(prints) > 1:
            seen = ", ".join(f"{s['host']}={s['group']['fingerprint']}" for s in members)
            errors.append(f"group {name}: members render different server arguments "
                          f"({seen}). "
                          f"Fix: set the sglang_server_* variables in group_vars/{name}, not "
                          f"per host")
    return errors


def _result(c: _Checker, spec: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "ok": not c.errors,
        "errors": [str(e) for e in c.errors],
        "error_details": [asdict(e) for e in c.errors],
        "warnings": c.warnings,
        "spec": spec,
    }
