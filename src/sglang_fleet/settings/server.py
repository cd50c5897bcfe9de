"""The one table of `sglang_server_*` settings: name, type, range, default, the SGLang option it
renders and the Rule fact it feeds.

Its rows are sglang_fleet.settings.kinds.Setting, as the router's are. Validation (launch_spec),
rendering, Rule facts (rule_facts), what recovery may change (NOT_CONFIGURATION), the secret
registry (sglang_fleet.settings.secrets), the role's defaults/main.yml and
meta/argument_specs.yml all come from this table:

    python -m sglang_fleet.settings --write  # regenerate every generated file

and tests/unit/test_settings_table.py fails when any of them drift.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

from sglang_fleet.settings.kinds import Setting, SettingsTable
from sglang_fleet.settings.role_files import RoleFiles

PREFIX = "sglang_server_"
ROLE_DIR = Path(__file__).resolve().parents[3] / "roles" / "sglang_server"


S = partial(Setting, prefix=PREFIX)
TABLE = SettingsTable(PREFIX, (
    # Model
    S("model_path", "str", "/models/Kimi-K2.5",
      "Model folder on the node (or a hub id when the node can download).", "Model",
      flag="--model-path", render="value"),
    S("model_config", "str", None,
      "A copy of the model's config.json on the controller (the file, or its folder), for a "
      "model data/models.yml does not know: the pinned release's own checks read it before "
      "any node is touched; null: only the release's parser runs for such a model.", "Model",
      nullable=True, configuration=False),
    S("weights_from_instance", "str", None,
      "An inventory host of this deployment whose running server this one loads its weights "
      "from, GPU to GPU (SGLang's --load-format remote_instance: the seed's address and HTTP "
      "port come from its own variables; docs/weights.md says what it needs); null loads "
      "them from sglang_server_model_path.", "Model", nullable=True, max_length=255,
      render="custom", configuration=False,
      owns=("--remote-instance-weight-loader-seed-instance-ip",
            "--remote-instance-weight-loader-seed-instance-service-port")),
    S("weights_from_instance_ports", "list", [],
      "One free port per TP rank on the seed's node, where each rank's weight-send group "
      "meets (--remote-instance-weight-loader-send-weights-group-ports); open them from this "
      "node to the seed's. Needed with the nccl backend.", "Model", elements="int",
      example="[30100, 30101]", configuration=False,
      owns=("--remote-instance-weight-loader-send-weights-group-ports",)),
    S("weights_from_instance_backend", "str", "nccl",
      "How the seed's GPUs send the weights: nccl, or transfer_engine (Mooncake's, which the "
      "seed must run with --remote-instance-weight-loader-start-seed-via-transfer-engine).",
      "Model", choices=("nccl", "transfer_engine"), configuration=False,
      owns=("--remote-instance-weight-loader-backend",)),
    S("served_model_name", "str", None, "Name clients use; null means the model folder's name.",
      "Model", flag="--served-model-name", render="custom", nullable=True, max_length=200),
    S("model_family", "str", "MLA",
      "Attention family: MLA (DeepSeek-V3/R1, Kimi-K2/K2.5) or MHA.", "Model",
      choices=("MLA", "MHA"), fact="model_family"),
    S("model_size_b", "int", 1000, "Parameter count in billions; sizes the gate's stall windows.",
      "Model", low=1, high=100_000),
    S("trust_remote_code", "bool", True, "Pass --trust-remote-code.", "Model",
      flag="--trust-remote-code", render="switch"),
    S("quantization", "str", None, "Value of --quantization (choices of the pinned release), "
      "or null.", "Model", flag="--quantization", render="value", catalogue_choices=True,
      nullable=True),
    # Hardware of each node
    S("gpu_model", "str", "RTX PRO 6000 Blackwell",
      "GPU model of each node, for reports and the simulated fleet.", "Hardware"),
    S("gpu_compute_capability", "str", "12.0",
      'Compute capability of the GPUs, "major.minor" ("12.0" = SM120).',
      "Hardware", fact="compute_capability", number_as_text=True),
    S("gpu_count", "int", 8, "GPUs per node; preflight checks it against NVML.",
      "Hardware", low=1, high=64),
    S("gpu_memory_gb", "float", None,
      "Memory per GPU in GB, for the check that the model's weights fit before any node is "
      "touched; null takes it from the GPU model (the node check reads it through NVML).",
      "Hardware", low=0.0, high=100_000.0, nullable=True, open_range=True, example="96"),
    S("interconnect", "str", "pcie", "GPU interconnect inside a node.", "Hardware",
      choices=("pcie", "nvlink"), fact="interconnect"),
    # Parallelism
    S("tp", "int", 8, "Tensor-parallel size of the whole server (all nodes of its group).",
      "Parallelism",
      low=1, high=1024, flag="--tp-size", render="value", fact="tp"),
    S("dp", "int", 1, "Data-parallel size.", "Parallelism", low=1, high=1024, flag="--dp-size",
      render="value", omit=1),
    S("pp", "int", 1, "Pipeline-parallel size.", "Parallelism", low=1, high=1024,
      flag="--pp-size", render="value", omit=1),
    S("ep", "int", 1, "Expert-parallel size (MoE models).", "Parallelism", low=1, high=1024,
      flag="--ep-size", render="value", omit=1),
    S("group", "str", None,
      "Inventory group whose nodes form one multi-node server; null for one node.",
      "Parallelism", nullable=True, owns=("--nnodes", "--node-rank", "--dist-init-addr"),
      render="custom", configuration=False),
    S("node_rank", "int", None, "Explicit node rank; null derives it from the sorted group.",
      "Parallelism", low=0, high=1023, nullable=True, configuration=False),
    S("dist_init_host", "str", None,
      "Address of rank 0 for --dist-init-addr; null uses its ansible_host.", "Parallelism",
      nullable=True, max_length=255, configuration=False),
    S("dist_init_port", "int", 20000, "Port of --dist-init-addr.", "Parallelism",
      low=1, high=65535, configuration=False),
    S("group_nodes", "int", None,
      "Nodes the multi-node group has; set beside sglang_server_group so that an inventory "
      "holding only part of the group (a slice of it, a host gone from a dynamic inventory) is "
      "refused; null takes the group's members as they are.", "Parallelism",
      low=2, high=1024, nullable=True, configuration=False),
    # Prefill/decode disaggregation
    S("pd_deployment", "str", None,
      "Inventory group whose prefill and decode servers form one PD deployment; null for a "
      "server that does both.", "Disaggregation", nullable=True, max_length=255,
      configuration=False),
    S("disaggregation_mode", "str", None,
      "This server's side of its PD deployment: prefill or decode (--disaggregation-mode); "
      "null for a server that does both.", "Disaggregation", choices=("prefill", "decode"),
      flag="--disaggregation-mode", render="value", nullable=True, configuration=False),
    S("disaggregation_transfer_backend", "str", None,
      "KV transfer backend (choices of the pinned release); null for SGLang's default, "
      "mooncake.", "Disaggregation", flag="--disaggregation-transfer-backend", render="value",
      catalogue_choices=True, nullable=True),
    S("disaggregation_bootstrap_port", "int", None,
      "Port of the prefill's KV bootstrap server; null for SGLang's default, 8998.",
      "Disaggregation", low=1, high=65535, flag="--disaggregation-bootstrap-port",
      render="value", nullable=True, configuration=False),
    S("disaggregation_ib_device", "str", None,
      "RDMA devices for the KV transfer (mlx5_0,mlx5_1, or a JSON map of GPU to devices); "
      "null lets mooncake discover them.", "Disaggregation",
      flag="--disaggregation-ib-device", render="value", nullable=True, max_length=4096,
      configuration=False),
    S("pd_keep_side_serving", "bool", True,
      "In a deploy, keep a server of each side of this server's PD deployment serving while "
      "the others restart: the deploy's batches (sglang_fleet_serial, one batch when unset) "
      "are cut so that none holds every prefill or every decode. false on a side's servers "
      "lets a deploy restart that whole side at once, an outage of the deployment meanwhile.",
      "Disaggregation", configuration=False),
    # Server options
    S("attention_backend", "str", None,
      "--attention-backend, validated for the pinned release; null for SGLang's default "
      "(which depends on the GPU and the model family).", "Server options",
      flag="--attention-backend", render="value", catalogue_choices=True, nullable=True,
      fact="attention_backend"),
    S("num_continuous_decode_steps", "int", 1, "--num-continuous-decode-steps.",
      "Server options", low=1, high=64, flag="--num-continuous-decode-steps", render="value",
      omit=1),
    S("disable_custom_all_reduce", "bool", False, "Pass --disable-custom-all-reduce.",
      "Server options", flag="--disable-custom-all-reduce", render="switch",
      fact="custom_all_reduce"),
    S("cuda_graph", "bool", True,
      "Capture CUDA graphs; false renders the pinned release's flags that disable every "
      "capture (decode and prefill).", "Server options", render="custom", fact="cuda_graph",
      owns=("--cuda-graph-backend-decode", "--cuda-graph-backend-prefill",
            "--disable-cuda-graph", "--disable-decode-cuda-graph", "--disable-prefill-cuda-graph",
            "--cuda-graph-config")),
    S("cuda_graph_max_bs", "int", None,
      "Largest decode batch captured (rendered as the release's flag).", "Server options",
      low=1, high=4096, nullable=True, render="custom",
      owns=("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")),
    S("mem_fraction_static", "float", None, "--mem-fraction-static, or null for SGLang's "
      "default.", "Server options", low=0.0, high=1.0, nullable=True,
      flag="--mem-fraction-static", render="value", open_range=True, example="0.85"),
    S("kv_cache_dtype", "str", "auto", "--kv-cache-dtype (choices of the pinned release; auto "
      "renders nothing).", "Server options", flag="--kv-cache-dtype", render="value",
      omit="auto", catalogue_choices=True),
    S("host", "str", "127.0.0.1", "Address the server listens on.", "Server options",
      flag="--host", render="value", max_length=255, configuration=False),
    S("port", "int", 30000, "HTTP port of the server.", "Server options", low=1, high=65535,
      flag="--port", render="value", configuration=False),
    S("enable_metrics", "bool", True, "Pass --enable-metrics (Prometheus /metrics).",
      "Server options", flag="--enable-metrics", render="switch"),
    S("extra_args", "list", [], "More SGLang arguments, each flag checked against the pinned "
      "release's catalogue.", "Server options", elements="str"),
    S("api_key", "str", "", "API key (secret, at least 16 characters): kept in the 0600 env "
      "file only.", "Server options", secret=True, env="SGLANG_FLEET_API_KEY",
      flag="--api-key", render="secret"),
    S("admin_api_key", "str", "", "Admin API key for SGLang's admin endpoints (secret): kept "
      "in the 0600 env file only.", "Server options", secret=True,
      env="SGLANG_FLEET_ADMIN_API_KEY", flag="--admin-api-key", render="secret"),
    S("ssl_keyfile_password", "str", "", "Password of --ssl-keyfile (secret): kept in the 0600 "
      "env file only.", "Server options", secret=True,
      env="SGLANG_FLEET_SSL_KEYFILE_PASSWORD", flag="--ssl-keyfile-password",
      render="secret"),
    S("watermark_config", "str", "", "--watermark-config, whose keys SGLang itself redacts "
      "(secret): kept in the 0600 env file only.", "Server options", secret=True,
      env="SGLANG_FLEET_WATERMARK_CONFIG", flag="--watermark-config", render="secret"),
    S("hf_token", "str", "", "Hugging Face token (secret): kept in the 0600 env file only.",
      "Server options", secret=True, env="HF_TOKEN"),
    S("drop_secrets", "list", [],
      "Secret settings this deploy may leave empty although the deployment last started with "
      "them (a key removed on purpose); otherwise a secret that resolves to nothing is refused.",
      "Server options", elements="str"),
    S("allow_unauthenticated", "bool", False,
      "Serve without an API key on an address other than loopback (refused otherwise).",
      "Server options"),
    # Environment
    S("nccl_profile", "dict", {},
      "NCCL_* environment variables; unknown names are refused with a did-you-mean.",
      "Environment"),
    S("extra_env", "dict", {}, "Other environment variables for the server (SGLANG_*, CUDA_*).",
      "Environment"),
    # Rules
    S("allow_rules", "list", [], "Ids of known-bad Rules to deploy anyway.",
      "Rules", elements="str"),
    S("overrides", "dict", {}, "Values that win over the other sglang_server_* variables; "
      "recovery sets them for the configuration it redeploys (never secrets).",
      "Overrides", configuration=False),
    # Release and install
    S("version", "str", "0.5.23", "Pinned SGLang release (a catalogued one).",
      "Release", fact="sglang_version"),
    S("install_mode", "str", "pip", "How SGLang is installed on the node.",
      "Release", choices=("pip", "existing", "simulator")),
    S("pip_package", "str", "sglang[all]",
      "Package installed with pip (the version comes from sglang_server_version).",
      "Release"),
    S("pip_extra_packages", "list", ["py-spy"],
      "More packages for the server venv (py-spy for evidence).",
      "Release", elements="str"),
    S("pip_extra_args", "str", "",
      "More arguments for pip install, e.g. \"--no-index --find-links /srv/wheels\" on a node "
      "without a package index; not part of an environment's name.", "Release",
      max_length=4096, configuration=False),
    S("env_keep", "int", 2,
      "Release environments (pip: <root>/envs/<hash of the sorted requirement lines>) kept "
      "on the node, the serving one included. When a rollout reaches ready, the oldest beyond "
      "this count are removed, never the serving one nor the ledger's previous ready and last "
      "known good configurations': a rollback to a kept one installs nothing.", "Release",
      low=1, high=100, configuration=False),
    S("python", "path", "/usr/bin/python3",
      "Interpreter that creates the release environments (pip) or runs SGLang (existing, "
      "simulator).",
      "Release", configuration=False),
    # Node layout and service
    S("root", "path", "/opt/sglang-fleet",
      "Folder for the deployment's files, logs and release environments on the node.", "Node",
      configuration=False),
    S("kernel_cache", "bool", False,
      "Keep the server's JIT kernel caches (DeepGEMM, FlashInfer, Triton, torch.compile) in "
      "<root>/kernel-cache/<release>-sm<arch>-tp<N>/live, staged there from the controller "
      "before the server starts and harvested from a ready server after, so that the next "
      "node does not compile again (docs/weights.md). Turning it on moves the caches out of "
      "the service user's home: the first start is cold.", "Node", configuration=False),
    S("shm_dir", "path", "/dev/shm", "Shared-memory folder the server uses.",
      "Node", configuration=False),
    S("service_manager", "str", "systemd", "Service manager.", "Node",
      choices=("systemd", "supervisor")),
    S("user", "str", "root", "User the server runs as (the systemd unit's User=); processes "
      "of other users are never treated as the deployment's.", "Node",
      max_length=32),
    S("deployment_name", "str", None, "Deployment name; null means <served model name>-<port>.",
      "Node", nullable=True, max_length=63, configuration=False),
    S("stop_timeout", "int", 60, "Seconds between SIGTERM and SIGKILL when stopping.",
      "Node", low=1, high=3600),
    # Health gate
    S("gate_stall_windows", "dict", {},
      "Seconds without progress before a phase is stalled, by phase (overrides the defaults "
      "sized by sglang_server_model_size_b).",
      "Health gate", configuration=False),
    S("gate_ceilings", "dict", {},
      "Longest a phase may last whatever its progress, by phase (overrides).", "Health gate",
      configuration=False),
    S("gate_poll_interval", "int", 10,
      "Seconds between gate observations (progress is shown at each).", "Health gate",
      low=1, high=300, configuration=False),
    S("health_timeout", "int", 25, "Seconds the gate waits for /health, above SGLang's own 20 s.",
      "Health gate", low=21, high=600, configuration=False),
    S("kernel_log", "str", "kmsg", "Kernel log source for Xid and OOM lines, kmsg or none.",
      "Health gate", configuration=False),
    S("stack_sampling", "bool", True,
      "Sample each rank's Python stack with py-spy (non-blocking) while the server starts and "
      "serves, so that a hang whose stacks stop changing is stalled within "
      "sglang_server_stack_window of its last progress, whatever the phase's window; false "
      "judges hangs by the windows alone.", "Health gate", configuration=False),
    S("py_spy", "str", "",
      "py-spy executable on the node; empty looks beside the server's Python, then on PATH.",
      "Health gate", max_length=1024, configuration=False),
    S("stack_interval", "float", 10.0,
      "Seconds between two stack samples of one rank (each costs milliseconds of py-spy's "
      "CPU and never pauses the rank).", "Health gate", low=0, high=600, open_range=True,
      configuration=False),
    S("stack_window", "float", 30.0,
      "Seconds with no progress over which every rank's stack stayed on the same frames "
      "before the server is stalled; at least 3 sglang_server_stack_interval (the classifier "
      "needs 3 samples since the last progress).", "Health gate", low=0, high=86400,
      open_range=True, configuration=False),
    # Simulator
    S("sim_profile", "str", "kimi-k2.5-rtxpro6000-tp8",
      "Simulator profile (speeds and phase durations).", "Simulator"),
    S("sim_time_factor", "float", 1.0, "Multiplier on the simulated phase durations.",
      "Simulator", low=0.0, high=100.0, configuration=False, open_range=True),
    S("sim_fault", "str", "", 'Simulated faults, e.g. "hang:loading_weights,crash:warming_up".',
      "Simulator"),
    S("sim_regress", "str", "",
      'Simulated regressions (SGLANG_SIM_REGRESS, docs/simulator.md), e.g. '
      '"decode=0.8,ttft=1.3,itl=1.3,errors=0.05,aborts=0.05,outputs=changed".', "Simulator"),
    S("sim_pip", "bool", False,
      "Run the simulator from a release environment made as pip mode makes it "
      "(sglang_server_pip_package==sglang_server_version and the extra packages, under "
      "<root>/envs), not from sglang_server_python: the environments, their keep count and "
      "rollbacks without an install, tested without GPUs. The package must make "
      "sglang_fleet importable.", "Simulator"),
    S("sim_gpu_count", "int", 8,
      "GPUs the simulated node really has (preflight compares the inventory with it).",
      "Simulator", low=1, high=64, configuration=False),
    S("sim_compute_capability", "str", "12.0",
      "Compute capability of the simulated node's GPUs.", "Simulator", number_as_text=True,
      configuration=False),
))
del S
SETTINGS: tuple[Setting, ...] = TABLE.rows

# The comment heading each section of the generated defaults file.
SECTION_NOTES = {
    "Model": "Model",
    "Hardware": "Hardware of each node",
    "Parallelism": "Parallelism; a multi-node server is an inventory group named by "
                   "sglang_server_group",
    "Disaggregation": "Prefill/decode disaggregation: a PD deployment is an inventory group "
                      "of prefill and decode servers (docs/disaggregation.md)",
    "Server options": "Server options",
    "Environment": "Environment: NCCL tuning profile and other variables (SGLANG_*, CUDA_*)",
    "Rules": "Known-bad Rules deliberately overridden, by rule id",
    "Overrides": "Values that win over the variables above; recovery sets them for the "
                 "configuration it redeploys (the ledger records them: copy them into the "
                 "inventory to keep them)",
    "Release": "SGLang release and how it is installed",
    "Node": "Node layout and service",
    "Health gate": "Health gate: judged by progress per phase, not by elapsed time. Windows "
                   "and ceilings default by model size (1000B: 300 s without progress while "
                   "loading weights, 600 s in graph capture); set only the phases to change, "
                   "e.g. {capturing_cuda_graph: 900}.",
    "Simulator": "Simulator (install_mode: simulator)",
}

BY_NAME: dict[str, Setting] = TABLE.by_name
BY_VARIABLE: dict[str, Setting] = TABLE.by_variable
SECRET_SETTINGS: tuple[str, ...] = TABLE.secret_variables
# The environment variable of each secret, in the deployment's 0600 env file.
SECRET_ENV: dict[str, str] = TABLE.secret_env
# SGLang's options whose values are secrets.
SECRET_FLAGS: tuple[str, ...] = tuple(s.flag for s in SETTINGS if s.secret and s.flag)
# The inventory variable behind each LaunchSpec fact that Rules match on.
FACT_OF_SETTING: dict[str, str] = {s.variable: s.fact for s in SETTINGS if s.fact}
# Settings that never make two configurations differ, and that recovery never changes.
NOT_CONFIGURATION: tuple[str, ...] = tuple(s.variable for s in SETTINGS if not s.configuration)
# Facts the role publishes under its own prefix: outputs, never inputs of a LaunchSpec.
OUTPUT_FACTS = (PREFIX + "launch_spec", PREFIX + "verdict", PREFIX + "identity")


def compute_capability(value: Any) -> str | None:
    # "12.0", 12.0 and 12 all mean SM120; normalise to "major.minor".
    if value is None:
        return None
    text = str(value)
    return text if "." in text else f"{text}.0"


# Facts whose value is not their setting's own.
_FACT_OF_VALUE = {"compute_capability": compute_capability,
                  "custom_all_reduce": lambda disabled: not disabled}


def rule_facts(values: dict[str, Any], release: Any = None,
               table: SettingsTable | None = None) -> dict[str, Any]:
    """The LaunchSpec facts Rules match on, from settings by short name: each setting's `fact`
    column, normalised where the fact is not the value itself. With the pinned release, an
    unset attention backend is the one SGLang picks for the model family and GPU."""
    facts = {}
    for s in table or TABLE:
        if s.fact:
            value = values.get(s.name)
            facts[s.fact] = _FACT_OF_VALUE[s.fact](value) if s.fact in _FACT_OF_VALUE else value
    if release is not None and facts.get("attention_backend") is None \
            and facts.get("model_family") and facts.get("compute_capability"):
        facts["attention_backend"] = release.default_backend(facts["model_family"],
                                                             facts["compute_capability"])
    return facts


def owners_by_dest(cat: Any) -> dict[str, Setting]:
    """SGLang destinations of one release's catalogue -> the setting that decides them
    (extra_args may not set them). Owned flags a release lacks are skipped."""
    owners: dict[str, Setting] = {}
    for setting in TABLE:
        for flag in setting.owned_flags:
            option = cat.by_flag.get(flag)
            if option is not None:
                owners.setdefault(option.dest, setting)
    return owners


LAUNCH_SPEC_INPUT = {"type": "dict", "required": True,
                     "description": "This host's LaunchSpec, as the spec entry point (spec.yml) "
                                    "built it."}

# observe.yml, entered by the health, recover and router playbooks and the sglang_bench role.
OBSERVE_ENTRY = {
    "short_description": "Observe this host's server and set sglang_server_verdict",
    "description": ["sglang_health on the server of sglang_server_launch_spec, repeated while "
                    "it is progressing, up to sglang_server_observe_polls times."],
    "options": {
        "sglang_server_launch_spec": LAUNCH_SPEC_INPUT,
        "sglang_server_observe_polls": {
            "type": "int", "default": 1,
            "description": "Observations at most while the verdict is progressing (1: one "
                           "look, as the health playbook takes)."},
        "sglang_server_observe_wait": {
            "type": "float", "default": 0,
            "description": "Seconds each observation keeps watching on the node for a verdict "
                           "or a phase change (0: one look)."},
    },
}

ROLE_FILES = RoleFiles(
    table=SETTINGS, section_notes=SECTION_NOTES, role_dir=ROLE_DIR,
    module="sglang_fleet.settings.server",
    intro=("Every public variable of a deployment; the LaunchSpec is built from these on the",
           "controller (sglang_fleet.launch.spec). meta/argument_specs.yml mirrors this",
           "file."),
    short_description="Deploy one SGLang server per node from inventory variables",
    description=("Builds and validates the LaunchSpec on the controller, checks the node, "
                 "installs SGLang, renders the launch files, starts the service and gates it "
                 "on its progress until it is ready.",),
    entry_points=(("observe", OBSERVE_ENTRY),))


if __name__ == "__main__":
    sys.exit(ROLE_FILES.main())
