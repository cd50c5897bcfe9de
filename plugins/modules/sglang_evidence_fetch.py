#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_evidence_fetch
short_description: Bring a recovery's evidence bundle to the controller in one transfer
description:
  - Runs on the controller through its action plugin. Fetches the archive that
    sglang.fleet.sglang_evidence packed on the node with one C(ansible.builtin.fetch) (its
    checksum check and its C(become) handling), unpacks it under I(dest) on the controller,
    makes I(dest) private (folders 0700, files 0600), and removes the archive from the node.
    The bundle's folder stays on the node.
  - A member of the archive that is not a plain file or folder under the bundle's own folder
    (a link, a device, an absolute or C(..) path) fails the task and nothing is unpacked.
  - One fetch instead of one per file, because each file fetch runs a remote C(stat) module and a
    bundle holds a file per process of the server.
version_added: "1.0.0"
author: sglang-fleet
options:
  src:
    description:
      - The archive on the node (sglang.fleet.sglang_evidence's C(archive)). Empty (check
        mode) does nothing.
    type: str
    required: true
  dest:
    description:
      - The controller folder the bundle's folder is unpacked into (one per host).
    type: path
    required: true
attributes:
  check_mode:
    support: full
    description: Fetches and unpacks nothing; reports what would be unpacked where.
  diff_mode:
    support: none
    description: Not applicable.
  action:
    support: full
    description: Runs on the controller through its action plugin.
"""

EXAMPLES = r"""
- name: Fetch the evidence to the controller
  sglang.fleet.sglang_evidence_fetch:
    # The archive sglang.fleet.sglang_evidence returned (registered as evidence).
    src: "{{ evidence.archive }}"
    dest: "evidence/{{ inventory_hostname }}"
"""

RETURN = r"""
dest:
  description: The bundle's folder on the controller.
  returned: success
  type: str
files:
  description: The files unpacked, relative to I(dest).
  returned: success
  type: list
  elements: str
"""

from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import (
    controller_only,
)


def main():
    controller_only("sglang_evidence_fetch", dict(
        src=dict(type="str", required=True),
        dest=dict(type="path", required=True)))


if __name__ == "__main__":
    main()
