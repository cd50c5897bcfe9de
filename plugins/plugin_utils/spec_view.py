# -*- coding: utf-8 -*-
# Controller side of the modules that need nothing of the controller but their LaunchSpec
# view: each one's action plugin (plugins/action/<module>.py) is this class. `from_spec` (the
# LaunchSpec) becomes the module's options through its view in sglang_fleet.launch.views.VIEWS;
# what the task gives beside it is the task's own.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

from sglang_fleet.launch.action import SpecViewAction
from sglang_fleet.launch.views import CONTROLLER_OPTIONS, VIEWS


class ActionModule(SpecViewAction):
    def spec_args(self, task_vars):
        # The module this task names.
        short = self._task.action.rpartition(".")[2]
        if short not in VIEWS:
            raise AnsibleActionFail("spec_view: no LaunchSpec view for the module %s" % short)
        self.module_name = "sglang.fleet." + short
        self.controller_options = CONTROLLER_OPTIONS.get(short, ())
        return super(ActionModule, self).spec_args(task_vars)

    def view(self, spec, args):
        return VIEWS[self.module_name.rpartition(".")[2]](spec, args)
