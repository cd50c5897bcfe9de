"""What a simulated server knows about itself: settings, hardware, model, and how it will fail.

Shared by the main process, the data-parallel controller and the scheduler workers. Settings
come from the environment (SGLANG_SIM_*), because the command line must stay exactly SGLang's.
Parsed flags are read by SGLang's own dest names (getattr with SGLang's default), so any parser
that produces them will do.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sglang_fleet.known.reviewed import data_yaml, releases, sim_profile
from sglang_fleet.known.sim_regress import Regression, regression_from_env
from sglang_fleet.node.gpu import simgpu
from sglang_fleet.sim.args.version import VERSION
from sglang_fleet.sim.engine.graphs import CapturePlan, backends, capture_plan
from sglang_fleet.sim.engine.logline import log as log  # the processes import it from here
from sglang_fleet.sim.engine.topology import Topology
from sglang_fleet.sim.srt.layers.deep_gemm_wrapper.compile_utils import deep_gemm_cache_dir

GB = 1024**3
MLA_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK25ForCausalLM")

# Failure modes, from SGLANG_SIM_FAULT ("kind:phase", comma separated) or from one of SGLang's
# known bugs (data/sim_bugs.yml).
# Each prints what SGLang 0.5.23 prints for it (see sglang_fleet.sim.engine.failures);
# docs/simulator.md lists them with their default phase.
STARTUP_PHASES = ("launching", "loading_weights", "allocating_kv_cache", "capturing_cuda_graph",
                  "starting_http", "warming_up")
PHASES = (*STARTUP_PHASES, "serving")
# kind -> (default phase, phases it can strike in)
FAULTS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "hang": (None, PHASES),
    "crash": (None, PHASES),
    "oom": ("allocating_kv_cache", ("loading_weights", "allocating_kv_cache",
                                    "capturing_cuda_graph", "serving")),
    "xid": ("capturing_cuda_graph", STARTUP_PHASES),
    "hang_generation": ("serving", ("serving",)),
    "leak_memory": (None, ()),
    "orphan_workers": (None, ()),
    "nccl_error": ("launching", ("launching", "loading_weights", "capturing_cuda_graph",
                                 "serving")),
    "nccl_timeout": ("serving", ("capturing_cuda_graph", "serving")),
    "not_enough_memory": ("allocating_kv_cache", ("allocating_kv_cache",)),
    "no_kv_memory": ("allocating_kv_cache", ("allocating_kv_cache",)),
    "prefill_oom": ("serving", ("serving",)),
    "decode_oom": ("serving", ("serving",)),
    "capture_failed": ("capturing_cuda_graph", ("capturing_cuda_graph",)),
    "prefill_capture_failed": ("capturing_cuda_graph", ("capturing_cuda_graph",)),
    "tokenizer_watchdog": ("serving", ("serving",)),
    "killed": ("serving", PHASES),
    "detokenizer_crash": ("serving", ("serving",)),
    # A prefill's KV bootstrap server gone while its HTTP server answers: it stops once the
    # first decode has looked the prefill up, silently (its thread ended).
    "bootstrap_dead": ("serving", ("serving",)),
    # A prefill whose KV transfers never complete (a stuck transfer engine): its decodes wait
    # until SGLANG_DISAGGREGATION_WAITING_TIMEOUT fails each request.
    "transfer_hang": ("serving", ("serving",)),
    # DeepGEMM's compile lock never released (compile_utils.py _local_rank_compile_lock):
    # every rank waits for it at the first captured forward, no compiler child runs.
    "jit_hang": ("capturing_cuda_graph", ("capturing_cuda_graph",)),
    # The detokenizer blocked for good in handle_batch_token_id_out at the first batch after
    # ready: requests get no output, the schedulers go on.
    "detokenizer_hang": ("serving", ("serving",)),
}
FAULT_KINDS = tuple(FAULTS)


@dataclass
class Fault:
    kind: str
    phase: str | None = None
    message: str | None = None
    source: str = "SGLANG_SIM_FAULT"
    xid: int = 79


@dataclass
class SimRuntime:
    args: Any
    profile: dict[str, Any]
    time_factor: float
    gpu_dir: str
    shm_dir: str
    devices: list[dict[str, Any]]
    model_type: str
    model_family: str
    topology: Topology
    faults: list[Fault] = field(default_factory=list)
    model_config: dict[str, Any] = field(default_factory=dict)  # the model's config.json
    regress: Regression = field(default_factory=Regression)  # SGLANG_SIM_REGRESS

    def duration(self, phase: str) -> float:
        return float(self.profile["phases"].get(phase, 0.0)) * self.time_factor

    def fault_at(self, phase: str, kinds: tuple[str, ...] | None = None) -> Fault | None:
        for f in self.faults:
            if f.phase == phase and (kinds is None or f.kind in kinds) and f.kind not in (
                    "leak_memory", "orphan_workers", "tokenizer_watchdog",
                    "detokenizer_crash", "bootstrap_dead", "transfer_hang", "jit_hang",
                    "detokenizer_hang"):
                return f
        return None

    def has(self, kind: str) -> bool:
        return any(f.kind == kind for f in self.faults)

    def decode_tok_s(self) -> float:
        d = self.profile["decode_tok_s"]
        speed = float(d["base"])
        if any(os.environ.get(v) for v in d.get("nccl_tuned_vars", [])):
            speed *= float(d["nccl_tuned_multiplier"])
        return speed

    @property
    def compute_capability(self) -> tuple[int, int]:
        major, minor = self.devices[0]["compute_capability"]
        return int(major), int(minor)

    @property
    def gpu_mem_gb(self) -> float:
        return self.devices[0]["memory_total"] / GB

    def capture_plan(self) -> CapturePlan:
        prefill_backend = (getattr(self.args, "prefill_attention_backend", None)
                           or effective_backend(self))
        return capture_plan(self.args, self.gpu_mem_gb * 1024, self.model_type,
                            self.model_family == "MLA", prefill_backend)

    def kv_dtype(self) -> tuple[str, int]:
        """(torch dtype SGLang prints, bytes per element) for --kv-cache-dtype."""
        kind = getattr(self.args, "kv_cache_dtype", "auto") or "auto"
        if kind.startswith("fp8_e4m3"):
            return "torch.float8_e4m3fn", 1
        if kind.startswith("fp8_e5m2"):
            return "torch.float8_e5m2", 1
        if kind.startswith("fp4"):
            return "torch.float4_e2m1fn_x2", 1
        return "torch.bfloat16", 2

    def kv_tokens(self) -> int:
        return int(self.profile["kv_tokens"]) * (2 // self.kv_dtype()[1])

    def context_len(self) -> int:
        return int(getattr(self.args, "context_length", None)
                   or self.profile.get("context_len", 262144))


def parse_faults(text: str) -> list[Fault]:
    faults = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        kind, _, phase = item.partition(":")
        xid = 79
        if kind.startswith("xid") and kind[3:].isdigit():
            kind, xid = "xid", int(kind[3:])
        if kind not in FAULTS:
            raise ValueError(f"SGLANG_SIM_FAULT={text!r}: unknown fault {kind!r}; "
                             f"known: {', '.join(FAULT_KINDS)}")
        default, allowed = FAULTS[kind]
        phase = phase or default
        if allowed and phase not in allowed:
            raise ValueError(f"SGLANG_SIM_FAULT={text!r}: {kind} cannot strike in phase "
                             f"{phase!r}; give one of: {', '.join(allowed)}")
        faults.append(Fault(kind=kind, phase=phase or None, xid=xid))
    return faults


def load_runtime(args: Any) -> SimRuntime:
    profile = sim_profile(os.environ.get("SGLANG_SIM_PROFILE", "kimi-k2.5-rtxpro6000-tp8"))
    gpu_dir = os.environ.get("SGLANG_SIM_GPU_DIR", "")
    if not gpu_dir or not os.path.isfile(os.path.join(gpu_dir, simgpu.DEVICES_FILE)):
        raise RuntimeError(
            f"No CUDA GPUs are available (simulated GPU folder {gpu_dir!r} has no "
            f"{simgpu.DEVICES_FILE}; set SGLANG_SIM_GPU_DIR)")
    devices = simgpu.read_devices(gpu_dir)
    config_path = os.path.join(args.model_path, "config.json")
    try:
        with open(config_path) as f:
            config = json.load(f)
    except OSError as exc:
        raise OSError(f"Can't load the configuration of '{args.model_path}'. "
                      f"Make sure the path is a model folder with config.json: {exc}") from None
    model_type = config.get("architectures", ["LlamaForCausalLM"])[0]
    family = "MLA" if model_type in MLA_ARCHITECTURES else "MHA"
    rt = SimRuntime(
        args=args,
        profile=profile,
        time_factor=float(os.environ.get("SGLANG_SIM_TIME_FACTOR", "1.0")),
        gpu_dir=gpu_dir,
        shm_dir=os.environ.get("SGLANG_SIM_SHM_DIR", "/dev/shm"),
        devices=devices,
        model_type=model_type,
        model_family=family,
        topology=Topology.from_args(args),
        faults=parse_faults(os.environ.get("SGLANG_SIM_FAULT", "")),
        model_config=config,
        regress=regression_from_env(),
    )
    if rt.has("tokenizer_watchdog") and getattr(args, "soft_watchdog_timeout", None) is None:
        raise ValueError("SGLANG_SIM_FAULT=tokenizer_watchdog needs --soft-watchdog-timeout: "
                         "SGLang's TokenizerManager watchdog is soft and off without it")
    if rt.has("jit_hang") and deep_gemm_cache_dir() is None:
        raise ValueError("SGLANG_SIM_FAULT=jit_hang needs SGLANG_DG_CACHE_DIR or "
                         "SGLANG_CACHE_DIR: the compile lock it holds lives in DeepGEMM's "
                         "cache folder, which the simulator writes only where one is set")
    rt.faults += bug_faults(rt)
    return rt


def default_backend(rt: SimRuntime) -> tuple[str, str]:
    """(backend, the line SGLang logs choosing it) when --attention-backend is not set: the
    release's default as modelled in data/sglang_versions.yml, the one the LaunchSpec uses."""
    major, minor = rt.compute_capability
    backend = releases()[VERSION].default_backend(rt.model_family, f"{major}.{minor}",
                                                  rt.model_type)
    if backend == "trtllm_mla":  # the DeepSeek-V3 family's override on SM100
        return backend, f"Use trtllm_mla as attention backend on sm100 for {rt.model_type}"
    return backend, f"Attention backend not specified. Use {backend} backend by default."


