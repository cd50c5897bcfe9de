#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_gpu_facts
short_description: Report a node's GPUs (count, compute capability, memory, processes)
description:
  - Reads the node's GPUs through NVML (nvidia-ml-py) or, on the simulated fleet, through the
    simulated GPU ledger. Every NVML query runs under a timeout; a hung driver is reported as a
    failure that says so, not a hung task.
  - Read-only; runs the same in check mode.
version_added: "0.1.0"
author: sglang-fleet maintainers
options:
  backend:
    description: Where GPU facts come from.
    type: str
    choices: [nvml, simulated]
    default: nvml
  sim_dir:
    description: Folder of the simulated GPUs, required with I(backend=simulated).
    type: path
  timeout:
    description: Seconds to wait for NVML before reporting the driver as hung.
    type: float
    default: 10
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
requirements:
  - nvidia-ml-py on the node for I(backend=nvml)
"""

EXAMPLES = r"""
- name: Read the GPUs
  sglang_gpu_facts:
    backend: nvml
  register: sglang_server_gpus

- name: Read the simulated GPUs of a simulated node
  sglang_gpu_facts:
    backend: simulated
    sim_dir: /srv/sim/node1/sim/gpus
"""

RETURN = r"""
count:
  description: Number of GPUs.
  returned: success
  type: int
  sample: 8
compute_capabilities:
  description: Distinct compute capabilities, as "major.minor".
  returned: success
  type: list
  elements: str
  sample: ["12.0"]
devices:
  description: Per GPU index, name, uuid, compute_capability, memory_total, memory_used,
    memory_free (bytes) and processes (pid, used_memory).
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_fleet_gpu import GpuQueryTimeout, GpuUnavailable, gpu_snapshot


def main():
    module = AnsibleModule(
        argument_spec=dict(
            backend=dict(type="str", default="nvml", choices=["nvml", "simulated"]),
            sim_dir=dict(type="path"),
            timeout=dict(type="float", default=10),
        ),
        required_if=[("backend", "simulated", ("sim_dir",))],
        supports_check_mode=True,
    )
    p = module.params
    try:
        devices = gpu_snapshot(p["backend"], p["sim_dir"], p["timeout"])
    except (GpuQueryTimeout, GpuUnavailable) as exc:
        module.fail_json(msg="GPU query failed (%s backend): %s" % (p["backend"], exc))
    module.exit_json(
        changed=False,
        count=len(devices),
        compute_capabilities=sorted({d["compute_capability"] for d in devices}),
        devices=devices,
    )


if __name__ == "__main__":
    main()
