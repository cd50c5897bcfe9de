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
  - A segment counts as the deployment's when its name matches a server pattern, it is owned by
    the service user and it was last modified after the deployment's last start. Nothing is
    removed while any process of the deployment is alive, nor before its first start.
version_added: "0.1.0"
author: sglang-fleet maintainers
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
    description: Name patterns (fnmatch) of segments the server creates.
    type: list
    elements: str
    default: ["psm_*", "sglang*", "nccl-*", "torch_*", "cuda.shm.*"]
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Remove leaked segments of the last run
  sglang_shm_cleanup:
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

import fnmatch
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_fleet_files import read_json
from ansible.module_utils.sglang_fleet_procs import (
    deployment_processes,
    recorded_session,
    service_uid,
)


def _paths_in_use(shm_dir):
    """Segments some live process has open (fd) or mapped (maps)."""
    used = set()
    prefix = shm_dir.rstrip("/") + "/"
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if target.startswith(prefix):
                    used.add(target)
            with open("/proc/%s/maps" % pid) as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith(prefix):
                        used.add(parts[5].strip().replace(" (deleted)", ""))
        except (OSError, IOError):
            continue
    return used


def _last_start(state_file):
    try:
        return float((read_json(state_file) or {})["started_at"])
    except (KeyError, TypeError, ValueError):
        return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            shm_dir=dict(type="path", default="/dev/shm"),
            state_file=dict(type="path", required=True),
            marker=dict(type="str", required=True),
            owner_uid=dict(type="int"),
            service_user=dict(type="str"),
            patterns=dict(type="list", elements="str",
                          default=["psm_*", "sglang*", "nccl-*", "torch_*", "cuda.shm.*"]),
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
    result = dict(changed=False, removed=[], kept_in_use=[])
    state = read_json(p["state_file"]) or {}
    since = _last_start(p["state_file"])
    if since is None or not os.path.isdir(p["shm_dir"]) or \
            deployment_processes(p["marker"], uid=owner if p["service_user"] else None,
                                 **recorded_session(state)):
        module.exit_json(**result)
    in_use = _paths_in_use(p["shm_dir"])
    for name in sorted(os.listdir(p["shm_dir"])):
        path = os.path.join(p["shm_dir"], name)
        if not any(fnmatch.fnmatch(name, pat) for pat in p["patterns"]):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != owner or st.st_mtime < since:
            continue
        if path in in_use:
            result["kept_in_use"].append(path)
            continue
        result["removed"].append(path)
        if not module.check_mode:
            try:
                os.unlink(path)
            except OSError as exc:
                module.fail_json(msg="cannot remove %s: %s" % (path, exc), **result)
    result["changed"] = bool(result["removed"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
