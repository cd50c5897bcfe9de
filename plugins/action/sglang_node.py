# -*- coding: utf-8 -*-
# Controller side of the sglang_node module: names the ansible-playbook run that the node
# check's lock is taken for (see plugins/action/sglang_lock.py: the run is this worker's
# parent, readable only on the controller). A lock another run holds is left to sglang_lock.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

try:
    from sglang_fleet_node.sglang_fleet_lock import controller_run
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("lock"):
            if _IMPORT_ERROR is not None:
                raise AnsibleActionFail("the sglang_fleet package is not importable by "
                                        "ansible-playbook: %s" % _IMPORT_ERROR)
            args["lock"] = dict(args["lock"], run=controller_run())
        result.update(self._execute_module(module_name="sglang_node", module_args=args,
                                           task_vars=task_vars))
        return result
