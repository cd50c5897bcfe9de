"""Controller-side recovery decisions: the next LaunchSpec to try, the outcome ledger, the
crash-loop guard, and Rules proposed from repeated failures."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from sglang_fleet.known.rules import matching_rules
from sglang_fleet.launch.envs import env_of_settings
from sglang_fleet.launch.spec import PREFIX, public_settings
from sglang_fleet.node.common import vocab
from sglang_fleet.runs.reasons import counted
from sglang_fleet.settings.server import NOT_CONFIGURATION

# Why a server failed, as far as choosing its next configuration goes.
AFTER_READY = "after_ready"  # it was ready on this configuration and failed later
HARDWARE = "hardware"  # a GPU fault: the hardware's, not the configuration's
ENVIRONMENT = vocab.ENVIRONMENT  # the node's fault (disk, host memory, a reboot)
EXTERNAL = vocab.EXTERNAL  # someone else's signal, a frozen process
START_UP = "start_up"  # it never became ready on this configuration
REPEATED = "repeated"  # it failed on this configuration before, within the window
# Causes that restart the configuration that ran: only a configuration fault changes it.
SAME_CONFIGURATION = (AFTER_READY, HARDWARE, ENVIRONMENT, EXTERNAL)
# A rollback on demand: the configuration running is rejected whatever its verdict.
ROLLBACK = "rollback"
REJECTED = "rejected"  # the ledger's entry for a configuration a rollback took back
# A recovery's recorded cause that was not the configuration's fault.
NOT_THE_CONFIGURATIONS = (HARDWARE, ENVIRONMENT, EXTERNAL)


def recent_recoveries(ledger: list[dict[str, Any]], host: str, window_s: float,
                      now: float | None = None) -> list[dict[str, Any]]:
    """Recoveries the crash-loop guard counts: not those ending a sweep's or bisect's trial."""
    now = time.time() if now is None else now
    return [e for e in ledger if e.get("kind") == "recovery" and e.get("host") == host
            and not e.get("experiment") and now - float(e.get("at", 0)) <= window_s]


def last_ready(ledger: list[dict[str, Any]], host: str,
               skip: set[str] | frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The host's last ready (re)start: its config hash is the LaunchSpec running there.
    `skip`: config hashes passed over (rejected ones, the one rolled back from)."""
    for entry in reversed(ledger):
        if entry.get("host") == host and entry.get("kind") == "ready" and \
                entry.get("config_hash") not in skip:
            return entry
    return None


def rejected(ledger: list[dict[str, Any]], host: str) -> dict[str, dict[str, Any]]:
    """The host's configurations a rollback rejected, by config hash: each until a later
    ready start of the same configuration (a deploy that chose it again on purpose)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in ledger:
        if entry.get("host") != host or not entry.get("config_hash"):
            continue
        if entry.get("kind") == REJECTED:
            out[entry["config_hash"]] = entry
        elif entry.get("kind") == "ready":
            out.pop(entry["config_hash"], None)
    return out


def _is_rejected(settings: dict[str, Any], refused: dict[str, dict[str, Any]]) -> str | None:
    """The hash of a rejected configuration these settings would deploy again, or None."""
    for config_hash, entry in refused.items():
        if entry.get("settings") is not None and not differing(settings, entry["settings"]):
            return config_hash
    return None


def choose_rollback(settings: dict[str, Any], ledger: list[dict[str, Any]], host: str,
                    running: dict[str, Any] | None = None) -> dict[str, Any]:
    """A rollback on demand: back to the last configuration that was ready on the host
    before the one running, passing over rejected ones. The one running is rejected by it."""
    run_hash = (running or {}).get("config_hash")
    skip = set(rejected(ledger, host)) | ({run_hash} if run_hash else set())
    good = last_ready(ledger, host, skip)
    base = {"failed_config": run_hash, "cause": ROLLBACK, "why": "a rollback on demand"}
    if not good or good.get("settings") is None:
        return {**base, "overrides": {}, "source": "none",
                "reason": f"no configuration other than {run_hash} was ready on {host} (and "
                          "not rejected): nothing to roll back to"}
    run_settings = (running or {}).get("settings")
    changed = differing(run_settings, good["settings"]) if run_settings is not None else []
    detail = (f"; {', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'}"
              if changed else "")
    return {**base, "overrides": overrides_to_reach(good["settings"], settings),
            "source": ROLLBACK, "config_hash": good.get("config_hash"),
            "reason": f"roll back from {run_hash} to {good.get('config_hash')}, the last "
                      f"configuration ready before it{detail}"}


def previous_roots(ledger: list[dict[str, Any]], host: str, root: str,
                   limit: int = 5) -> list[str]:
    """The roots the host's servers ran from before, newest first, other than `root`: a
    deploy that moved the root checks each for a server of the host still running there."""
    found: list[str] = []
    for entry in reversed(ledger):
        if entry.get("host") != host or entry.get("kind") != "ready":
            continue
        old = (entry.get("settings") or {}).get(PREFIX + "root")
        if isinstance(old, str) and old.rstrip("/") != root.rstrip("/") and old not in found:
            found.append(old)
            if len(found) >= limit:
                break
    return found


def kept_envs(ledger: list[dict[str, Any]], host: str, current_hash: str,
              defaults: dict[str, Any]) -> list[str]:
    """The pip release environments a prune must keep besides the serving one: those of the
    host's previous ready configuration and of its last known good (ready, not rejected)."""
    skip = {current_hash}
    entries = (last_ready(ledger, host, skip), last_ready(ledger, host, skip | set(rejected(
        ledger, host))))
    ids = [env_of_settings(e["settings"], defaults) for e in entries
           if e and e.get("settings") is not None]
    return sorted({i for i in ids if i})


