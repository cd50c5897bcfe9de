"""How a settings table becomes its role's defaults/main.yml and meta/argument_specs.yml: the
sglang_server role's (sglang_fleet.settings.server) and the sglang_router role's
(sglang_fleet.settings.router), each rewritten by `python -m MODULE --write`."""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sglang_fleet.settings.kinds import Setting

_ANSIBLE_TYPES = {"str": "str", "int": "int", "float": "float", "bool": "bool",
                  "list": "list", "dict": "dict", "path": "path"}


class _IndentedDumper(yaml.SafeDumper):
    """Lists indented under their key, as the rest of the repository's YAML."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def _yaml_value(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _wrap(text: str, width: int = 96) -> list[str]:
    return textwrap.wrap(text, width) or [""]


@dataclass(frozen=True)
class RoleFiles:
    """One role's generated files, from its settings table."""

    table: Iterable[Setting]
    section_notes: dict[str, str]
    role_dir: Path
    module: str  # the module whose table it is (`python -m sglang_fleet.settings --write`)
    intro: tuple[str, ...]  # comment lines heading defaults/main.yml
    short_description: str
    description: tuple[str, ...]
    # Task files other roles and the playbooks enter (include_role tasks_from), with the
    # inputs they take: validated by Ansible at each such include.
    entry_points: tuple[tuple[str, dict[str, Any]], ...] = ()

    @property
    def note(self) -> str:
        return (f"Generated from src/{self.module.replace('.', '/')}.py by\n# "
                f"`python -m sglang_fleet.settings --write`: edit the table there.")

    def defaults_yaml(self) -> str:
        lines = ["---", f"# {self.note}", *(f"# {line}" for line in self.intro)]
        section = None
        for s in self.table:
            if s.section != section:
                section = s.section
                lines += ["", *(f"# {part}" for part in _wrap(self.section_notes[section]))]
            lines += [f"# {part}" for part in _wrap(s.doc)]
            lines.append(f"{s.variable}: {_yaml_value(s.default)}")
        return "\n".join(lines) + "\n"

    def argument_specs(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        for s in self.table:
            option: dict[str, Any] = {"type": _ANSIBLE_TYPES[s.kind], "description": s.doc,
                                      "default": s.default}
            if s.choices:
                # A nullable setting may be given as null (recovery passes every setting).
                option["choices"] = list(s.choices) + ([None] if s.nullable else [])
            if s.elements:
                option["elements"] = s.elements
            if s.secret:
                option["no_log"] = True
            options[s.variable] = option
        return {"argument_specs": {"main": {
            "short_description": self.short_description,
            "description": list(self.description),
            "options": options}, **dict(self.entry_points)}}

    def argument_specs_yaml(self) -> str:
        body = yaml.dump(self.argument_specs(), Dumper=_IndentedDumper, sort_keys=False,
                         width=100, allow_unicode=True)
        return f"---\n# {self.note}\n{body}"

    def generated_files(self) -> dict[Path, str]:
        return {self.role_dir / "defaults" / "main.yml": self.defaults_yaml(),
                self.role_dir / "meta" / "argument_specs.yml": self.argument_specs_yaml()}

    def main(self, argv: list[str] | None = None) -> int:
        parser = argparse.ArgumentParser(
            prog=f"python -m {self.module}",
            description=f"Write the {self.role_dir.name} role's defaults and argument specs "
                        f"from the settings table.")
        parser.add_argument("--write", action="store_true",
                            help="write the files (else: check)")
        args = parser.parse_args(argv)
        files = self.generated_files()
        if args.write:
            for path, text in files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"wrote {path}")
            return 0
        stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
        for path in stale:
            print(f"out of date: {path} (run python -m sglang_fleet.settings --write)",
                  file=sys.stderr)
        return 1 if stale else 0
