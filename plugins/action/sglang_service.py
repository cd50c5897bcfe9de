# -*- coding: utf-8 -*-
# Controller side of sglang_service: `from_spec` (the LaunchSpec, or a deployment's identity
# for a stop) becomes the module's options through the LaunchSpec's service view, plus, for a
# start, its start view (the one sglang_node's `start` option takes). `group_hosts`: the
# inventory hosts of its multi-node group.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

from sglang_fleet.launch.action import SpecViewAction
from sglang_fleet.launch.spec import service_module_args, start_module_args


class ActionModule(SpecViewAction):
    module_name = "sglang.fleet.sglang_service"
    controller_options = ("group_hosts",)

    def view(self, spec, args):
        options = service_module_args(spec)
        if args.get("state", "started") != "stopped":
            options.update(start_module_args(spec, args.get("group_hosts") or []),
                           gpu_backend=spec["gpu"]["backend"], sim_dir=spec["gpu"]["sim_dir"],
                           shm_dir=spec["paths"]["shm_dir"])
        return options
