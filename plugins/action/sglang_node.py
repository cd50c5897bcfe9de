# -*- coding: utf-8 -*-
# Controller side of the sglang_node module: `from_spec` (the LaunchSpec) becomes the options
# that follow from it (spec.node_module_args), its launch files rendered once with
# `secret_values`; outside check mode the check also takes the gate's observation, the
# deployment's lock (named after this run: see plugins/action/sglang_lock.py, the run is this
# worker's parent, readable only on the controller) and writes the files when something is to
# change, and with `start_if_stopped` starts a server that is not running. A lock another run
# holds is left to sglang_lock. With `router` instead (a router host in the servers' play), it
# runs the router's own check, sglang_router_node, in the same task: the router is checked in
# the servers' node check's wave, not in one of its own.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.plugins.action import ActionBase
from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import (
    require_matching_package,
)

require_matching_package()  # before the package's imports, which another release may lack

from sglang_fleet.launch.action import SpecViewAction
from sglang_fleet.launch.render import deployment_files
from sglang_fleet.launch.spec import (
    gate_module_args,
    lock_lease,
    node_module_args,
    start_module_args,
)
from sglang_fleet.node.deploy.lock import controller_run

# A router host's check (the `router` option), and the fact the router role reads it as.
ROUTER_MODULE = "sglang.fleet.sglang_router_node"
ROUTER_FACT = "sglang_router__node"


class ActionModule(SpecViewAction):
    module_name = "sglang.fleet.sglang_node"
    controller_options = ("secret_values", "start_if_stopped", "router")

    def view(self, spec, args):
        view = node_module_args(spec)
        if "secret_values" not in args:
            return view  # the files, lock, write and start come with the task
        files = deployment_files(spec, dict(args["secret_values"] or {}))
        view.update(files=files["checked"], folders=files["folders"],
                    expected_digest=files["digest"])
        if self._play_context.check_mode:
            return view  # check mode only looks
        task_vars = self._task_vars
        view["gate"] = gate_module_args(spec)
        view["lock"] = {
            "path": spec["paths"]["recover_lock"], "name": spec["marker"], "purpose": "deploy",
            "lease": lock_lease(spec, len(task_vars.get("ansible_play_batch") or [1]),
                                task_vars.get("ansible_forks") or 1)}
        view["write"] = {"files": files["files"], "secret_files": files["secret_files"]}
        if args.get("start_if_stopped"):
            group = spec["group"]["name"]
            view["start"] = start_module_args(
                spec, list((task_vars.get("groups") or {}).get(group) or []) if group else [])
        return view

    def run(self, tmp=None, task_vars=None):
        router = self._task.args.get("router")
        if router is None:
            return super().run(tmp, task_vars)
        # The router's check first: a router the servers would join must answer.
        checked = ActionBase.run(self, tmp, task_vars)
        checked.update(self._execute_module(
            module_name=ROUTER_MODULE, task_vars=task_vars,
            module_args={"host_name": (task_vars or {}).get("inventory_hostname"),
                         "router": router}))
        if checked.get("failed"):
            return checked
        # The router's own record of its check (what sglang_router_node's task registers in
        # the router's play): its install step, the servers' membership and the report read it.
        facts = {ROUTER_FACT: {k: v for k, v in checked.items() if k != "invocation"}}
        if self._task.args.get("from_spec") is None:
            return dict(checked, ansible_facts=facts)
        # A host that serves and routes: its server's check, the router's as its fact.
        result = super().run(tmp, task_vars)
        result["ansible_facts"] = facts
        result["changed"] = bool(result.get("changed") or checked.get("changed"))
        return result

    def module_args(self, args):
        if args.get("lock"):
            args["lock"] = dict(args["lock"], run=controller_run())
        return args
