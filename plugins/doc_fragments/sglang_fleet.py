# -*- coding: utf-8 -*-
# Documentation the modules share (extends_documentation_fragment): the options of the modules
# that act on one deployment (the default fragment; mirrors plugins/module_utils/
# common/args.py), a LaunchSpec as from_spec, the GPU options, the attributes and the
# deployment file writer's options.
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

    # The modules whose action plugin reads a LaunchSpec (sglang_fleet.launch.views).
    FROM_SPEC = r"""
options:
  from_spec:
    description:
      - The sglang_server role's LaunchSpec (C(sglang_server_launch_spec)), or a deployment's
        identity (C(sglang_server_identity)) where the module needs no more. On the
        controller, the module's view of it (C(sglang_fleet.launch.views)) fills every option
        the task does not give; options given beside it win. Never sent to the node.
      - A LaunchSpec of a newer C(schema) than this release reads is refused, naming both.
    type: dict
"""

    # The modules whose action plugin reads a RouterSpec (sglang_fleet.router.views).
    ROUTER_SPEC = r"""
options:
  from_spec:
    description:
      - The sglang_router role's RouterSpec (C(sglang_router__spec)), or a router of
        C(sglang.fleet.sglang_fleet_routers_of) (its C(spec)). On the controller, the module's
        view of it (C(sglang_fleet.router.views)) fills every option the task does not give;
        options given beside it win. Never sent to the router's host.
    type: dict
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

    # What every module supports unless its own attributes say otherwise (a module's entry
    # wins over this one's).
    ATTRIBUTES = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

    # The deployment file writer's options (module_utils/deploy/deployfiles.py's
    # FILE_OPTIONS and SECRET_FILE_OPTIONS); a secret file has the same fields.
    FILES = r"""
options:
  folders:
    description: Folders to create (parents included), each with its mode.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Folder path.
        type: path
        required: true
      mode:
        description: Octal mode, e.g. C("0755").
        type: str
        required: true
  files:
    description: Files to write.
    type: list
    elements: dict
    default: []
    suboptions: &file
      path:
        description: File path.
        type: path
        required: true
      content:
        description: The whole content (in I(secret_files), a secret never shown).
        type: str
        required: true
      mode:
        description: Octal mode, e.g. C("0644"), or C("0600") for a secret file.
        type: str
        required: true
      owner:
        description: Owner (user name); left as created when unset.
        type: str
      group:
        description: Group name; left as created when unset.
        type: str
  secret_files:
    description: Files that hold secrets, as in I(files); their content is not logged or
      shown in diffs.
    type: list
    elements: dict
    default: []
    suboptions: *file
"""
