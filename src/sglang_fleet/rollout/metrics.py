"""What a canary is judged by, read from Prometheus text: SGLang's own counters and
histograms (`sglang:*`, 0.5.23's TokenizerMetricsCollector) and the router's per-worker
outcomes (`smg_worker_cb_outcomes_total`, sglang-router's circuit breaker: success or failure
of each request it sent a worker). A window is the difference of two scrapes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sglang_fleet.node.router.api import parse_prometheus

REQUESTS = "sglang:num_requests"
ABORTED = "sglang:num_aborted_requests"
TTFT = "sglang:time_to_first_token_seconds"
ITL = "sglang:inter_token_latency_seconds"
ROUTER_OUTCOMES = "smg_worker_cb_outcomes"


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    total: float = 0.0  # _sum
    count: float = 0.0

    def minus(self, earlier: Histogram) -> Histogram:
        return Histogram({le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
                         self.total - earlier.total, self.count - earlier.count)

    def count_past(self, bound: float) -> float:
        """How many observations lie past `bound` (a bucket's upper bound)."""
        within = max((c for le, c in self.buckets.items() if le <= bound), default=0.0)
        return self.count - within

    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def quantile(self, q: float) -> tuple[float, float, float] | None:
        """Prometheus' histogram_quantile (linear within the bucket holding the rank), with
        that bucket's bounds: (estimate, lower bound, upper bound)."""
        if self.count <= 0:
            return None
        rank, lower, below = q * self.count, 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if le == float("inf"):
                    return lower, lower, le
                return lower + (le - lower) * (rank - below) / max(n - below, 1e-12), lower, le
            lower, below = le, n
        return lower, lower, float("inf")


@dataclass
class ServerSample:
    """One scrape of a server's /metrics, summed over its label sets (streaming or not)."""

    requests: float = 0.0
    aborted: float = 0.0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)

    def minus(self, earlier: ServerSample) -> ServerSample:
        return ServerSample(self.requests - earlier.requests, self.aborted - earlier.aborted,
                            self.ttft.minus(earlier.ttft), self.itl.minus(earlier.itl))


def _add_histogram(h: Histogram, name: str, family: str, labels: dict[str, str],
                   value: float) -> None:
    suffix = name[len(family):]
    if suffix == "_bucket":
        le = float(labels["le"])
        h.buckets[le] = h.buckets.get(le, 0.0) + value
    elif suffix == "_sum":
        h.total += value
    elif suffix == "_count":
        h.count += value


def server_sample(text: str) -> ServerSample:
    """The counters and histograms a canary is judged by, from one /metrics text."""
    out = ServerSample()
    for (name, label_set), value in parse_prometheus(text).items():
        labels = dict(label_set)
        if name == REQUESTS + "_total":
            out.requests += value
        elif name == ABORTED + "_total":
            out.aborted += value
        elif name.startswith(TTFT + "_"):
            _add_histogram(out.ttft, name, TTFT, labels, value)
        elif name.startswith(ITL + "_"):
            _add_histogram(out.itl, name, ITL, labels, value)
    return out


def router_outcomes(text: str) -> dict[str, dict[str, float]]:
    """Per worker URL, the router's count of each outcome ({"success": n, "failure": m})."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (name, label_set), value in parse_prometheus(text).items():
        labels = dict(label_set)
        if name == ROUTER_OUTCOMES + "_total" and "worker" in labels:
            worker, outcome = labels["worker"].rstrip("/"), labels.get("outcome", "")
            out[worker][outcome] = out[worker].get(outcome, 0.0) + value
    return dict(out)
