"""Controller side of the modules that act on a LaunchSpec's server or a RouterSpec's router:
the task gives the LaunchSpec (or a deployment's identity, or the RouterSpec) as `from_spec`,
and its view for the module (sglang_fleet.launch.views, sglang_fleet.router.views) becomes the
module's options here, so that no playbook maps its fields by hand. Options given beside it
win; without it the module takes its options as given."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from sglang_fleet.launch.views import schema_problem


class SpecViewAction(ActionBase):
    """Runs module `module_name` with `view(from_spec, other options)` under the options."""

    TRANSFERS_FILES = False
    module_name = ""
    # What `from_spec` is, for the refusals (a router's modules take its RouterSpec).
    spec_kind = "LaunchSpec"
    # Options the view consumes on the controller; never sent to the node.
    controller_options: tuple[str, ...] = ()

    def view(self, spec: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def module_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """The options as sent to the node (a subclass adds what only the controller knows)."""
        return args

    def spec_args(self, task_vars: dict[str, Any] | None) -> dict[str, Any]:
        """The task's options with its `from_spec` view under them."""
        self._task_vars = task_vars or {}  # for a view that reads the play (its batch, groups)
        args = dict(self._task.args)
        spec = args.pop("from_spec", None)
        taken = {name: args.pop(name) for name in self.controller_options if name in args}
        if spec is None:
            return args
        problem = schema_problem(spec, self.spec_kind)
        if problem:
            raise AnsibleActionFail(f"{self.module_name}: from_spec {problem}")
        try:
            return {**self.view(spec, {**args, **taken}), **args}
        except (KeyError, TypeError, ValueError) as exc:
            raise AnsibleActionFail(f"{self.module_name}: from_spec is not a {self.spec_kind} "
                                    f"of this release of sglang-fleet (missing {exc})"
                                    ) from exc

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self.spec_args(task_vars)
        result.update(self._execute_module(module_name=self.module_name,
                                           module_args=self.module_args(args),
                                           task_vars=task_vars))
        return result

    def play_size(self) -> tuple[int, int]:
        """The hosts of this play's batch and its forks: a lock's lease covers their waves."""
        task_vars = self._task_vars
        return (len(task_vars.get("ansible_play_batch") or [1]),
                task_vars.get("ansible_forks") or 1)