def effective_backend(rt: SimRuntime) -> str:
    args = rt.args
    prefill = getattr(args, "prefill_attention_backend", None)
    if prefill is not None and prefill == getattr(args, "decode_attention_backend", None):
        return prefill
    return args.attention_backend or default_backend(rt)[0]


def resolved_args(args: Any, rt: SimRuntime) -> dict[str, Any]:
    """ServerArgs.resolved_dict(): every argument by dest name, the resolved ones filled in.
    As in 0.5.23 only watermark secrets are redacted: the API key is logged as given."""
    resolved = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    resolved["served_model_name"] = args.served_model_name or args.model_path
    resolved["attention_backend"] = effective_backend(rt)
    resolved["chunked_prefill_size"] = rt.capture_plan().chunked_prefill_size
    for secret in ("watermark_key", "watermark_key_b", "watermark_config"):
        if resolved.get(secret) is not None:
            resolved[secret] = "<redacted>"
    return resolved


def configuration_facts(rt: SimRuntime) -> dict[str, Any]:
    """What decides whether one of SGLang's known bugs strikes this server."""
    major, minor = rt.compute_capability
    decode, _, _ = backends(rt.args)
    return {
        "attention_backend": effective_backend(rt),
        "model_family": rt.model_family,
        "compute_capability": f"{major}.{minor}",
        "interconnect": rt.devices[0].get("interconnect", "pcie"),
        "tp": rt.args.tp_size,
        "custom_all_reduce": not getattr(rt.args, "disable_custom_all_reduce", False),
        # The capture hangs are decode capture ("Capturing batches"), as the incident's.
        "decode_cuda_graph": decode != "disabled",
    }


@cache
def known_bugs() -> tuple[dict[str, Any], ...]:
    return tuple(data_yaml("sim_bugs.yml"))


def _holds(when: dict[str, Any], facts: dict[str, Any]) -> bool:
    for key, wanted in when.items():
        options = wanted if isinstance(wanted, list) else [wanted]
        # As text, so "12.0" and 12.0 agree.
        if str(facts.get(key)).lower() not in {str(o).lower() for o in options}:
            return False
    return True


def bug_faults(rt: SimRuntime) -> list[Fault]:
    """A configuration real SGLang fails on fails here the same way (data/sim_bugs.yml)."""
    facts = configuration_facts(rt)
    return [Fault(kind=bug["fault"]["kind"], phase=bug["fault"].get("phase"),
                  message=bug["fault"].get("message"), source=f"SGLang bug {bug['id']}")
            for bug in known_bugs() if _holds(bug["when"], facts)]
