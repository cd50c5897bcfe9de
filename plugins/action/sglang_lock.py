# -*- coding: utf-8 -*-
# Controller side of the sglang_lock module: names the run that takes the lock, decides
# whether the owner of a lock held by another run is proven gone, and records every take-over
# in the ledger.
#
# The owner of a deployment's lock is the ansible-playbook run that took it. Ansible runs each
# task in a worker process forked from ansible-playbook, so this plugin's parent process is
# the run (see module_utils/deploy/lock.controller_run). Its PID proves it alive or gone only on a
# controller on the same kernel and in the same PID namespace, or in that kernel's initial PID
# namespace (which sees every namespace's processes), so that judgement is made here,
# not on the node; the node judges the lease (its own clocks) and an empty lock file, and
# reports them as the held record's `stale`. A lock whose owner is neither is never taken
# over; the refusal says when the lease runs out and how to clear the lock by hand.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

try:
    from sglang_fleet.node.common.secrets import mask_secrets
    from sglang_fleet.node.deploy.lock import (
        STOP_WAIT_S,
        controller_run,
        describe,
        owner_checkable,
        owner_gone,
        pid_checkable,
        stamped,
        stop_may_take_over,
    )
    from sglang_fleet.runs.store import append_jsonl
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None

# A recovery stopped at these stages has no ledger entry yet (see roles/sglang_recover).
_UNRECORDED_STAGES = ("stopped", "chosen")


def ledger_entries(held, because, args, host):
    """What the ledger records for a take-over of `held`: the take-over, and the unfinished
    recovery it ends unless this run is a recovery that finishes it (and records it itself)."""
    name = args.get("name", "")
    entries = [{"kind": "lock_taken_over", "host": host, "deployment": name.partition(":")[2],
                "lock": args.get("path"), "by": args.get("purpose", "change"),
                "from": describe(held), "because": because,
                "from_run": held.get("run") or {}}]
    recovery = held.get("recovery") or {}
    if recovery.get("stage") in _UNRECORDED_STAGES and args.get("purpose") != "recover":
        verdict = recovery.get("verdict") or {}
        entries.append({
            "kind": "recovery", "host": host, "deployment": name.partition(":")[2],
            "config_hash": recovery.get("failed_config_hash", ""),
            "verdict": verdict.get("verdict", ""), "phase": verdict.get("phase", ""),
            "reason": verdict.get("reason", ""), "evidence": recovery.get("evidence", ""),
            "killed": [k.get("pid") for k in (recovery.get("stop") or {}).get("killed") or []
                       if isinstance(k, dict)],
            "next": recovery.get("next") or {}, "interrupted": True,
            "finished_by": args.get("purpose", "change")})
    return entries


def refusal_hint(held, here, path, purpose="change"):
    """How to read a refusal: why the owner counts as alive, and the fix."""
    run = held.get("run") or {}
    by_hand = "if that run is gone, remove %s on the node" % path
    if held.get("unreadable") or not run:
        return ("it names no run that can be checked. Fix: if no deploy, recover or stop of "
                "this deployment is running, remove %s on the node" % path)
    if pid_checkable(run, here):
        return "it is alive (pid %s on this controller)" % run.get("pid")
    if owner_checkable(run, here):
        return ("it is alive (pid %s in PID namespace %s, a container on this controller: "
                "found from the initial PID namespace)" % (run.get("pid"), run.get("pid_ns")))
    if purpose == "stop":
        wait = max(0.0, STOP_WAIT_S - float(held.get("silence_s") or 0))
        ends = ("a stop takes it over once the lock has gone %.0f s unrenewed (in %.0f s "
                "unless renewed)" % (STOP_WAIT_S, wait))
    else:
        ends = "its lease runs out in %.0f s unless renewed" % (held.get("lease_left") or 0)
    return ("its run cannot be checked from here (%s, pid %s in another kernel or PID "
            "namespace); it counts as alive while it renews the lock: %s. Fix: wait, or %s" % (
                run.get("host", "unknown host"), run.get("pid", "?"), ends, by_hand))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        if _IMPORT_ERROR is not None:
            raise AnsibleActionFail("the sglang_fleet package is not importable by "
                                    "ansible-playbook: %s" % _IMPORT_ERROR)
        args = dict(self._task.args)
        ledger = args.pop("ledger", None)
        here = controller_run()
        args.setdefault("run", here)
        res = self._execute_module(module_name="sglang.fleet.sglang_lock", module_args=args,
                                   task_vars=task_vars)
        if args.get("state", "acquired") != "acquired" or res.get("outcome") != "held":
            result.update(res)
            return result
        held = res.get("held_by") or {}
        gone = owner_gone(held.get("run"), here) or held.get("stale")
        if not gone and args.get("purpose") == "stop":
            # A stop needs no more than the identity and the node: it waits for an owner it
            # cannot check only while that owner keeps renewing (STOP_WAIT_S).
            gone = stop_may_take_over(held, res.get("silence_s"),
                                      owner_checkable(held.get("run"), here))
        if not gone:
            hint = refusal_hint(dict(held, lease_left=res.get("lease_left"),
                                     silence_s=res.get("silence_s")), here,
                                args.get("path"), args.get("purpose", "change"))
            res["msg"] = "%s %s." % (res.get("msg", ""), hint[0].upper() + hint[1:])
            result.update(res)
            return result
        res = self._execute_module(module_name="sglang.fleet.sglang_lock",
                                   module_args=dict(args, take_over=held),
                                   task_vars=task_vars)
        if res.get("outcome") == "taken_over":
            res["taken_over_because"] = gone
            res.setdefault("warnings", []).append(
                "%s: took over the lock of %s: %s" % (args.get("name", "deployment"),
                                                      describe(held), gone))
            if ledger and not self._task.check_mode:
                host = (task_vars or {}).get("inventory_hostname", "")
                for entry in ledger_entries(held, gone, args, host):
                    append_jsonl(ledger, mask_secrets(stamped(entry, here)))
        result.update(res)
        return result
