"""Delta debugging over the variables in which a good and a bad configuration differ.

A trial deploys the good configuration with a subset of the variables taken from the bad one
and reports whether the server failed. Trials are expensive (a deploy and a gate, recovery
after a failure), so the search first assumes one culprit and halves the candidates, taking a
half it did not test as failing when the other half passed; it confirms the last candidate
with a trial of its own, so the culprit always comes with the evidence of a real failure.
When that assumption breaks (variables that fail only together), it falls back to Zeller's
ddmin, which finds a 1-minimal failing subset, reusing every trial already run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Subset = tuple[str, ...]


@dataclass
class BisectResult:
    culprit: Subset
    trials: list[tuple[Subset, bool]] = field(default_factory=list)
    method: str = "halving"

    @property
    def confirmed(self) -> bool:
        """A trial of exactly the culprit failed (False: the bad configuration never failed)."""
        return any(f and set(s) == set(self.culprit) for s, f in self.trials)


class _Oracle:
    def __init__(self, trial: Callable[[Subset], bool]):
        self.trial = trial
        self.seen: dict[frozenset[str], bool] = {}
        self.log: list[tuple[Subset, bool]] = []

    def fails(self, subset: Sequence[str]) -> bool:
        key = frozenset(subset)
        if key not in self.seen:
            self.seen[key] = bool(self.trial(tuple(subset)))
            self.log.append((tuple(subset), self.seen[key]))
        return self.seen[key]


def _halve(items: Sequence[str]) -> tuple[list[str], list[str]]:
    mid = (len(items) + 1) // 2
    return list(items[:mid]), list(items[mid:])


def _ddmin(items: list[str], oracle: _Oracle) -> list[str]:
    n = 2
    while len(items) >= 2:
        size = -(-len(items) // n)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        reduced = False
        for chunk in chunks:
            if oracle.fails(chunk):
                items, n, reduced = chunk, 2, True
                break
        if not reduced:
            for i in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != i for x in c]
                if oracle.fails(rest):
                    items, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(items):
                break
            n = min(2 * n, len(items))
    return items


def find_culprit(variables: Sequence[str], trial: Callable[[Subset], bool]) -> BisectResult:
    """The smallest set of `variables` that makes the good configuration fail.

    `trial(subset)` deploys good + bad's values of `subset` and returns True when it failed.
    The full set is taken as failing (it is the bad configuration) without a trial.
    """
    if not variables:
        raise ValueError("the good and bad configurations do not differ")
    oracle = _Oracle(trial)
    candidates, proven = list(variables), False
    while len(candidates) > 1:
        first, second = _halve(candidates)
        if oracle.fails(first):
            candidates, proven = first, True
        else:
            candidates, proven = second, False  # inferred: the whole set fails, this half passed
    if proven or oracle.fails(candidates):
        return BisectResult(tuple(candidates), oracle.log, "halving")
    # Only a combination fails: search for a 1-minimal failing set.
    culprit = _ddmin(list(variables), oracle)
    oracle.fails(culprit)  # cached unless it is the untested full set: confirm it fails
    return BisectResult(tuple(culprit), oracle.log, "ddmin")
