# -*- coding: utf-8 -*-
# Options shared by the modules that act on one deployment; mirrors
# plugins/module_utils/sglang_fleet_args.py.
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  marker:
    description: Deployment marker, the value of C(SGLANG_FLEET_DEPLOYMENT) in every process.
    type: str
    required: true
  state_file:
    description: The service's state file (supervisor session id, start time, digest).
    type: path
    required: true
  manager:
    description: Service manager of the deployment.
    type: str
    choices: [systemd, supervisor]
    default: supervisor
  unit_name:
    description: systemd unit, required with I(manager=systemd).
    type: str
"""

    GPU = r"""
options:
  gpu_backend:
    description: Where GPU facts come from, NVML (nvidia-ml-py) or the simulated ledger.
    type: str
    choices: [nvml, simulated]
    default: nvml
  sim_dir:
    description: Simulated GPU folder, required with I(gpu_backend=simulated).
    type: path
"""
