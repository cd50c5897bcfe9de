"""The collector of one host's refusals and warnings, and the bounded description of a value
that every refusal shows. Its own module, below every settings table and spec builder, so that
each of them can take it without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_PREVIEW_NODES = 64  # a value is summarised by walking at most this many of its parts


def describe_value(value: Any) -> str:
    """A short, bounded description of any value: never renders a huge or self-referencing
    value whole (a YAML alias bomb expands exponentially when printed)."""
    if isinstance(value, str):
        if len(value) > 120:
            return f"{value[:60]!r}... ({len(value)} characters)"
        return repr(value)
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, list | tuple | dict):
        budget = [_PREVIEW_NODES]
        shown = _preview(value, budget)
        kind = "mapping" if isinstance(value, dict) else "list"
        if budget[0] <= 0 or len(shown) > 120:
            return f"<a {kind} of {len(value)} top-level items>"
        return shown
    return f"<{type(value).__name__}>"


def _preview(value: Any, budget: list[int]) -> str:
    budget[0] -= 1
    if budget[0] <= 0:
        return "..."
    if isinstance(value, dict):
        parts = []
        for key, item in value.items():
            if budget[0] <= 0:
                break
            parts.append(f"{key!r}: {_preview(item, budget)}")
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, list | tuple):
        parts = []
        for item in value:
            if budget[0] <= 0:
                break
            parts.append(_preview(item, budget))
        return "[" + ", ".join(parts) + "]"
    return describe_value(value)


@dataclass(frozen=True)
class SpecError:
    host: str
    variable: str
    value: str  # already described (describe_value), never the raw value
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"host {self.host}: {self.variable}={self.value}: {self.problem}. Fix: {self.fix}"


class Problems:
    """Every error and warning of one host, so an operator fixes an inventory in one pass.
    A variable named without `prefix` (a setting's short name) gets it; "" leaves names as
    given."""

    def __init__(self, host: str, prefix: str):
        self.host = host
        self.prefix = prefix
        self.errors: list[SpecError] = []
        self.warnings: list[str] = []

    def error(self, variable: str, value: Any, problem: str, fix: str,
              described: str | None = None) -> None:
        name = variable if (not self.prefix or variable.startswith(self.prefix)
                            or variable.isupper()) else self.prefix + variable
        self.errors.append(SpecError(self.host, name, described or describe_value(value),
                                     problem, fix))

    def warn(self, text: str) -> None:
        self.warnings.append(f"host {self.host}: {text}")
