"""What a simulated node is made of: its GPUs (devices.json) and a stand-in model folder."""

from __future__ import annotations

from typing import Any

from sglang_fleet.models import known_model
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


def sim_model_files(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The stand-in model folder's JSON files, by name: its config.json with the shape of the
    model the path names where the controller knows it (so the node check and the simulator
    read the heads, experts and layers a real checkpoint has), and for a known model the
    safetensors index with its checkpoint's real size (its shards are sparse stand-ins)."""
    profile = sim_profile(spec["sim"]["profile"])
    known = known_model(spec["model"]["path"])
    config = known.config_json() if known else {}
    arch = profile["model_type"] if spec["model"]["family"] == "MLA" else "LlamaForCausalLM"
    config.update({"architectures": [arch], "model_type": "sglang-fleet-simulated",
                   "num_safetensors_shards": profile["weight_shards"],
                   "_comment": "Stand-in model folder for sglang-sim: no weights."})
    files = {"config.json": config}
    if known:
        files["model.safetensors.index.json"] = {
            "metadata": {"total_size": known.checkpoint_bytes,
                         "_comment": f"simulated: {known.name}'s checkpoint size"},
            "weight_map": {}}
    return files
