#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_shm_cleanup
short_description: Remove a stopped deployment's leaked shared-memory segments
description:
  - A server killed with SIGKILL leaves its C(/dev/shm) segments behind and the next start can
    die with "Bus error". This removes segments that the deployment's last run created and that
    no live process has open or mapped.
  - A segment counts as the deployment's only when something binds it to the deployment's
    last run, never by its name alone (a shared folder holds other users' and other
    deployments' segments of the same families). Its name carries the PID of one of that
    run's processes where SGLang and torch put it (C(sgl_shm_<kind>_<pid>_<rand>),
    C(multi_tokenizer_args_<pid>), C(torch_<pid>_...)), or one of those processes had it
    open or mapped when the gate observed the run. The run's processes are the state file's
    main PID and those the gate (M(sglang_health) with I(shm_dir)) and M(sglang_stop) found
    by the deployment's membership, recorded beside the state file
    (C(<deployment>.shm.json)).
  - It must also match a server pattern, be a plain file owned by the service user and last
    modified after the deployment's last start. Nothing is removed while any process of the
    deployment is alive, nor before its first start.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  shm_dir:
    description: Shared-memory folder.
    type: path
    default: /dev/shm
  state_file:
    description: The deployment's service state file (its start time dates the last run).
    type: path
    required: true
  marker:
    description: Deployment marker; nothing is removed while a process carries it.
    type: str
    required: true
  owner_uid:
    description: Owner of the deployment's segments; defaults to I(service_user), else the
      user running the module.
    type: int
  service_user:
    description: User the deployment runs as (a name or uid); its segments are owned by it.
    type: str
  patterns:
    description: Name patterns (fnmatch) of segments the server creates. They narrow what is
      removed; a segment must also be bound to the deployment's run.
    type: list
    elements: str
    default: ["sgl_shm_*", "multi_tokenizer_args_*", "torch_*", "psm_*", "sglang*", "nccl-*",
              "cuda.shm.*"]
"""

EXAMPLES = r"""
- name: Remove leaked segments of the last run
  sglang.fleet.sglang_shm_cleanup:
    state_file: /opt/sglang-fleet/run/kimi-k2.5-30000.pid
    marker: "node1:kimi-k2.5-30000"
"""

RETURN = r"""
removed:
  description: Paths removed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
kept_in_use:
  description: Matching segments left because a live process holds them.
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.process.procs import service_uid
from ansible_collections.sglang.fleet.plugins.module_utils.process.shm import (
    PATTERNS,
    leaked_segments,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            shm_dir=dict(type="path", default="/dev/shm"),
            state_file=dict(type="path", required=True),
            marker=dict(type="str", required=True),
            owner_uid=dict(type="int"),
            service_user=dict(type="str"),
            patterns=dict(type="list", elements="str", default=list(PATTERNS)),
        ),
        supports_check_mode=True,
    )
    p = module.params
    owner = p["owner_uid"]
    if owner is None:
        try:
            owner = service_uid(p["service_user"]) if p["service_user"] else os.getuid()
        except (KeyError, ValueError):
            module.fail_json(msg="service_user=%r does not exist on this node"
                             % p["service_user"])
    remove, kept = leaked_segments(p["shm_dir"], p["state_file"], p["marker"], owner,
                                   by_user=bool(p["service_user"]), patterns=p["patterns"])
    result = dict(changed=bool(remove), removed=remove, kept_in_use=kept)
    if not module.check_mode:
        for path in remove:
            with failing(module, OSError, "cannot remove %s" % path, result):
                os.unlink(path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
