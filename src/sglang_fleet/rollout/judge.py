"""The canary judged against the servers still on the baseline, signal by signal.

Each signal compares the canary with the baseline servers taken together over one window:
the share of failed requests (the router's per-worker outcomes and the judge's own probe
requests), the share of aborted requests (SGLang's counters), p99 time to first token and
inter-token latency (SGLang's histograms), generation tokens per second of a request (the
inter-token latency histogram's count over its sum) and the greedy probe outputs (exactly
where canary and baseline run one SGLang release, by log-probability distance where the
releases differ). The first failing signal decides; too little live traffic makes the latency
signals inconclusive, never passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sglang_fleet.rollout.metrics import Histogram, ServerSample
from sglang_fleet.rollout.plan import CanaryPlan

PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"


@dataclass(frozen=True)
class Answer:
    """One probe prompt's greedy answer: its text and, where the server returned logprobs,
    its token ids, each token's logprob and each position's top logprobs (token id ->
    logprob)."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    top: tuple[dict[int, float], ...] = ()


@dataclass
class Side:
    """What one side (the canary, or the baselines together) showed over the window."""

    sample: ServerSample = field(default_factory=ServerSample)
    router_success: float = 0.0
    router_failure: float = 0.0
    probes_sent: int = 0
    probes_failed: int = 0
    # Probes other canaries' judges sent it in the same window: not live traffic either.
    other_probes: int = 0
    outputs: dict[str, Answer] = field(default_factory=dict)  # prompt -> greedy answer
    release: str | None = None  # the SGLang release it runs, where known

    @property
    def live_requests(self) -> float:
        return max(self.sample.requests - self.probes_sent - self.other_probes, 0.0)

    def error_rates(self) -> dict[str, tuple[float, float]]:
        """(failed, counted) by source: the judge's own probes, and the router's outcomes
        (a streamed request SGLang failed after its 200 is a success to the router, so the
        two are kept apart rather than diluted into one share)."""
        out = {}
        if self.probes_sent:
            out["probes"] = (float(self.probes_failed), float(self.probes_sent))
        if self.router_success + self.router_failure:
            out["router"] = (self.router_failure, self.router_success + self.router_failure)
        return out

    def abort_rate(self) -> float | None:
        return self.sample.aborted / self.sample.requests if self.sample.requests else None

    def tokens_per_s(self) -> float | None:
        itl = self.sample.itl
        return itl.count / itl.total if itl.total > 0 else None


def combine(sides: list[Side]) -> Side:
    """The baseline servers as one side: their counts summed."""
    out = Side()
    for s in sides:
        out.sample = ServerSample(out.sample.requests + s.sample.requests,
                                  out.sample.aborted + s.sample.aborted,
                                  _sum(out.sample.ttft, s.sample.ttft),
                                  _sum(out.sample.itl, s.sample.itl))
        out.router_success += s.router_success
        out.router_failure += s.router_failure
        out.probes_sent += s.probes_sent
        out.probes_failed += s.probes_failed
        out.other_probes += s.other_probes
    return out


def _sum(a: Histogram, b: Histogram) -> Histogram:
    bounds = set(a.buckets) | set(b.buckets)
    return Histogram({le: a.buckets.get(le, 0.0) + b.buckets.get(le, 0.0) for le in bounds},
                     a.total + b.total, a.count + b.count)


def _signal(name: str, canary: float | None, baseline: float | None, threshold: float,
            failed: bool | None, unit: str = "", note: str = "") -> dict[str, Any]:
    return {"signal": name, "canary": canary, "baseline": baseline, "threshold": threshold,
            "failed": failed, "unit": unit, "note": note}


# One failed request is never a regression by itself, however few were counted.
MIN_FAILED = 2


