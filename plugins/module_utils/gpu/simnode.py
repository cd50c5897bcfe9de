# -*- coding: utf-8 -*-
# What a simulated node is made of, written on the node from the LaunchSpec's description of it
# (its `sim` section): its GPUs (devices.json and one device file per GPU, which the simulated
# workers hold open) and a stand-in model folder. Idempotent: reports what it wrote, writes
# nothing in check mode. The GPU layer's simulated backend reads what this writes.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

SHARDS = 8
SHARD_SIZE = 262144
GIB = 1 << 30
GPU_NAMES = {"12.0": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "10.0": "NVIDIA B200",
             "9.0": "NVIDIA H200"}


def node_devices(host, sim):
    """The simulated node's GPUs, as NVML would list them."""
    major, minor = (int(x) for x in sim["compute_capability"].split("."))
    name = GPU_NAMES.get(sim["compute_capability"], sim.get("gpu_model") or "NVIDIA GPU")
    return [{
        "index": i,
        "name": "%s (simulated)" % name,
        "uuid": "GPU-sim-%s-%02d" % (host, i),
        "compute_capability": [major, minor],
        "memory_total": int(sim["gpu_memory_gb"] * GIB),
        "interconnect": sim["interconnect"],
    } for i in range(int(sim["gpu_count"]))]


def model_files(sim, family):
    """The stand-in model folder's JSON files: a config.json with the shape of the model the
    path names where the toolkit knows it (the node check and the simulator read its heads,
    experts and layers), and for a known model the safetensors index with its checkpoint's
    size (its shards are sparse stand-ins)."""
    config = dict(sim.get("model_config") or {})
    arch = sim["model_type"] if family == "MLA" else "LlamaForCausalLM"
    config.update({"architectures": [arch], "model_type": "sglang-fleet-simulated",
                   "num_safetensors_shards": sim["weight_shards"],
                   "_comment": "Stand-in model folder for sglang-sim: no weights."})
    files = {"config.json": config}
    if sim.get("checkpoint_bytes"):
        files["model.safetensors.index.json"] = {
            "metadata": {"total_size": sim["checkpoint_bytes"],
                         "_comment": "simulated: the named model's checkpoint size"},
            "weight_map": {}}
    return files


class _Writer(object):
    def __init__(self, check_mode):
        self.check_mode = check_mode
        self.written = []

    def folder(self, path):
        if not os.path.isdir(path):
            self.written.append(path)
            if not self.check_mode:
                os.makedirs(path, exist_ok=True)

    def text(self, path, content):
        try:
            with open(path) as f:
                if f.read() == content:
                    return
        except (OSError, IOError):
            pass
        self.written.append(path)
        if not self.check_mode:
            # Nodes of a simulated group may provision a shared model folder at once.
            tmp = "%s.%d.tmp" % (path, os.getpid())
            with open(tmp, "w") as f:
                f.write(content)
            os.rename(tmp, path)

    def sparse(self, path, size, mode=None):
        if os.path.exists(path):
            return
        self.written.append(path)
        if not self.check_mode:
            with open(path, "ab") as f:  # append mode: a concurrent creator loses nothing
                f.truncate(size)
            if mode is not None:
                os.chmod(path, mode)


def provision(gpu_dir, devices, model_dir, model_files, shm_dir, check_mode,
              shards=SHARDS, shard_size=SHARD_SIZE):
    """Write the simulated node's GPUs and model; the paths written (or to be written)."""
    w = _Writer(check_mode)
    for folder in (gpu_dir, model_dir, shm_dir):
        w.folder(folder)
    w.text(os.path.join(gpu_dir, "devices.json"),
           json.dumps(devices, indent=2, sort_keys=True) + "\n")
    for dev in devices:
        w.sparse(os.path.join(gpu_dir, "nvidia%d" % int(dev["index"])), 0, 0o666)
    for name in sorted(model_files):
        w.text(os.path.join(model_dir, name),
               json.dumps(model_files[name], indent=2, sort_keys=True) + "\n")
    for i in range(1, shards + 1):
        w.sparse(os.path.join(model_dir, "model-%05d-of-%05d.safetensors" % (i, shards)),
                 shard_size)
    return w.written
