"""A canary's plan from the inventory: its window, the traffic it needs, the greedy probe set
and each signal's threshold. Every refusal names the variable, the value and the fix, and a
threshold that could never fail is refused (a canary that cannot fail is not a canary)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PREFIX = "sglang_bench_canary_"
MAX_PROBES = 64
# The greedy probe prompts sent to canary and baseline alike when the inventory gives none.
DEFAULT_PROBES = (
    "The capital of France is",
    "Write the numbers from one to ten:",
    "def fibonacci(n):",
    "Translate to German: good morning",
    "List three primary colours.",
    "Q: What is 17 times 3?\nA:",
    "Complete the sentence: The quick brown fox",
    "Summarise in one word: rain, clouds, umbrella",
)


@dataclass(frozen=True)
class Thresholds:
    max_error_increase: float = 0.02  # canary's share of failed requests minus the baseline's
    max_abort_increase: float = 0.02  # the same for aborted requests
    max_ttft_p99_ratio: float = 1.15  # canary's p99 time to first token over the baseline's
    max_itl_p99_ratio: float = 1.15  # the same for inter-token latency
    min_tokens_ratio: float = 0.9  # canary's generation tokens per second over the baseline's
    max_output_mismatch: float = 0.0  # share of probe prompts whose greedy output differs
    # Releases differ: a differing token counts as equivalent where the baseline ranks it at
    # most this many nats below its own choice (a near tie a new release's kernels may flip).
    max_logprob_gap: float = 1.0


@dataclass(frozen=True)
class CanaryPlan:
    window: float = 300.0  # seconds of live traffic the canary is judged over
    min_requests: int = 20  # live requests each side needs for a conclusive judgement
    probes: tuple[str, ...] = DEFAULT_PROBES
    probe_tokens: int = 16
    thresholds: Thresholds = Thresholds()


# variable suffix -> (field, kind, lowest allowed, highest allowed, why the bound)
_LIMITS: dict[str, tuple[str, str, float, float, str]] = {
    "max_error_increase": ("max_error_increase", "share", 0.0, 1.0,
                           "a share from 0 to below 1 (1 or more could never fail)"),
    "max_abort_increase": ("max_abort_increase", "share", 0.0, 1.0,
                           "a share from 0 to below 1 (1 or more could never fail)"),
    "max_ttft_p99_ratio": ("max_ttft_p99_ratio", "ratio", 1.0, math.inf,
                           "a finite ratio above 1, e.g. 1.15 (1 or less fails an identical "
                           "canary; infinity could never fail)"),
    "max_itl_p99_ratio": ("max_itl_p99_ratio", "ratio", 1.0, math.inf,
                          "a finite ratio above 1, e.g. 1.15 (1 or less fails an identical "
                          "canary; infinity could never fail)"),
    "min_tokens_ratio": ("min_tokens_ratio", "ratio", 0.0, 1.0,
                         "a ratio above 0 and below 1, e.g. 0.9 (0 could never fail; 1 or more "
                         "fails an identical canary)"),
    "max_output_mismatch": ("max_output_mismatch", "share", 0.0, 1.0,
                            "a share from 0 to below 1 (1 could never fail)"),
    "max_logprob_gap": ("max_logprob_gap", "nats", 0.0, math.inf,
                        "a finite number of nats above 0, e.g. 1.0 (0 or less takes no near "
                        "tie as equivalent; infinity could never fail)"),
}


def _number(name: str, value: Any, problems: list[str]) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        problems.append(f"{PREFIX}{name}={value!r} is not a number")
        return None
    try:
        return float(value)
    except ValueError:
        problems.append(f"{PREFIX}{name}={value!r} is not a number")
        return None


def _threshold(name: str, value: Any, problems: list[str]) -> float | None:
    _, kind, low, high, accepted = _LIMITS[name]
    number = _number(name, value, problems)
    if number is None:
        return None
    inside = (low <= number < high) if kind == "share" else (low < number < high)
    if not inside or math.isnan(number):
        problems.append(f"{PREFIX}{name}={value!r} is refused. Fix: set {accepted}")
        return None
    return number


def _probes(value: Any, problems: list[str]) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_PROBES
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) and p.strip()
                                                       for p in value):
        problems.append(f"{PREFIX}probes={value!r} is refused. Fix: set a list of non-empty "
                        "prompt strings, or leave it unset for the built-in set")
        return ()
    if not value or len(value) > MAX_PROBES:
        problems.append(f"{PREFIX}probes has {len(value)} prompts. Fix: give 1 to "
                        f"{MAX_PROBES} prompts (each is sent to the canary and every baseline "
                        "over and over during the window)")
        return ()
    return tuple(value)


def _positive(name: str, value: Any, problems: list[str], integer: bool = False) -> float:
    number = _number(name, value, problems)
    if number is not None and (number <= 0 or math.isinf(number) or math.isnan(number)
                               or (integer and number != int(number))):
        problems.append(f"{PREFIX}{name}={value!r} is refused. Fix: set a positive "
                        f"{'whole number' if integer else 'finite number of seconds'}")
    return number or 0.0


def plan_from_vars(variables: dict[str, Any]) -> tuple[CanaryPlan | None, list[str]]:
    """The plan the inventory's sglang_bench_canary_* variables set (absent ones take the
    defaults), or None with every problem."""
    problems: list[str] = []
    base = CanaryPlan()
    given = {k[len(PREFIX):]: v for k, v in variables.items() if k.startswith(PREFIX)}
    limits = {name: _threshold(name, given[name], problems)
              for name in _LIMITS if given.get(name) is not None}
    plan = CanaryPlan(
        window=_positive("window", given.get("window", base.window), problems),
        min_requests=int(_positive("min_requests", given.get("min_requests", base.min_requests),
                                   problems, integer=True)),
        probes=_probes(given.get("probes"), problems),
        probe_tokens=int(_positive("probe_tokens", given.get("probe_tokens", base.probe_tokens),
                                   problems, integer=True)),
        thresholds=Thresholds(**{k: v for k, v in limits.items() if v is not None}))
    return (None, problems) if problems else (plan, [])
