"""What a role setting is and how an inventory value becomes one: the `Setting` row both settings
tables are made of (sglang_fleet.settings.server for the server role,
sglang_fleet.settings.router for the router role), the table that knows its prefix, one
coercion per kind, and the check that an inventory variable under a role's prefix is one of its
settings.

Every refusal names the variable, the value (never a secret's) and the fix. How one setting
differs from another of its kind is a column of its row, never a check of its name, so adding a
setting is adding a row.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sglang_fleet.node.common.secrets import is_secret_name

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sglang_fleet.settings.problems import Problems


@dataclass(frozen=True)
class Setting:
    """One inventory variable: `prefix` + `name`.

    kind: str | int | float | bool | list | dict | path. low/high bound a number (open_range:
      both ends excluded); max_length bounds a string; elements: the type of a list's items.
    flag: the option this setting renders and owns (checked against every shipped catalogue);
      owns: further options it decides. extra_args may not set an owned option, whatever alias
      spells it. render says how: "value" (`--flag value` unless the value is None or `omit`),
      "switch" (`--flag` when true), "secret" (`--flag "$ENV"`, the value kept in the 0600 env
      file under `env`), "custom" (the role's spec module renders it), None (not an option).
    secret, env: a secret's value never leaves the env file, where it is stored under `env` (a
      name ending in `*`: one variable per item, numbered); everything else that names secrets
      (masking, input checks) derives from these.
    choices: fixed choices; catalogue_choices: take the choices of `flag` from the pinned
      release's catalogue.
    fact: the Rule fact it feeds.
    number_as_text: a text that operators write as a number too (12.0 for "12.0").
    configuration: False for a setting that says where a server runs, how it is reached or how
      it is watched, not what runs: recovery never changes it, and it never makes two
      configurations differ.
    example: a value shown in the fix of a refusal when the default is no example.
    """

    name: str
    kind: str
    default: Any
    doc: str
    section: str
    low: float | None = None
    high: float | None = None
    open_range: bool = False
    choices: tuple[Any, ...] | None = None
    catalogue_choices: bool = False
    flag: str | None = None
    owns: tuple[str, ...] = ()
    render: str | None = None
    omit: Any = None
    fact: str | None = None
    nullable: bool = False
    secret: bool = False
    env: str | None = None
    max_length: int = 4096
    elements: str | None = None
    number_as_text: bool = False
    configuration: bool = True
    example: str | None = None
    prefix: str = field(default="", kw_only=True)

    @property
    def variable(self) -> str:
        return self.prefix + self.name

    @property
    def owned_flags(self) -> tuple[str, ...]:
        return ((self.flag,) if self.flag else ()) + self.owns


@dataclass(frozen=True)
class SettingsTable:
    """One role's settings, in the order its files list them, and what derives from them."""

    prefix: str
    rows: tuple[Setting, ...]

    def __post_init__(self) -> None:
        wrong = [s.name for s in self.rows if s.prefix != self.prefix]
        if wrong:
            raise ValueError(f"settings {wrong} do not have the table's prefix {self.prefix}")

    def __iter__(self) -> Iterator[Setting]:
        return iter(self.rows)

    def with_rows(self, *rows: Setting) -> SettingsTable:
        """This table and more rows: what adding a setting is."""
        return SettingsTable(self.prefix, self.rows + rows)

    @property
    def role(self) -> str:
        return self.prefix.removesuffix("_")

    @cached_property
    def by_name(self) -> dict[str, Setting]:
        return {s.name: s for s in self.rows}

    @cached_property
    def by_variable(self) -> dict[str, Setting]:
        return {s.variable: s for s in self.rows}

    @cached_property
    def secret_variables(self) -> tuple[str, ...]:
        return tuple(s.variable for s in self.rows if s.secret)

    @cached_property
    def secret_env(self) -> dict[str, str]:
        """The env file variable of each secret setting (`NAME_*`: one per item)."""
        return {s.variable: s.env for s in self.rows if s.secret and s.env}

    def defaults(self) -> dict[str, Any]:
        return {s.variable: s.default for s in self.rows}


# ---- coercion --------------------------------------------------------------------------------

_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True,
               "false": False, "no": False, "off": False, "0": False}
# An HTTP bearer token (RFC 6750 token68): what SGLang and its router compare the
# Authorization header with.
TOKEN68 = re.compile(r"^[A-Za-z0-9._~+/=-]+$")
# `-e name=8` arrives as a string: accept what Ansible's own type checks accept, bounded.
_INTEGER_TEXT = re.compile(r"[+-]?\d{1,12}")


@dataclass(frozen=True)
class _Refused:
    problem: str
    fix: str


def coerce(setting: Setting, raw: Any, problems: Problems) -> Any:
    """The value in its setting's type, or None after reporting the problem (a secret's value
    is never shown in it)."""
    if raw is None or (raw == "" and (setting.nullable or setting.secret)):
        return _unset(setting, raw, problems)
    value = _COERCERS[setting.kind](setting, raw)
    if isinstance(value, _Refused):
        problems.error(setting.variable, None if setting.secret else raw, value.problem,
                       value.fix, described="<secret>" if setting.secret else None)
        return None
    return value