def _errors(canary: Side, base: Side, limit: float) -> dict[str, Any]:
    """The error rate of the source where the canary stands furthest above the baseline."""
    found = []
    for source, (failed, counted) in canary.error_rates().items():
        theirs = base.error_rates().get(source)
        if theirs:
            found.append((failed / counted - theirs[0] / theirs[1], source, failed, counted,
                          theirs[0] / theirs[1]))
    if not found:
        return _signal("error rate", None, None, limit, None, "share", "no requests counted")
    gap, source, failed, counted, theirs = max(found)
    note = (f"{'the probes' if source == 'probes' else 'the router'}: {failed:.0f} of the "
            f"canary's {counted:.0f} failed")
    fails = gap > limit and failed >= MIN_FAILED
    if gap > limit and not fails:
        note += f" (fewer than {MIN_FAILED}: not believed)"
    return _signal("error rate", failed / counted, theirs, limit, fails, "share", note)


def _increase(name: str, canary: float | None, baseline: float | None,
              limit: float) -> dict[str, Any]:
    if canary is None or baseline is None:
        return _signal(name, canary, baseline, limit, None, "share", "no requests counted")
    return _signal(name, canary, baseline, limit, canary - baseline > limit, "share")


# A canary's p99 from a few dozen requests is its slowest one or two: it is believed only when
# more of its observations lie past the baseline's p99 than 1% would give, by this chance.
TAIL_ALPHA = 0.001


def poisson_tail(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean): the chance of k or more of n observations past a
    bound that 1% of them pass (mean = n / 100)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    below = sum(math.exp(i * math.log(mean) - mean - math.lgamma(i + 1)) for i in range(k))
    return max(0.0, 1.0 - below)


def _past_baseline_tail(canary: Histogram, bound: float, share: float = 0.01
                        ) -> tuple[int, int, float]:
    """How many of the canary's observations lie past `bound`, of how many, and the chance of
    that many where `share` of them pass it (the baseline's share)."""
    n = int(canary.count)
    k = int(round(canary.count_past(bound)))
    return k, n, poisson_tail(k, n * share)


def _same_bucket(name: str, canary: Histogram, baseline: Histogram, limit: float,
                 bucket: tuple[float, float]) -> dict[str, Any]:
    """Both p99s in one bucket, which cannot tell them apart: the means decide (exact: sum
    over count), and so does the tail inside the bucket, where a regression of the slowest
    few percent shows: the canary's share past the bucket's lower bound at least twice the
    baseline's, beyond chance."""
    lower, upper = bucket
    cm, bm = canary.mean() or 0.0, baseline.mean() or 0.0
    theirs = baseline.count_past(lower) / baseline.count if baseline.count else 0.0
    k, n, chance = _past_baseline_tail(canary, lower, theirs)
    tail = k / n >= 2 * theirs and chance < TAIL_ALPHA if n else False
    means = bm > 0 and cm / bm > limit
    note = (f"both p99s in the {lower:g}-{upper:g} s bucket: means compared; past {lower:g} s "
            f"{k / n if n else 0:.1%} of the canary's against {theirs:.1%} of the baseline's "
            f"(a chance of {chance:.1e})")
    if tail and not means:
        note += ": the tail at least doubled, FAILED"
    return _signal(name, cm, bm, limit, means or tail, "s", note)


def _p99_ratio(name: str, canary: Histogram, baseline: Histogram,
               limit: float) -> dict[str, Any]:
    """p99 ratio, believed only when the canary's tail past the baseline's p99 bucket is
    larger than chance; where both p99s fall in one bucket, see _same_bucket."""
    c, b = canary.quantile(0.99), baseline.quantile(0.99)
    if c is None or b is None:
        return _signal(name, None, None, limit, None, "s", "no observations")
    if (c[1], c[2]) == (b[1], b[2]):
        return _same_bucket(name, canary, baseline, limit, (c[1], c[2]))
    above = b[0] > 0 and c[0] / b[0] > limit
    if not above or math.isinf(b[2]):
        return _signal(name, c[0], b[0], limit, above, "s")
    k, n, chance = _past_baseline_tail(canary, b[2])
    note = (f"{k} of the canary's {n} past the baseline's p99 bucket (above {b[2]:g} s), "
            f"a chance of {chance:.1e} if it were the baseline's")
    return _signal(name, c[0], b[0], limit, chance < TAIL_ALPHA,
                   "s", note + ("" if chance < TAIL_ALPHA else ": not believed"))


