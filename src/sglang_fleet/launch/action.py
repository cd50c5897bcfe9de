"""Controller side of the modules that act on a LaunchSpec's server: the task gives the
LaunchSpec (or a deployment's identity) as `from_spec`, and its view for the module becomes the
module's options here, so that no playbook maps its fields by hand. Options given beside it
win; without it the module takes its options as given."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class SpecViewAction(ActionBase):
    """Runs module `module_name` with `view(from_spec, other options)` under the options."""

    TRANSFERS_FILES = False
    module_name = ""
    # Options the view consumes on the controller; never sent to the node.
    controller_options: tuple[str, ...] = ()

    def view(self, spec: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def module_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """The options as sent to the node (a subclass adds what only the controller knows)."""
        return args

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        self._task_vars = task_vars or {}  # for a view that reads the play (its batch, groups)
        args = dict(self._task.args)
        spec = args.pop("from_spec", None)
        taken = {name: args.pop(name) for name in self.controller_options if name in args}
        if spec is not None:
            if not isinstance(spec, dict):
                raise AnsibleActionFail(f"{self.module_name}: from_spec must be a LaunchSpec "
                                        f"(a mapping), got {type(spec).__name__}")
            try:
                args = {**self.view(spec, {**args, **taken}), **args}
            except (KeyError, TypeError, ValueError) as exc:
                raise AnsibleActionFail(f"{self.module_name}: from_spec is not a LaunchSpec "
                                        f"of this release of sglang-fleet (missing {exc})"
                                        ) from exc
        result.update(self._execute_module(module_name=self.module_name,
                                           module_args=self.module_args(args),
                                           task_vars=task_vars))
        return result
