"""What a simulated server knows about itself: settings, hardware, model, and how it will fail.

Shared by the main process and the scheduler workers. Settings come from the environment
(SGLANG_SIM_*), because the command line must stay exactly SGLang's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from sglang_fleet.reviewed import releases, sim_profile
from sglang_fleet.rules import matching_rules
from sglang_fleet.sim.server_args import VERSION, cuda_graph_enabled
from sglang_fleet_node import sglang_fleet_simgpu as simgpu

GB = 1024**3
MLA_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK25ForCausalLM")

# Failure modes, from SGLANG_SIM_FAULT ("kind:phase", comma separated) or from a matching Rule.
# "xid" (or "xid<code>", default 79) writes an NVRM Xid line to the node's simulated kernel
# log, <gpu dir>/../kmsg, then hangs as a process on a GPU fallen off the bus does.
# "orphan_workers": schedulers skip PR_SET_PDEATHSIG and outlive a killed main process.
FAULT_KINDS = ("hang", "crash", "oom", "xid", "hang_generation", "leak_memory",
               "orphan_workers")


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
    faults: list[Fault] = field(default_factory=list)

    def duration(self, phase: str) -> float:
        return float(self.profile["phases"].get(phase, 0.0)) * self.time_factor

    def fault_at(self, phase: str,
                 kinds: tuple[str, ...] = ("hang", "crash", "oom", "xid")) -> Fault | None:
        for f in self.faults:
            if f.kind in kinds and f.phase == phase:
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

    def gpu_index(self, tp_rank: int) -> int:
        per_node = max(self.args.tp_size // max(self.args.nnodes, 1), 1)
        return self.args.base_gpu_id + (tp_rank % per_node)


def parse_faults(text: str) -> list[Fault]:
    faults = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        kind, _, phase = item.partition(":")
        xid = 79
        if kind.startswith("xid") and kind[3:].isdigit():
            kind, xid = "xid", int(kind[3:])
        if kind not in FAULT_KINDS:
            raise ValueError(f"SGLANG_SIM_FAULT: unknown fault {kind!r}; known: {FAULT_KINDS}")
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
        faults=parse_faults(os.environ.get("SGLANG_SIM_FAULT", "")),
    )
    rt.faults += rule_faults(rt)
    return rt


def effective_backend(rt: SimRuntime) -> str:
    """The backend the server runs: the flag, else the release's default for this GPU."""
    major, minor = rt.devices[0]["compute_capability"]
    return rt.args.attention_backend or releases()[VERSION].default_backend(
        rt.model_family, f"{major}.{minor}")


def rule_faults(rt: SimRuntime) -> list[Fault]:
    """A configuration that matches a Rule fails the way the Rule says real servers fail."""
    major, minor = rt.devices[0]["compute_capability"]
    cc = f"{major}.{minor}"
    facts = {  # the same facts the LaunchSpec gives Rules
        "attention_backend": effective_backend(rt),
        "model_family": rt.model_family,
        "compute_capability": cc,
        "interconnect": rt.devices[0].get("interconnect", "pcie"),
        "tp": rt.args.tp_size,
        "custom_all_reduce": not rt.args.disable_custom_all_reduce,
        "cuda_graph": cuda_graph_enabled(rt.args),
        "sglang_version": VERSION,
    }
    faults = []
    for rule in matching_rules(facts):
        sim = rule.simulate
        if sim:
            faults.append(Fault(kind=sim["kind"], phase=sim.get("phase"),
                                message=sim.get("message"), source=f"rule {rule.id}"))
    return faults


def log(message: str, prefix: str = "", end: str = "\n") -> None:
    """SGLang's log format: `[YYYY-mm-dd HH:MM:SS<prefix>] message`."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write(f"[{stamp}{prefix}] {message}{end}")
    sys.stdout.flush()


def clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"
