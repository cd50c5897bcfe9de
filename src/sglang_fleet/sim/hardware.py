"""What a simulated node is made of: its GPUs (devices.json) and a stand-in model folder."""

from __future__ import annotations

from typing import Any

from sglang_fleet.reviewed import sim_profile
from sglang_fleet.sim.runtime import GB

GPU_NAMES = {"12.0": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "10.0": "NVIDIA B200",
             "9.0": "NVIDIA H200"}


def sim_devices(spec: dict[str, Any]) -> list[dict[str, Any]]:
    gpu, sim = spec["gpu"], spec["sim"]
    profile = sim_profile(sim["profile"])
    major, minor = (int(x) for x in sim["compute_capability"].split("."))
    name = GPU_NAMES.get(sim["compute_capability"], gpu.get("model") or "NVIDIA GPU")
    return [{
        "index": i,
        "name": f"{name} (simulated)",
        "uuid": f"GPU-sim-{spec['host']}-{i:02d}",
        "compute_capability": [major, minor],
        "memory_total": int(profile["gpu_memory_total_gb"] * GB),
        "interconnect": spec["facts"]["interconnect"],
    } for i in range(int(sim["gpu_count"]))]


def sim_model_config(spec: dict[str, Any]) -> dict[str, Any]:
    profile = sim_profile(spec["sim"]["profile"])
    arch = profile["model_type"] if spec["model"]["family"] == "MLA" else "LlamaForCausalLM"
    return {"architectures": [arch], "model_type": "sglang-fleet-simulated",
            "num_safetensors_shards": profile["weight_shards"],
            "_comment": "Stand-in model folder for sglang-sim: no weights."}
