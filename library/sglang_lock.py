#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_lock
short_description: One recovery per deployment at a time
description:
  - Takes or releases a lock file on the node. Taking a lock another recovery holds fails
    with a message naming its owner and start time; a lock older than I(stale_after) seconds
    (a controller that died mid-recovery) is taken over and reported.
version_added: "0.1.0"
author: sglang-fleet maintainers
options:
  path:
    description: Lock file.
    type: path
    required: true
  state:
    description: C(acquired) to take the lock, C(released) to give it back.
    type: str
    choices: [acquired, released]
    default: acquired
  owner:
    description: Who holds it (shown to a second recovery).
    type: str
    required: true
  stale_after:
    description: Seconds after which a lock is considered abandoned.
    type: int
    default: 3600
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Take the recovery lock
  sglang_lock:
    path: /opt/sglang-fleet/run/Kimi-K2.5-30000.recover.lock
    owner: "recover.yml from ci-runner-3"
"""

RETURN = r"""
taken_over:
  description: The stale lock that was replaced, if any.
  returned: when a stale lock was replaced
  type: dict
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_fleet_files import read_json


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="acquired", choices=["acquired", "released"]),
            owner=dict(type="str", required=True),
            stale_after=dict(type="int", default=3600),
        ),
        supports_check_mode=True,
    )
    p = module.params
    held = read_json(p["path"])
    if p["state"] == "released":
        mine = held is not None and held.get("owner") == p["owner"]
        if mine and not module.check_mode:
            os.unlink(p["path"])
        module.exit_json(changed=mine)
    result = dict(changed=True)
    if held is not None:
        age = time.time() - float(held.get("at", 0))
        if age < p["stale_after"]:
            module.fail_json(msg="another recovery of this deployment is running: %s, since %s "
                             "(%.0f s ago). Wait for it, or remove %s if it died."
                             % (held.get("owner"), time.strftime(
                                 "%Y-%m-%d %H:%M:%S", time.localtime(held.get("at", 0))),
                                age, p["path"]))
        result["taken_over"] = held
    if not module.check_mode:
        if held is not None:
            os.unlink(p["path"])
        try:
            fd = os.open(p["path"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            module.fail_json(msg="another recovery took the lock %s at the same moment"
                             % p["path"])
        with os.fdopen(fd, "w") as f:
            json.dump({"owner": p["owner"], "at": time.time()}, f)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
