"""Delta debugging: few trials for one culprit, the right answer for a combination."""

from __future__ import annotations

import itertools
import math

import pytest

from sglang_fleet.bench.bisect import find_culprit

SIX = [f"var{i}" for i in range(6)]


@pytest.mark.parametrize("culprit", SIX)
def test_one_culprit_among_six_takes_at_most_four_trials(culprit):
    result = find_culprit(SIX, lambda subset: culprit in subset)
    assert result.culprit == (culprit,)
    assert result.confirmed  # a trial of the culprit alone failed: its evidence exists
    assert len(result.trials) <= 4


@pytest.mark.parametrize("k", [2, 8, 16, 32])
def test_trials_grow_with_log2_of_the_variables(k):
    names = [f"v{i}" for i in range(k)]
    worst = max(len(find_culprit(names, lambda s, c=c: c in s).trials) for c in names)
    assert worst <= math.ceil(math.log2(k)) + 1


@pytest.mark.parametrize("pair", list(itertools.combinations(SIX, 2)))
def test_variables_that_fail_only_together_are_found_together(pair):
    a, b = pair
    result = find_culprit(SIX, lambda s: a in s and b in s)
    assert set(result.culprit) == {a, b}
    assert result.confirmed


def test_no_trial_is_run_twice():
    seen = []
    find_culprit(SIX, lambda s: seen.append(frozenset(s)) or ("var1" in s and "var4" in s))
    assert len(seen) == len(set(seen))


def test_a_bad_configuration_that_never_fails_is_reported_unconfirmed():
    result = find_culprit(SIX, lambda s: False)
    assert not result.confirmed


def test_nothing_to_bisect():
    with pytest.raises(ValueError, match="do not differ"):
        find_culprit([], lambda s: True)
