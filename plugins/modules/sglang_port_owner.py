#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_port_owner
short_description: Say whether a server's port is served by its own deployment
description:
  - Reads the node's listening sockets (C(/proc/net/tcp), C(/proc/net/tcp6)) and the processes
    that hold them, and compares their deployment marker with I(marker).
  - A router lists its workers by URL only. Before a server's URL is taken out of a router,
    the fleet asks its node whether that URL's port is served by this deployment's own server;
    one held by another deployment (another host's server that took the port) stays in the
    router.
  - Changes nothing.
version_added: "1.0.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  port:
    description: The server's HTTP port.
    type: int
    required: true
  host:
    description: The address the server listens on (C(0.0.0.0) or empty for every address).
    type: str
    default: ""
  marker:
    description: The deployment's marker, which every process of its server carries.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Ask the node who serves this server's port
  sglang.fleet.sglang_port_owner:
    port: 30000
    host: 0.0.0.0
    marker: node1:Kimi-K2.5-30000
  register: owner
"""

RETURN = r"""
owner:
  description: C(own) when the deployment's own server listens on the port, C(other) when
    another process does, C(free) when nothing listens.
  returned: always
  type: str
  sample: other
holder:
  description: The other process that listens on the port (pid, deployment, command line),
    or null.
  returned: always
  type: str
  sample: "pid 4242 (deployment node2:Kimi-K2.5-30000, python -m sglang.launch_server ...)"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.process.startcheck import (
    port_owner,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            port=dict(type="int", required=True),
            host=dict(type="str", default=""),
            marker=dict(type="str", required=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    with failing(module, (OSError, IOError), "cannot read who holds port %d" % p["port"]):
        owner = port_owner(p["host"] or None, p["port"], p["marker"])
    module.exit_json(changed=False, **owner)


if __name__ == "__main__":
    main()
