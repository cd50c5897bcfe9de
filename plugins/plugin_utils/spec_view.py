# -*- coding: utf-8 -*-
# Controller side of the modules that need nothing of the controller but their view of a
# LaunchSpec or a RouterSpec: each one's action plugin (plugins/action/<module>.py) is this
# class. `from_spec` becomes the module's options through its view in
# sglang_fleet.launch.views.VIEWS (a server's) or sglang_fleet.router.views.VIEWS (a router's);
# what the task gives beside it is the task's own.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleActionFail
from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

from sglang_fleet.launch import views as launch_views
from sglang_fleet.launch.action import SpecViewAction
from sglang_fleet.router import views as router_views

# What each family of modules takes as from_spec, and where its views are.
SPEC_VIEWS = (("LaunchSpec", launch_views), ("RouterSpec", router_views))


class ActionModule(SpecViewAction):
    def spec_args(self, task_vars):
        # The module this task names.
        short = self._task.action.rpartition(".")[2]
        found = [(kind, views) for kind, views in SPEC_VIEWS if short in views.VIEWS]
        if not found:
            raise AnsibleActionFail("spec_view: no LaunchSpec or RouterSpec view for the "
                                    "module %s" % short)
        self.spec_kind, views = found[0]
        self._view = views.VIEWS[short]
        self.module_name = "sglang.fleet." + short
        self.controller_options = views.CONTROLLER_OPTIONS.get(short, ())
        return super(ActionModule, self).spec_args(task_vars)

    def view(self, spec, args):
        return self._view(spec, args)