def effective_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings with their sglang_server_overrides applied, as the LaunchSpec sees them."""
    out = dict(settings)
    out.update(settings.get(PREFIX + "overrides") or {})
    return out


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Configuration variables whose values differ between two sets of settings."""
    a, b = public_settings(effective_settings(a)), public_settings(effective_settings(b))
    return sorted(k for k in set(a) | set(b)
                  if k not in NOT_CONFIGURATION and a.get(k) != b.get(k))


def overrides_to_reach(target: dict[str, Any], start: dict[str, Any]) -> dict[str, Any]:
    """The overrides that turn `start` into `target`, variable by variable (a variable that
    `target` does not record keeps its value: its default then applies to both)."""
    start_eff = effective_settings(start)
    target = effective_settings(target)
    return {k: target[k] for k in differing(target, start) if k in target
            and start_eff.get(k) != target[k]}


def failure_cause(verdict: dict[str, Any], config_hash: str | None,
                  ledger: list[dict[str, Any]], host: str, window_s: float,
                  now: float | None = None) -> tuple[str, str]:
    """(cause, why): a configuration fault (START_UP, REPEATED) or a fault of the running
    server (AFTER_READY, HARDWARE), judged from the verdict's phase and the ledger."""
    name, phase = verdict.get("verdict"), verdict.get("phase")
    cause = verdict.get("cause")
    if cause in (ENVIRONMENT, EXTERNAL):
        # The node's fault or someone else's signal: the same configuration comes back,
        # however often (the crash-loop guard bounds the tries).
        detail = (verdict.get("failure") or {}).get("said") or verdict.get("reason") or name
        whose = ("it is the node's fault, not the configuration's" if cause == ENVIRONMENT
                 else "it came from outside SGLang (a signal, a stopped process), not from the "
                      "configuration")
        return cause, f"{whose} ({name} in {phase}: {detail})"
    # Only the configuration's own failures count against it: an earlier fault of the node,
    # from outside or of the GPU says nothing about the configuration (the crash-loop guard
    # still counts every recovery).
    before = [e for e in recent_recoveries(ledger, host, window_s, now)
              if config_hash and e.get("config_hash") == config_hash
              and e.get("cause") not in NOT_THE_CONFIGURATIONS]
    if before:
        return REPEATED, (f"{config_hash} failed before within {window_s:.0f} s "
                          f"({len(before) + 1} failures, the last {name} in {phase}), so the "
                          f"configuration is suspect")
    if name == "gpu_fault":
        return HARDWARE, ("a GPU fault is the hardware's, not the configuration's, and this "
                          "is its first failure")
    if phase == "serving":
        return AFTER_READY, (f"it was ready on {config_hash} and failed later ({name} while "
                             f"serving), its first failure")
    return START_UP, (f"it failed while starting ({name} in {phase}), so the configuration "
                      f"is suspect")