def logprob_gap(canary: Answer, baseline: Answer) -> tuple[int, float | None] | None:
    """Where the canary's tokens first differ from the baseline's, and how far below its own
    choice the baseline ranks the canary's token there (nats; None: not among its top
    logprobs, or no logprobs). None where the tokens are the same."""
    ours, theirs = canary.token_ids, baseline.token_ids
    if not ours or not theirs:  # a server that returned no logprobs: its text decides
        return None if canary.text == baseline.text else (0, None)
    common = min(len(ours), len(theirs))
    at = next((k for k in range(common) if ours[k] != theirs[k]), common)
    if at == len(ours) == len(theirs):
        return None
    if at >= len(ours) or at >= len(theirs) or at >= len(baseline.top) \
            or at >= len(baseline.logprobs):
        return at, None  # one answer ended early: its end token is not in the other's top
    canary_logprob = baseline.top[at].get(ours[at])
    return at, None if canary_logprob is None else baseline.logprobs[at] - canary_logprob


def _releases_differ(canary: Side, reference: Side) -> bool:
    return bool(canary.release and reference.release and canary.release != reference.release)


def _outputs(canary: Side, baselines: list[Side], limits: tuple[float, float]
             ) -> dict[str, Any]:
    limit, max_gap = limits
    reference = next((s for s in baselines if s.outputs), Side())
    prompts = [p for p in canary.outputs if p in reference.outputs]
    if not prompts:
        return _signal("greedy outputs", None, None, limit, None, "share",
                       "no probe answered on both sides")
    for other in baselines[1:]:
        if any(p in other.outputs and other.outputs[p].text != reference.outputs[p].text
               for p in prompts):
            return _signal("greedy outputs", None, None, limit, None, "share",
                           "the baseline servers answer the probes differently: outputs "
                           "are not comparable")
    if _releases_differ(canary, reference):
        differ, note = _by_logprob(canary, reference, prompts, max_gap)
    else:
        differ = [p for p in prompts
                  if canary.outputs[p].text != reference.outputs[p].text]
        same = (f"both on {canary.release}" if canary.release and reference.release
                else "a release not known")
        note = (f"compared exactly ({same}); {len(differ)} of {len(prompts)} prompts "
                "differ" + (f", e.g. {differ[0]!r}: {canary.outputs[differ[0]].text!r} "
                            f"against {reference.outputs[differ[0]].text!r}" if differ else ""))
    share = len(differ) / len(prompts)
    return _signal("greedy outputs", share, 0.0, limit, share > limit, "share", note)


def _by_logprob(canary: Side, reference: Side, prompts: list[str],
                max_gap: float) -> tuple[list[str], str]:
    """The prompts whose tokens differ beyond a near tie, and the note that says so: a
    differing prompt is equivalent where, at its first differing token, the baseline's own
    logprob of the canary's token is within max_gap nats of its chosen token's."""
    gaps = {p: logprob_gap(canary.outputs[p], reference.outputs[p]) for p in prompts}
    changed = {p: g for p, g in gaps.items() if g is not None}
    differ = [p for p, (_, gap) in changed.items() if gap is None or gap > max_gap]
    note = (f"releases differ (canary {canary.release}, baseline {reference.release}): "
            f"compared by log-probability distance; {len(changed)} of {len(prompts)} prompts "
            f"differ, {len(differ)} by more than {max_gap:g} nat")
    shown = differ[0] if differ else next(iter(changed), None)
    if shown is not None:
        at, gap = changed[shown]
        note += (f", e.g. {shown!r} at token {at}: the baseline ranks the canary's token "
                 + ("outside its top logprobs" if gap is None else f"{gap:.2f} nat below its own"))
    return differ, note