def _unset(setting: Setting, raw: Any, problems: Problems) -> Any:
    """A setting left unset: empty where it may be, else refused."""
    if setting.kind in ("list", "dict"):
        return [] if setting.kind == "list" else {}
    if setting.nullable:
        return None
    if setting.secret or setting.default == "":
        return ""
    problems.error(setting.variable, raw, "is required",
                   f"set {setting.variable}, e.g. {setting.default!r}")
    return None


def _number(value: float | None) -> str:
    # 1000000, not :g's 1e+06; 0.05 as written.
    return str(int(value)) if float(value or 0).is_integer() else f"{value:g}"


def _bounds(setting: Setting) -> str:
    low, high = _number(setting.low), _number(setting.high)
    return f"between {low} and {high}" if setting.open_range else f"in {low}..{high}"


def _example(setting: Setting) -> str:
    shown = setting.example if setting.example is not None else (
        None if setting.default in (None, "", [], {}) else str(setting.default))
    text = f", e.g. {shown}" if shown is not None else ""
    return text + ("; or null for the default" if setting.nullable else "")


def _as_bool(setting: Setting, raw: Any) -> Any:
    if isinstance(raw, str) and raw.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[raw.lower()]
    if not isinstance(raw, bool):
        return _Refused("must be a boolean", "set true or false (unquoted)")
    return raw


def _as_number(setting: Setting, raw: Any) -> Any:
    integer = setting.kind == "int"
    value = raw
    if isinstance(value, str) and integer and _INTEGER_TEXT.fullmatch(value.strip()):
        value = int(value)
    elif isinstance(value, str) and not integer:
        with contextlib.suppress(ValueError):
            value = float(value)
    wanted = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        return _Refused(f"must be {wanted}", f"set {wanted} {_bounds(setting)}"
                        + _example(setting))
    low, high = setting.low, setting.high
    inside = low < value < high if setting.open_range else low <= value <= high
    if not inside:
        problem = (f"must be {_bounds(setting)}, both excluded" if setting.open_range
                   else f"is out of range {_number(setting.low)}..{_number(setting.high)}")
        return _Refused(problem, f"set a value {_bounds(setting)}" + _example(setting))
    return value if integer else float(value)


def _as_str(setting: Setting, raw: Any) -> Any:
    if setting.number_as_text and isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = str(raw)
    if raw == "" and setting.default not in ("", None) and not setting.secret:
        return _Refused("is required", f"set {setting.variable}, e.g. {setting.default!r}")
    if not isinstance(raw, str):
        return _Refused(f"must be a string, got {type(raw).__name__}", "quote the value")
    if len(raw) > setting.max_length:
        return _Refused(f"is {len(raw)} characters long, the limit is {setting.max_length}",
                        "shorten it")
    if "\n" in raw or "\x00" in raw or "\r" in raw:
        return _Refused("contains a newline or NUL byte", "remove control characters")
    if setting.kind == "path" and not raw.startswith("/"):
        return _Refused("must be an absolute path", f"e.g. {setting.default}")
    if setting.choices and raw not in setting.choices:
        close = difflib.get_close_matches(raw, [str(c) for c in setting.choices], n=1)
        return _Refused("is not a valid choice", (f"did you mean {close[0]!r}? " if close
                                                  else "") + f"use one of: "
                        f"{', '.join(str(c) for c in setting.choices)}")
    return raw


def _as_list(setting: Setting, raw: Any) -> Any:
    strings = setting.elements == "str"
    if not isinstance(raw, list) or (strings and not all(isinstance(a, str) for a in raw)):
        example = setting.example or ('["--log-level", "info"]' if strings else "[...]")
        return _Refused("must be a list" + (" of strings" if strings else ""),
                        ("quote every item, e.g. " if strings else "e.g. ") + example)
    return list(raw)


def _as_dict(setting: Setting, raw: Any) -> Any:
    if not isinstance(raw, dict):
        return _Refused("must be a mapping", f"e.g. {setting.example or '{NAME: value}'}")
    return dict(raw)


_COERCERS = {"bool": _as_bool, "int": _as_number, "float": _as_number, "str": _as_str,
             "path": _as_str, "list": _as_list, "dict": _as_dict}


# ---- variables that are no setting -------------------------------------------------------------

def unknown_variables(given: dict[str, Any], table: SettingsTable, problems: Problems,
                      where: str = "", outputs: tuple[str, ...] = ()) -> None:
    """A variable under the table's prefix that is none of its settings is a typo, never
    ignored: refused with the closest setting's name. Its value is hidden when the name, or
    the setting it is closest to, holds a secret. `outputs` are facts the role publishes under
    its prefix; names under prefix + "_" are the role's own internals."""
    known = list(table.by_variable)
    for name in sorted(given):
        if not name.startswith(table.prefix) or name in table.by_variable or name in outputs \
                or name.startswith(table.prefix + "_"):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        fix = (f"did you mean {close[0]}?" if close else
               f"remove it; `ansible-doc -t role sglang.fleet.{table.role}` lists the settings")
        hidden = is_secret_name(name) or "key" in name.lower() or bool(
            close and table.by_variable[close[0]].secret)
        problems.error(name, None if hidden else given[name],
                       f"is not a setting of the {table.role} role{where}", fix,
                       described="<hidden>" if hidden else None)
