# -*- coding: utf-8 -*-
# Appends one outcome to the controller's ledger (JSON lines) and reports Rules the ledger now
# proposes. Runs on the controller only: the ledger is the fleet's memory, not a node's.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

try:
    import yaml

    from sglang_fleet.recovery import append_ledger, proposed_rules, read_ledger
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
        if self._task.check_mode:
            result.update(changed=True, proposed_rules=[])
            return result
        append_ledger(path, entry)
        proposals = proposed_rules(read_ledger(path))
        if proposals:
            with open(path.rsplit("/", 1)[0] + "/proposed-rules.yml", "w") as f:
                f.write("# Proposed by sglang-fleet from repeated failures in the ledger.\n"
                        "# Review, then move into src/sglang_fleet/data/rules.yml.\n")
                yaml.safe_dump(proposals, f, sort_keys=False)
        result.update(changed=True, proposed_rules=proposals)
        return result