def signals(canary: Side, baselines: list[Side], plan: CanaryPlan) -> list[dict[str, Any]]:
    t, base = plan.thresholds, combine(baselines)
    tokens = (canary.tokens_per_s(), base.tokens_per_s())
    out = [
        _errors(canary, base, t.max_error_increase),
        _outputs(canary, baselines, (t.max_output_mismatch, t.max_logprob_gap)),
        _increase("abort rate", canary.abort_rate(), base.abort_rate(), t.max_abort_increase),
        _signal("generation tokens/s", tokens[0], tokens[1], t.min_tokens_ratio,
                None if None in tokens else tokens[0] / tokens[1] < t.min_tokens_ratio,
                "tok/s", "" if None not in tokens else "no tokens observed"),
        _p99_ratio("p99 time to first token", canary.sample.ttft, base.sample.ttft,
                   t.max_ttft_p99_ratio),
        _p99_ratio("p99 inter-token latency", canary.sample.itl, base.sample.itl,
                   t.max_itl_p99_ratio),
    ]
    return out


# Signals measured by the judge's own probe requests: they decide without live traffic.
_OWN_TRAFFIC = ("error rate", "greedy outputs")


def judge(canary: Side, baselines: list[Side], plan: CanaryPlan) -> dict[str, Any]:
    """The judgement: verdict, the deciding signal with both values, every signal."""
    found = signals(canary, baselines, plan)
    base = combine(baselines)
    live = {"canary": canary.live_requests, "baseline": base.live_requests}
    starved = [side for side, n in live.items() if n < plan.min_requests]
    failed = [s for s in found if s["failed"]
              and (not starved or s["signal"] in _OWN_TRAFFIC)]
    if failed:
        verdict, decided = FAILED, failed[0]
    elif starved or not baselines:
        verdict, decided = INCONCLUSIVE, None
    else:
        verdict, decided = PASSED, None
    result = {"verdict": verdict, "passed": verdict == PASSED, "signals": found,
              "decided_by": decided["signal"] if decided else None, "window": plan.window,
              "live_requests": live}
    result["message"] = describe(result, plan, starved)
    return result


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "share":
        return f"{v:.1%}"
    if unit == "s":
        return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"
    return f"{v:.1f} {unit}".strip()


def _comparison(s: dict[str, Any]) -> str:
    """How the canary stands against the baseline, and the limit it is held to."""
    canary, baseline, limit = s["canary"], s["baseline"], s["threshold"]
    if canary is None or baseline is None:
        return "not judged"
    if s["unit"] == "share":
        verb = "more than" if canary - baseline > limit else "within"
        return f"{(canary - baseline) * 100:+.1f} points, {verb} the {limit * 100:g} allowed"
    ratio = canary / baseline if baseline else float("inf")
    if s["signal"] == "generation tokens/s":
        return f"{ratio:.2f}x, {'below' if ratio < limit else 'within'} the {limit:g}x allowed"
    return f"{ratio:.2f}x, {'above' if ratio > limit else 'within'} the {limit:g}x allowed"


def describe_signal(s: dict[str, Any]) -> str:
    """One signal in words: its name, both values, how they compare with its limit, any note."""
    text = (f"{s['signal']}: canary {_value(s['canary'], s['unit'])}, baseline "
            f"{_value(s['baseline'], s['unit'])} ({_comparison(s)})")
    return text + (f"; {s['note']}" if s["note"] else "")


def describe(result: dict[str, Any], plan: CanaryPlan, starved: list[str]) -> str:
    live = result["live_requests"]
    window = (f"over {plan.window:g} s of live traffic (canary {live['canary']:.0f} requests, "
              f"baseline {live['baseline']:.0f})")
    if result["verdict"] == FAILED:
        decided = next(s for s in result["signals"] if s["signal"] == result["decided_by"])
        return f"failed on {describe_signal(decided)}, {window}"
    if result["verdict"] == INCONCLUSIVE:
        why = (f"{' and '.join(starved)} got fewer than {plan.min_requests} live requests"
               if starved else "no baseline server to compare with")
        return f"inconclusive: {why}, {window}; never passed without enough traffic"
    return f"passed every signal {window}"
