# -*- coding: utf-8 -*-
# Argument specs shared by the modules that act on one deployment (documented once in
# plugins/doc_fragments/sglang_fleet.py).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DEPLOYMENT_ARGS = dict(
    marker=dict(type="str", required=True),
    state_file=dict(type="path", required=True),
    manager=dict(type="str", default="supervisor", choices=["systemd", "supervisor"]),
    unit_name=dict(type="str"),
)
GPU_ARGS = dict(
    gpu_backend=dict(type="str", default="nvml", choices=["nvml", "simulated"]),
    sim_dir=dict(type="path"),
)
DEPLOYMENT_REQUIRED_IF = [("manager", "systemd", ("unit_name",)),
                          ("gpu_backend", "simulated", ("sim_dir",))]


def deployment_argument_spec(**more):
    spec = dict(DEPLOYMENT_ARGS)
    spec.update(GPU_ARGS)
    spec.update(more)
    return spec
