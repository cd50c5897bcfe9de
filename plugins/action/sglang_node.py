# -*- coding: utf-8 -*-
# Controller side of the sglang_node module: `from_spec` (the LaunchSpec) becomes the options
# that follow from it (spec.node_module_args), and the run that the node check's lock is taken
# for is named (see plugins/action/sglang_lock.py: the run is this worker's parent, readable
# only on the controller). A lock another run holds is left to sglang_lock.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from sglang_fleet.spec import node_module_args
from sglang_fleet.spec_action import SpecViewAction
from sglang_fleet_node.sglang_fleet_lock import controller_run


class ActionModule(SpecViewAction):
    module_name = "sglang_node"

    def view(self, spec, args):
        return node_module_args(spec)

    def module_args(self, args):
        if args.get("lock"):
            args["lock"] = dict(args["lock"], run=controller_run())
        return args
