#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_argcheck
short_description: Parse a rendered SGLang command line with the installed SGLang
description:
  - Runs the node's server Python and lets the installed SGLang parse the arguments exactly as
    the server will (C(sglang.srt.server_args.prepare_server_args)), so a typo or a flag removed
    in the pinned release fails in seconds, before a 60-minute weight load.
  - Read-only; runs the same in check mode.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  python:
    description: Python interpreter of the server environment.
    type: path
    required: true
  parser:
    description: "C(module:function) that takes the argument list and raises or exits on error."
    type: str
    default: sglang.srt.server_args:prepare_server_args
  args:
    description: Server arguments, without the interpreter and launch module.
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds allowed for importing SGLang and parsing.
    type: int
    default: 180
  record_file:
    description: Where a successful parse is recorded (the arguments and the parser's code),
      so that C(sglang_node) can tell the next deploy that nothing needs parsing again.
    type: path
"""

EXAMPLES = r"""
- name: Let SGLang parse the rendered arguments
  sglang.fleet.sglang_argcheck:
    python: /opt/sglang-fleet/venv/bin/python
    args: ["--model-path", "/models/Kimi-K2.5", "--tp-size", "8"]
"""

RETURN = r"""
parser:
  description: The parser that accepted the arguments.
  returned: success
  type: str
  sample: sglang.srt.server_args:prepare_server_args
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.deploy.argcheck import (
    args_record,
    parse_args,
    record_args_checked,
)
from ansible_collections.sglang.fleet.plugins.module_utils.deploy.deployfiles import (
    DeployFilesError,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            parser=dict(type="str", default="sglang.srt.server_args:prepare_server_args"),
            args=dict(type="list", elements="str", required=True, no_log=False),
            timeout=dict(type="int", default=180),
            record_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    rejected = parse_args(p["python"], p["parser"], p["args"], p["timeout"])
    if rejected is not None:
        msg, rc = rejected
        module.fail_json(msg=msg, **({} if rc is None else {"rc": rc}))
    if p["record_file"] and not module.check_mode:
        with failing(module, DeployFilesError):
            record_args_checked(p["record_file"],
                                args_record(p["python"], p["parser"], p["args"]))
    module.exit_json(changed=False, parser=p["parser"])


if __name__ == "__main__":
    main()
