#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_ledger
short_description: Append a deployment outcome to the controller's ledger
description:
  - Appends one JSON line to the ledger on the controller (ready deploys, recoveries and their
    outcomes) and reports the Rules the ledger now proposes. A configuration that failed the
    same way twice without a Rule covering it is proposed as a new Rule and written to
    C(proposed-rules.yml) beside the ledger, for review; nothing is applied automatically.
  - Runs on the controller through its action plugin; the file is appended atomically, so hosts
    recording at once never interleave lines.
  - Every entry names the run that wrote it (C(run) with the run's id, controller host name
    and ansible-playbook PID), so that the ledgers of runs made in parallel (slices of one
    inventory) can be merged and each entry traced to its run.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  path:
    description: Ledger file on the controller.
    type: path
    required: true
  entry:
    description: The outcome to record.
    type: dict
    required: true
attributes:
  action:
    support: full
"""

EXAMPLES = r"""
- name: Record a recovery
  sglang.fleet.sglang_ledger:
    path: /srv/sglang-fleet/ledger.jsonl
    entry:
      kind: recovery
      host: node1
      verdict: stalled
"""

RETURN = r"""
entry:
  description: The entry as recorded, with C(run) naming the run that wrote it.
  returned: always
  type: dict
proposed_rules:
  description: Rules the ledger proposes after this entry.
  returned: always
  type: list
  elements: dict
"""

from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import (
    controller_only,
)


def main():
    controller_only("sglang_ledger", dict(
        path=dict(type="path", required=True),
        entry=dict(type="dict", required=True)))


if __name__ == "__main__":
    main()
