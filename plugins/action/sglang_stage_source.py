# -*- coding: utf-8 -*-
# Controller side of staging: the inventory's model source resolved into the revision's
# manifest and its origin (sglang_fleet.staging.sources). A Hub revision is downloaded once
# here; a folder's manifest is computed once and kept.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

try:
    from pathlib import Path

    from sglang_fleet.staging.sources import SourceError, resolve
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("source", "piece_size", "cache"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        if _IMPORT_ERROR is not None:
            raise AnsibleActionFail("the sglang_fleet package is not importable by "
                                    "ansible-playbook: %s" % _IMPORT_ERROR)
        args = self._task.args
        if not args.get("cache"):
            raise AnsibleActionFail("sglang_stage_source needs cache (a folder on the controller)")
        try:
            resolved = resolve(args.get("source"), int(args.get("piece_size") or 16 << 20),
                               Path(args["cache"]))
        except SourceError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(changed=False, **resolved)
        return result
