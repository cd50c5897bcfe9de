"""Rules: known-bad configurations as reviewed data, matched against LaunchSpec facts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from sglang_fleet.known.reviewed import data_yaml


@dataclass(frozen=True)
class Rule:
    id: str
    match: dict[str, Any]
    symptom: str
    source: str
    fix_variable: str
    fix_value: Any

    def matches(self, facts: dict[str, Any]) -> bool:
        for key, wanted in self.match.items():
            have = facts.get(key)
            options = wanted if isinstance(wanted, list) else [wanted]
            # Compare as strings so "12.0" (YAML string) and 12.0 (inventory float) agree.
            if str(have).lower() not in {str(o).lower() for o in options}:
                return False
        return True

    def describe(self) -> str:
        return (
            f"rule {self.id}: {self.symptom.strip()} Fix: set {self.fix_variable}="
            f"{self.fix_value!r}. Source: {self.source.strip()}"
        )


def parse_rules(raw: list[dict[str, Any]]) -> list[Rule]:
    rules = []
    for entry in raw:
        rules.append(
            Rule(
                id=entry["id"],
                match=dict(entry["match"]),
                symptom=entry["symptom"],
                source=entry["source"],
                fix_variable=entry["fix"]["variable"],
                fix_value=entry["fix"]["value"],
            )
        )
    ids = [r.id for r in rules]
    if len(ids) != len(set(ids)):
        raise ValueError(f"duplicate rule ids in rules file: {ids}")
    return rules


@cache
def load_rules() -> tuple[Rule, ...]:
    return tuple(parse_rules(data_yaml("rules.yml")))


def matching_rules(facts: dict[str, Any]) -> list[Rule]:
    return [r for r in load_rules() if r.matches(facts)]
