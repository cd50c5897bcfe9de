"""SGLANG_SIM_REGRESS: a simulated server that serves worse than its profile, on demand.

Each item changes one thing a canary is judged by (docs/simulator.md, "Regressions"):

    decode=0.8,ttft=1.3,itl=1.3,errors=0.05,aborts=0.05,outputs=changed (or outputs=near)

Every effect is deterministic (by token index or by a request counter), so a test sees the
same share on every run. It lives here, below both the simulator and the settings tables, so
that the controller refuses a bad `sglang_server_sim_regress` with the very parse the
simulator runs (the product never imports the simulator).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

VARIABLE = "SGLANG_SIM_REGRESS"
# One token interval in this many is in the tail (5%): the interval before tokens 20, 40, ...
# of each request.
TAIL_EVERY = 20
FACTORS = ("decode", "ttft", "itl")
SHARES = ("errors", "aborts")
OUTPUTS = ("changed", "same", "near")
ACCEPTED = ("decode=F, ttft=F, itl=F (F a positive factor, e.g. 0.8 or 1.3), errors=P, "
            "aborts=P (P a share from 0 to 1, e.g. 0.05), outputs=changed or outputs=near; comma "
            "separated, e.g. decode=0.8,errors=0.05")
# What a request that a regression strikes gets instead of its normal answer.
ERROR, ABORT = "error", "abort"


class RegressionError(ValueError):
    """A refused regression: args are (problem, fix), as the settings tables expect."""

    def __init__(self, problem: str, fix: str = f"use {ACCEPTED}") -> None:
        super().__init__(problem, fix)
        self.problem, self.fix = problem, fix


@dataclass(frozen=True)
class Regression:
    decode: float = 1.0  # generation tokens per second times this
    ttft: float = 1.0  # the profile's time to first token times this
    itl: float = 1.0  # every TAIL_EVERY-th token interval times this
    errors: float = 0.0  # share of generation requests answered 500
    aborts: float = 0.0  # share of generation requests aborted part-way
    outputs_changed: bool = False  # every output token is the next one of the baseline's
    # Some output tokens are the baseline's second choice, a near tie (a new release's kernels).
    outputs_near: bool = False

    @property
    def token_offset(self) -> int:
        return 1 if self.outputs_changed else 0

    def token_time(self, i: int, tok_s: float) -> float:
        """Seconds from the first token to token i: i intervals at the (regressed) decode
        speed, those before tokens TAIL_EVERY, 2*TAIL_EVERY, ... `itl` times longer."""
        speed = tok_s * self.decode
        return (i + (self.itl - 1.0) * (i // TAIL_EVERY)) / speed

    def outcome(self, n: int) -> str | None:
        """What the n-th generation request (1-based) gets: ERROR for every round(1/errors)-th,
        ABORT for every round(1/aborts)-th counted half a period later (so equal shares never
        meet), None for a normal answer. An error wins where both fall on one request."""
        every = _period(self.errors)
        if every and n % every == 0:
            return ERROR
        every = _period(self.aborts)
        if every and (n + every // 2) % every == 0:
            return ABORT
        return None


def _period(share: float) -> int:
    return max(1, round(1 / share)) if share > 0 else 0


def _number(key: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise RegressionError(f"{key}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise RegressionError(f"{key}={value!r} is not a finite number")
    if key in FACTORS and number <= 0:
        raise RegressionError(f"{key}={value} must be a factor above 0")
    if key in SHARES and not 0 <= number <= 1:
        raise RegressionError(f"{key}={value} must be a share from 0 to 1")
    return number


def parse_regress(text: str) -> Regression:
    """The regression `text` asks for ("" is none); RegressionError names the bad item."""
    given: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in (*FACTORS, *SHARES, "outputs"):
            raise RegressionError(f"unknown item {item!r}")
        if key in given:
            raise RegressionError(f"{key} is given twice")
        if key == "outputs" and value not in OUTPUTS:
            raise RegressionError(f"outputs={value!r} is not one of {', '.join(OUTPUTS)}")
        given[key] = value
    numbers = {k: _number(k, v) for k, v in given.items() if k != "outputs"}
    return Regression(**numbers, outputs_changed=given.get("outputs") == "changed",
                      outputs_near=given.get("outputs") == "near")


def regression_from_env(environ: dict[str, str] | None = None) -> Regression:
    """SGLANG_SIM_REGRESS of the environment; a bad value is a ValueError naming the variable,
    the bad item and the accepted forms (the simulator exits with it at start)."""
    text = (os.environ if environ is None else environ).get(VARIABLE, "")
    try:
        return parse_regress(text)
    except RegressionError as bad:
        raise ValueError(f"{VARIABLE}={text!r}: {bad.problem}; {bad.fix}") from None
