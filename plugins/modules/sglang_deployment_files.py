#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_deployment_files
short_description: Write one deployment's folders and files in one pass
description:
  - Creates the deployment's folders and writes its files (launch script, env file, systemd
    unit) in one module run, where stock modules take one run per folder and per file.
  - Keeps what the stock modules give an operator. Reports C(changed) only when a folder or a
    file had to change. Supports C(--check) and C(--diff), with one diff per file. Sets modes
    and, when given, owners. Replaces each file atomically (written beside it, flushed, renamed
    over it) with its mode set before any content is written.
  - The content of I(secret_files) is never shown, in diffs or anywhere else; their diff names
    a digest of the content instead.
version_added: "0.2.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
  - sglang.fleet.sglang_fleet.files
attributes:
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Write a deployment's files
  sglang.fleet.sglang_deployment_files:
    folders:
      - {path: /opt/sglang-fleet/conf, mode: "0750"}
    files:
      - path: /opt/sglang-fleet/conf/kimi.launch.sh
        content: "#!/usr/bin/env bash\nexec python -m sglang.launch_server ...\n"
        mode: "0755"
    secret_files:
      - path: /opt/sglang-fleet/conf/kimi.env
        content: "SGLANG_FLEET_API_KEY=...\n"
        mode: "0600"
"""

RETURN = r"""
changed_paths:
  description: Folders and files that were (or in check mode would be) created or changed.
  returned: always
  type: list
  elements: str
  sample: [/opt/sglang-fleet/conf/kimi.launch.sh]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.deploy.deployfiles import (
    FILE_OPTIONS,
    SECRET_FILE_OPTIONS,
    DeployFilesError,
    apply,
    plan,
    to_write,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            folders=dict(type="list", elements="dict", default=[],
                         options=dict(path=dict(type="path", required=True),
                                      mode=dict(type="str", required=True))),
            files=dict(type="list", elements="dict", default=[], options=FILE_OPTIONS),
            secret_files=dict(type="list", elements="dict", default=[],
                              options=SECRET_FILE_OPTIONS),
        ),
        supports_check_mode=True,
    )
    p = module.params
    with failing(module, (DeployFilesError, OSError, IOError, ValueError),
                 "cannot write the deployment's files"):
        actions, diffs = plan(p["folders"], to_write(p["files"], p["secret_files"]))
        if not module.check_mode:
            apply(actions)
    result = dict(changed=bool(actions), changed_paths=[item["path"] for _, item in actions])
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