def choose_next(settings: dict[str, Any], spec_facts: dict[str, Any],
                ledger: list[dict[str, Any]], host: str,
                fallback_chain: list[dict[str, Any]],
                verdict: dict[str, Any] | None = None,
                running: dict[str, Any] | None = None,
                window_s: float = 3600.0, now: float | None = None) -> dict[str, Any]:
    """The next configuration for a failed server.

    `settings` and `spec_facts` are what the recovery redeploys from (the inventory and this
    run's extra variables); `running` is what ran and failed, as the node recorded it
    ({config_hash, settings, facts}; either may be missing). A first failure of a server
    that was ready on its configuration (or a GPU fault) restarts that same configuration.
    A fault of the node or from outside (the verdict's `cause`: environment, external)
    restarts the same configuration too, even when it repeats or a Rule matches.
    A start-up failure or a repeated one goes down the chain: revert to the host's last known
    good when what ran differs from it, else the matching Rule's fix, else the next untried
    fallback. The choice carries its path (`source`), its `reason` and `why` it was taken.
    """
    # Without a record of what ran, what ran is taken to be what the recovery deploys from.
    running = running or {"settings": settings, "facts": spec_facts}
    run_hash = running.get("config_hash")
    run_settings = running.get("settings")
    run_facts = running.get("facts") or spec_facts
    cause, why = failure_cause(verdict or {}, run_hash, ledger, host, window_s, now)
    base = {"failed_config": run_hash, "cause": cause, "why": why}
    effective = effective_settings(settings)

    refused = rejected(ledger, host)
    if cause in SAME_CONFIGURATION and run_hash not in refused:
        overrides = overrides_to_reach(run_settings, settings) if run_settings else {}
        return {**base, "overrides": overrides, "source": "restart", "config_hash": run_hash,
                "reason": f"restart on the same configuration {run_hash}"}

    good = last_ready(ledger, host, set(refused))
    back = _is_rejected(settings, refused)
    if back and good and good.get("settings") is not None:
        # The inventory still names what a rollback took back: a rule or a fallback on top
        # of it would bring its release and settings back.
        return {**base, "overrides": overrides_to_reach(good["settings"], settings),
                "source": "last_known_good", "config_hash": good.get("config_hash"),
                "reason": f"revert to the last known good {good.get('config_hash')}: the "
                          f"inventory's configuration {back} was rejected by a rollback"}
    if good and good.get("settings") is not None:
        good_hash = good.get("config_hash")
        if run_settings is not None:
            changed = differing(run_settings, good["settings"])
            differs = bool(changed)
        else:  # only the hash of what ran is known
            changed = []
            differs = bool(good_hash and run_hash and run_hash != good_hash)
        if differs:
            detail = (f"{counted(len(changed), 'variable')} "
                      f"{'differs' if len(changed) == 1 else 'differ'}: {', '.join(changed)}"
                      if changed
                      else "its settings were not recorded on the node")
            reason = (f"revert to the last known good {good_hash or '(unnamed)'}: the "
                      f"configuration that failed, {run_hash}, differs from it ({detail})")
            rules = [r.id for r in matching_rules(run_facts)]
            if rules:
                reason += f"; it also matches rule {', '.join(rules)}"
            return {**base, "overrides": overrides_to_reach(good["settings"], settings),
                    "source": "last_known_good", "config_hash": good_hash, "reason": reason}

    for rule in matching_rules(run_facts):
        if effective.get(rule.fix_variable) != rule.fix_value:
            allowed = [r for r in effective.get(PREFIX + "allow_rules") or [] if r != rule.id]
            return {**base, "overrides": {rule.fix_variable: rule.fix_value,
                                          PREFIX + "allow_rules": allowed},
                    "reason": f"the fix of rule {rule.id}: set "
                              f"{rule.fix_variable}={rule.fix_value!r}",
                    "source": "rule", "rule": rule.id}
    tried = settings.get(PREFIX + "overrides") or {}
    for step in fallback_chain or []:
        if any(tried.get(k) != v for k, v in step.items()):
            return {**base, "overrides": dict(step),
                    "reason": "the next untried fallback: set " + ", ".join(
                        f"{k}={v!r}" for k, v in step.items()),
                    "source": "fallback"}
    return {**base, "overrides": {}, "source": "none",
            "reason": "no rule, no last known good to revert to and no untried fallback left"}


def proposed_rules(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A configuration that failed the same way twice, with no Rule covering it, proposed as a
    new Rule (for review: it is printed and written beside the ledger, never applied)."""
    counts: Counter[str] = Counter()
    examples: dict[str, dict[str, Any]] = {}
    for e in ledger:
        if e.get("kind") != "recovery" or not e.get("facts"):
            continue
        if e.get("cause") in NOT_THE_CONFIGURATIONS:
            continue  # the node's fault, not the configuration's: no Rule to learn
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
