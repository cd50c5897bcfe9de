#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_sim_node
short_description: Provision a simulated GPU node's hardware and stand-in model folder
description:
  - For the simulated fleet only. Writes the simulated GPUs (C(devices.json) and one device
    stand-in file per GPU, which server processes hold open like C(/dev/nvidiaN)), a stand-in
    model folder (C(config.json) and sparse weight shards that the simulated workers read), and
    the node's shared-memory folder.
  - Idempotent; reports what it would change in check mode.
version_added: "0.1.0"
author: sglang-fleet maintainers
options:
  gpu_dir:
    description: Folder of the simulated GPUs.
    type: path
    required: true
  devices:
    description: GPU descriptions (index, name, uuid, compute_capability, memory_total).
    type: list
    elements: dict
    required: true
  model_dir:
    description: Stand-in model folder.
    type: path
    required: true
  model_config:
    description: Content of the model's C(config.json).
    type: dict
    required: true
  shards:
    description: Number of sparse weight shard files.
    type: int
    default: 8
  shard_size:
    description: Size of each shard file in bytes (sparse).
    type: int
    default: 262144
  shm_dir:
    description: Shared-memory folder of the simulated node.
    type: path
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Provision a simulated 8-GPU node
  sglang_sim_node:
    gpu_dir: /srv/sim/node1/sim/gpus
    devices: "{{ sglang_server_launch_spec | sglang_fleet_sim_devices }}"
    model_dir: /srv/sim/node1/models/Kimi-K2.5
    model_config: {architectures: [DeepseekV3ForCausalLM]}
    shm_dir: /srv/sim/node1/shm
"""

RETURN = r"""
written:
  description: Paths created or rewritten.
  returned: always
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule


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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpu_dir=dict(type="path", required=True),
            devices=dict(type="list", elements="dict", required=True),
            model_dir=dict(type="path", required=True),
            model_config=dict(type="dict", required=True),
            shards=dict(type="int", default=8),
            shard_size=dict(type="int", default=262144),
            shm_dir=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    w = _Writer(module.check_mode)
    try:
        for folder in (p["gpu_dir"], p["model_dir"], p["shm_dir"]):
            w.folder(folder)
        w.text(os.path.join(p["gpu_dir"], "devices.json"),
               json.dumps(p["devices"], indent=2, sort_keys=True) + "\n")
        for dev in p["devices"]:
            w.sparse(os.path.join(p["gpu_dir"], "nvidia%d" % int(dev["index"])), 0, 0o666)
        w.text(os.path.join(p["model_dir"], "config.json"),
               json.dumps(p["model_config"], indent=2, sort_keys=True) + "\n")
        for i in range(1, p["shards"] + 1):
            w.sparse(os.path.join(p["model_dir"], "model-%05d-of-%05d.safetensors"
                                  % (i, p["shards"])), p["shard_size"])
    except (OSError, IOError) as exc:
        module.fail_json(msg="cannot provision the simulated node: %s" % exc, written=w.written)
    module.exit_json(changed=bool(w.written), written=w.written)


if __name__ == "__main__":
    main()
