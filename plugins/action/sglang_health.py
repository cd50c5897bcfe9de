# -*- coding: utf-8 -*-
# Controller side of sglang_health: `from_spec` (the LaunchSpec) becomes the module's options
# through the LaunchSpec's gate view, the same view sglang_node's `gate` option takes.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

from sglang_fleet.launch.action import SpecViewAction
from sglang_fleet.launch.spec import gate_module_args


class ActionModule(SpecViewAction):
    module_name = "sglang.fleet.sglang_health"

    def view(self, spec, args):
        return gate_module_args(spec)
