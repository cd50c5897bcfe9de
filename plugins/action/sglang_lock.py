# -*- coding: utf-8 -*-
# Controller side of the sglang_lock module: names the run that takes the lock and decides
# whether the owner of a lock held by another run is gone.
#
# The owner of a deployment's lock is the ansible-playbook run that took it. Ansible runs each
# task in a worker process forked from ansible-playbook, so this plugin's parent process is
# the run: its host name, PID, start time (/proc/PID/stat field 22) and boot id name it for
# good, however the playbook was started (ansible-playbook, sglang-fleet through
# ansible-runner, watch). Whether that run is still alive can only be judged on its own
# controller, so the judgement is made here, not on the node; a lock held from another
# controller is never taken over, and the refusal says how to clear it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

try:
    from sglang_fleet_node.sglang_fleet_lock import controller_run, describe, owner_gone
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        if _IMPORT_ERROR is not None:
            raise AnsibleActionFail("the sglang_fleet package is not importable by "
                                    "ansible-playbook: %s" % _IMPORT_ERROR)
        args = dict(self._task.args)
        here = controller_run()
        args.setdefault("run", here)
        res = self._execute_module(module_name="sglang_lock", module_args=args,
                                   task_vars=task_vars)
        if args.get("state", "acquired") != "acquired" or res.get("outcome") != "held":
            result.update(res)
            return result
        held = res.get("held_by") or {}
        gone = owner_gone(held.get("run"), here)
        if gone:
            res = self._execute_module(module_name="sglang_lock",
                                       module_args=dict(args, take_over=held),
                                       task_vars=task_vars)
            if res.get("outcome") == "taken_over":
                res["taken_over_because"] = gone
                res.setdefault("warnings", []).append(
                    "%s: took over the lock of %s: %s" % (args.get("name", "deployment"),
                                                          describe(held), gone))
            result.update(res)
            return result
        run = held.get("run") or {}
        if not run:
            how = ("it names no run that can be checked; if that run is gone, remove %s on the "
                   "node" % args.get("path"))
        elif run.get("host") == here["host"]:
            how = "it is alive (pid %s on this controller)" % run.get("pid")
        else:
            how = ("it ran from another controller (%s), which cannot be checked from here; if "
                   "that run is gone, remove %s on the node" % (run.get("host", "unknown"),
                                                                args.get("path")))
        res["msg"] = "%s %s." % (res.get("msg", ""), how[0].upper() + how[1:])
        result.update(res)
        return result
