"""Controller-side recovery decisions: the next LaunchSpec to try, the outcome ledger, the
crash-loop guard, and Rules proposed from repeated failures."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from sglang_fleet.rules import matching_rules
from sglang_fleet.spec import PREFIX, public_settings

# Settings that describe where and how, not what runs: never "reverted" by recovery.
NOT_CONFIGURATION = (PREFIX + "overrides", PREFIX + "allow_rules", PREFIX + "sim_fault",
                     PREFIX + "sim_time_factor", PREFIX + "root", PREFIX + "python",
                     PREFIX + "port", PREFIX + "host", PREFIX + "deployment_name")


def recent_recoveries(ledger: list[dict[str, Any]], host: str, window_s: float,
                      now: float | None = None) -> list[dict[str, Any]]:
    """Recoveries the crash-loop guard counts: not those ending a sweep's or bisect's trial."""
    now = time.time() if now is None else now
    return [e for e in ledger if e.get("kind") == "recovery" and e.get("host") == host
            and not e.get("experiment") and now - float(e.get("at", 0)) <= window_s]


def last_ready(ledger: list[dict[str, Any]], host: str) -> dict[str, Any] | None:
    """The host's last ready (re)start: its config hash is the LaunchSpec running there."""
    for entry in reversed(ledger):
        if entry.get("host") == host and entry.get("kind") == "ready":
            return entry
    return None


def last_known_good(ledger: list[dict[str, Any]], host: str) -> dict[str, Any] | None:
    entry = last_ready(ledger, host)
    return entry.get("settings") if entry else None


def choose_next(settings: dict[str, Any], spec_facts: dict[str, Any],
                ledger: list[dict[str, Any]], host: str,
                fallback_chain: list[dict[str, Any]]) -> dict[str, Any]:
    """The next configuration: the matching Rule's fix, else the one variable that differs
    from the host's last known good spec reverted, else the next untried fallback."""
    effective = dict(settings)
    effective.update(settings.get(PREFIX + "overrides") or {})
    tried = settings.get(PREFIX + "overrides") or {}
    for rule in matching_rules(spec_facts):
        if effective.get(rule.fix_variable) != rule.fix_value:
            allowed = [r for r in effective.get(PREFIX + "allow_rules") or [] if r != rule.id]
            return {"overrides": {rule.fix_variable: rule.fix_value,
                                  PREFIX + "allow_rules": allowed},
                    "reason": f"rule {rule.id}: set {rule.fix_variable}={rule.fix_value!r}",
                    "source": "rule", "rule": rule.id}
    good = last_known_good(ledger, host)
    if good:
        current = public_settings(effective)
        differing = sorted(k for k in set(current) | set(good)
                           if k not in NOT_CONFIGURATION and current.get(k) != good.get(k))
        if differing:
            name = differing[0]
            return {"overrides": {name: good.get(name)},
                    "reason": f"revert {name} to the last known good value {good.get(name)!r} "
                              f"(was {current.get(name)!r}; {len(differing)} variable(s) differ)",
                    "source": "last_known_good"}
    for step in fallback_chain or []:
        if any(tried.get(k) != v for k, v in step.items()):
            return {"overrides": dict(step),
                    "reason": "fallback: " + ", ".join(f"{k}={v!r}" for k, v in step.items()),
                    "source": "fallback"}
    return {"overrides": {}, "reason": "no rule, no last known good difference and no untried "
                                       "fallback left", "source": "none"}


def proposed_rules(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A configuration that failed the same way twice, with no Rule covering it, proposed as a
    new Rule (for review: it is printed and written beside the ledger, never applied)."""
    counts: Counter[str] = Counter()
    examples: dict[str, dict[str, Any]] = {}
    for e in ledger:
        if e.get("kind") != "recovery" or not e.get("facts"):
            continue
        key = json.dumps([e["facts"], e.get("verdict"), e.get("phase")], sort_keys=True)
        counts[key] += 1
        examples[key] = e
    out = []
    for key, n in counts.items():
        e = examples[key]
        facts = {k: v for k, v in e["facts"].items() if v is not None}
        if n < 2 or matching_rules(facts):
            continue
        hosts = sorted({x["host"] for x in ledger if x.get("config_hash") == e["config_hash"]})
        # What made the same configuration come back ready, if recovery ever did.
        fixed = next((x for x in ledger if x.get("kind") == "recovery_outcome"
                      and x.get("config_hash_failed") == e["config_hash"]
                      and x.get("verdict") == "ready"), None)
        applied = {k: v for k, v in ((fixed or {}).get("applied") or {}).items()
                   if k != PREFIX + "allow_rules"}
        variable, value = next(iter(applied.items()), ("?", "?"))
        out.append({
            "id": f"proposed-{e['config_hash']}-{e.get('verdict')}-{e.get('phase')}",
            "match": facts,
            "symptom": f"{e.get('verdict')} in {e.get('phase')} {n} times: {e.get('reason')}",
            "source": f"sglang-fleet ledger, hosts {', '.join(hosts)}",
            "fix": {"variable": variable, "value": value},
        })
    return out
