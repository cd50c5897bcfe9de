# -*- coding: utf-8 -*-
# Judges the canaries (or a batch's servers) under live traffic against the servers still on
# the baseline, all in one window, on the controller (sglang_fleet.rollout): it reaches every
# server's and router's HTTP port, as the routers do. Returns each one's judgement; the
# playbook rolls back or stops on them.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

try:
    from sglang_fleet.rollout.plan import plan_from_vars
    from sglang_fleet.rollout.window import Job, Target, observe, unjudged
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


class _Refused(Exception):
    pass


def _target(value, what):
    if not isinstance(value, dict) or not all(value.get(k) for k in ("host", "url")):
        raise _Refused("%s must be a dict with host and url, got %r" % (what, value))
    return Target(str(value["host"]), str(value["url"]),
                  str(value.get("worker_url") or value["url"]),
                  str(value["release"]) if value.get("release") else None)


def _job(value, api_keys):
    """The job one host's dict describes; _Refused naming what is wrong with it."""
    if not isinstance(value, dict):
        raise _Refused("each of jobs must be a dict, got %r" % (value,))
    plan, problems = plan_from_vars(dict(value.get("settings") or {}))
    if problems:
        raise _Refused("; ".join(problems))
    canary = _target(value.get("canary"), "canary")
    return Job(plan, canary, tuple(_target(b, "each of baselines")
                                   for b in value.get("baselines") or []),
               tuple(value.get("router_metrics") or []),
               api_keys.get(canary.host) or None)


def _host_of(value):
    canary = value.get("canary") if isinstance(value, dict) else None
    return str(canary.get("host")) if isinstance(canary, dict) and canary.get("host") else None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("jobs", "api_keys"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        if _IMPORT_ERROR is not None:
            raise AnsibleActionFail("the sglang_fleet package is not importable by "
                                    "ansible-playbook: %s" % _IMPORT_ERROR)
        api_keys = dict(self._task.args.get("api_keys") or {})
        jobs, judgements = [], {}
        # One host's bad job leaves that host unjudged, never the batch (the task runs once
        # for every host of it).
        for value in self._task.args.get("jobs") or []:
            try:
                jobs.append(_job(value, api_keys))
            except _Refused as exc:
                host = _host_of(value)
                if host is None:
                    raise AnsibleActionFail("sglang_canary: %s" % exc) from None
                judgements[host] = unjudged(host, str(exc))
        if self._play_context.check_mode:
            return dict(result, skipped=True, msg="check mode: no window was run")
        judgements.update(observe(jobs) if jobs else {})
        return dict(result, changed=False, judgements=judgements)
