#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_env
short_description: Keep one release environment per pinned requirement set on a node
description:
  - A release environment is a folder of I(envs_dir) (C(<root>/envs/<id>)), the id a short
    hash of its sorted requirement lines. Its marker file (C(sglang-fleet-env.json)) records
    the requirements once an install completed, and when a server on it last reached ready.
  - I(state=check) says whether the environment already holds the requirements, so that
    the install is skipped (a rollback to a kept release installs nothing).
  - I(state=installed) writes the marker after an install.
  - I(state=ready) records that a server (re)started on it reached ready, then removes the
    oldest environments beyond I(keep), never one of I(protected) nor I(env_id) itself.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.from_spec
  - sglang.fleet.sglang_fleet.attributes
options:
  state:
    description: What to do.
    type: str
    choices: [check, installed, ready]
    required: true
  envs_dir:
    description: Folder of the deployment's release environments.
    type: path
    required: true
  env_id:
    description: The environment's id (its folder's name).
    type: str
    required: true
  requirements:
    description: Its requirement lines.
    type: list
    elements: str
    default: []
  keep:
    description: Environments kept after I(state=ready), this one included.
    type: int
    default: 2
  protected:
    description: Ids never removed (the ledger's previous ready and last known good).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Is the release's environment installed already?
  sglang.fleet.sglang_env:
    state: check
    envs_dir: /opt/sglang-fleet/envs
    env_id: 3f2a9c1b7d40
    requirements: ["sglang[all]==0.5.23", "py-spy"]

- name: The LaunchSpec's environment, from its view (sglang_fleet.launch.views.env_view)
  sglang.fleet.sglang_env:
    from_spec: "{{ sglang_server_launch_spec }}"
    state: check

- name: Record the ready start and prune
  sglang.fleet.sglang_env:
    state: ready
    envs_dir: /opt/sglang-fleet/envs
    env_id: 3f2a9c1b7d40
    keep: 2
    protected: [0a1b2c3d4e5f]
"""

RETURN = r"""
installed:
  description: Whether the environment holds the requirements (I(state=check)).
  returned: always
  type: bool
pruned:
  description: Ids of the environments removed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
kept:
  description: Ids of the environments left.
  returned: always
  type: list
  elements: str
"""

import datetime
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.deploy import envs


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=["check", "installed", "ready"]),
            envs_dir=dict(type="path", required=True),
            env_id=dict(type="str", required=True),
            requirements=dict(type="list", elements="str", default=[]),
            keep=dict(type="int", default=2),
            protected=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["keep"] < 1:
        module.fail_json(msg="sglang_server_env_keep=%d: must be at least 1 (the serving "
                         "environment). Fix: set it to 1 or more" % p["keep"])
    marker = os.path.join(p["envs_dir"], p["env_id"], envs.MARKER)
    check = module.check_mode
    changed, pruned = False, []
    with failing(module, (OSError, IOError), "release environments in %s" % p["envs_dir"]):
        if p["state"] == "installed":
            changed = envs.record_installed(marker, p["requirements"], _now(), check)
        elif p["state"] == "ready":
            changed = envs.record_ready(marker, _now(), check)
            pruned = envs.prune(p["envs_dir"], p["keep"],
                                set(p["protected"]) | {p["env_id"]}, check)
            changed = changed or bool(pruned)
    kept = sorted(set(envs.environments(p["envs_dir"])) - set(pruned))
    module.exit_json(changed=changed, installed=envs.installed(marker, p["requirements"]),
                     pruned=pruned, kept=kept)


if __name__ == "__main__":
    main()
