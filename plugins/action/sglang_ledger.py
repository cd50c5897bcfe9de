# -*- coding: utf-8 -*-
# Appends one entry to a controller JSON-lines file (the recovery ledger, the benchmark results
# store) and reports Rules the ledger now proposes. Runs on the controller only: these files
# are the fleet's memory, not a node's.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

try:
    import yaml

    from sglang_fleet.node.common.secrets import mask_secrets
    from sglang_fleet.node.deploy.lock import controller_run, stamped
    from sglang_fleet.recovery.decisions import proposed_rules
    from sglang_fleet.runs.store import append_jsonl, read_jsonl
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path", "entry"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        if _IMPORT_ERROR is not None:
            raise AnsibleActionFail("the sglang_fleet package is not importable by "
                                    "ansible-playbook: %s" % _IMPORT_ERROR)
        path = self._task.args.get("path")
        entry = self._task.args.get("entry")
        if not path or not isinstance(entry, dict):
            raise AnsibleActionFail("sglang_ledger needs path (str) and entry (dict)")
        # Entries carry settings: a secret nested anywhere in them is masked, never stored.
        # Each names the run that wrote it, so that ledgers of parallel runs merge.
        entry = mask_secrets(stamped(entry, controller_run()))
        if self._task.check_mode:
            result.update(changed=True, proposed_rules=[], entry=entry)
            return result
        append_jsonl(path, entry)
        # Only a recovery can add a proposal; results-store entries skip the ledger scan.
        proposals = proposed_rules(read_jsonl(path)) if entry.get("kind") == "recovery" else []
        if proposals:
            target = path.rsplit("/", 1)[0] + "/proposed-rules.yml"
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("# Proposed by sglang-fleet from repeated failures in the ledger.\n"
                        "# Review, then move into src/sglang_fleet/data/rules.yml.\n")
                yaml.safe_dump(proposals, f, sort_keys=False)
        result.update(changed=True, proposed_rules=proposals, entry=entry)
        return result
