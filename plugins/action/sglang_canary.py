# -*- coding: utf-8 -*-
# Judges a canary under live traffic against the servers still on the baseline, on the
# controller (sglang_fleet.rollout): it reaches every server's and router's HTTP port, as the
# routers do. Returns the judgement; the playbook rolls back or stops on it.
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
    from sglang_fleet.rollout.window import ScrapeError, Target, observe
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


def _target(value, what):
    if not isinstance(value, dict) or not all(value.get(k) for k in ("host", "url")):
        raise AnsibleActionFail("sglang_canary: %s must be a dict with host and url, got %r"
                                % (what, value))
    return Target(str(value["host"]), str(value["url"]),
                  str(value.get("worker_url") or value["url"]),
                  str(value["release"]) if value.get("release") else None)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("canary", "baselines", "router_metrics", "settings", "api_key"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        if _IMPORT_ERROR is not None:
            raise AnsibleActionFail("the sglang_fleet package is not importable by "
                                    "ansible-playbook: %s" % _IMPORT_ERROR)
        args = self._task.args
        plan, problems = plan_from_vars(dict(args.get("settings") or {}))
        if problems:
            return dict(result, failed=True, msg="; ".join(problems))
        canary = _target(args.get("canary"), "canary")
        baselines = [_target(b, "each of baselines") for b in args.get("baselines") or []]
        if self._play_context.check_mode:
            return dict(result, skipped=True, msg="check mode: no window was run")
        try:
            judgement = observe(plan, canary, baselines, list(args.get("router_metrics") or []),
                                args.get("api_key") or None)
        except ScrapeError as exc:
            return dict(result, failed=True, msg="%s: canary not judged: %s" % (canary.host, exc))
        return dict(result, changed=False, judgement=judgement)
