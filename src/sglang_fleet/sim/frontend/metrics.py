"""The simulated server's /metrics: SGLang 0.5.23's Prometheus families, labels and text.

Families, types, help texts and label names are the release's own
(sglang/srt/observability/metrics_collector.py: SchedulerMetricsCollector, labelled per
stats-logging scheduler with model_name, engine_type, tp_rank, pp_rank, moe_ep_rank and, with
data parallelism, dp_rank; TokenizerMetricsCollector, labelled model_name and engine_type; the
histograms' default buckets), written as prometheus_client's text exposition writes them
(a counter's HELP and TYPE under its `_total` name, values as floats, no `_created` samples in
multiprocess mode). Only the families a server without speculative decoding, LoRA,
disaggregation, grammars or hierarchical cache reports are served; their values come from the
simulated server's own counts.
"""

from __future__ import annotations

from typing import Any

# (name, type, help, extra label names), as SchedulerMetricsCollector.__init__ declares them.
SCHEDULER_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("sglang:num_running_reqs", "gauge", "The number of running requests.", ()),
    ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", ()),
    ("sglang:num_grammar_queue_reqs", "gauge",
     "The number of requests in the grammar waiting queue.", ()),
    ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", ()),
    ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", ()),
    ("sglang:token_usage", "gauge", "The token usage.", ()),
    ("sglang:num_used_tokens", "gauge", "The number of used tokens.", ()),
    ("sglang:kv_available_tokens", "gauge",
     "Number of free token slots in the KV cache pool.", ()),
    ("sglang:kv_used_tokens", "gauge",
     "Number of actively used token slots in the KV cache pool.", ()),
    ("sglang:num_retracted_reqs", "gauge", "The number of retracted requests.", ()),
    ("sglang:num_paused_reqs", "gauge",
     "The number of paused requests by async weight sync.", ()),
    ("sglang:utilization", "gauge", "The utilization.", ()),
    ("sglang:is_cuda_graph", "gauge", "Whether the batch is using CUDA graph.", ()),
    ("sglang:max_total_num_tokens", "gauge",
     "Maximum total number of tokens in the KV cache pool.", ()),
    ("sglang:weight_memory_usage_gb", "gauge", "Memory used by model weights in GB.", ()),
    ("sglang:kv_cache_memory_usage_gb", "gauge", "Memory used by the KV cache pools in GB.", ()),
    ("sglang:graph_memory_usage_gb", "gauge", "Memory used by captured device graphs in GB.",
     ("phase",)),
    ("sglang:context_len", "gauge", "Maximum context length.", ()),
    ("sglang:startup_available_gpu_memory_gb", "gauge",
     "Available GPU memory in GB at startup.", ()),
)
# TokenizerMetricsCollector.__init__'s, for the main process.
TOKENIZER_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("sglang:startup_time_seconds", "gauge", "Engine startup duration by phase in seconds.",
     ("phase",)),
    ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
     ("is_streaming",)),
    ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
     ("is_streaming",)),
    ("sglang:cached_tokens_total", "counter",
     "Number of cached prompt tokens by source (device/host/storage).", ("cache_source",)),
    ("sglang:num_requests_total", "counter", "Number of requests processed.",
     ("is_streaming",)),
    ("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", ()),
    ("sglang:time_to_first_token_seconds", "histogram",
     "Histogram of time to first token in seconds.", ("is_streaming",)),
    ("sglang:inter_token_latency_seconds", "histogram",
     "Histogram of inter-token latency in seconds.", ()),
    ("sglang:e2e_request_latency_seconds", "histogram",
     "Histogram of End-to-end request latency in seconds", ("is_streaming",)),
)
# TokenizerMetricsCollector's default buckets.
BUCKETS = {
    "sglang:time_to_first_token_seconds": (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40,
                                           60, 80, 100, 200, 400),
    "sglang:inter_token_latency_seconds": (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020,
                                           0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
                                           0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000,
                                           6.000, 8.000),
    "sglang:e2e_request_latency_seconds": (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40,
                                           60, 80, 100, 200, 400, 600, 1200, 1800, 2400),
}


def engine_type(args: Any) -> str:
    """disaggregation/utils.py DisaggregationMode.to_engine_type."""
    mode = getattr(args, "disaggregation_mode", "null")
    return mode if mode in ("prefill", "decode") else "unified"


def scheduler_labels(args: Any, pp_rank: int, tp_rank: int, ep_rank: int,
                     dp_rank: int | None) -> dict[str, str]:
    """The stats-logging scheduler's labels (metrics_collector.py, by the scheduler's ranks)."""
    labels = {"model_name": args.served_model_name, "engine_type": engine_type(args),
              "tp_rank": str(tp_rank), "pp_rank": str(pp_rank), "moe_ep_rank": str(ep_rank)}
    if dp_rank is not None:
        labels["dp_rank"] = str(dp_rank)
    return labels


def tokenizer_labels(args: Any) -> dict[str, str]:
    return {"model_name": args.served_model_name, "engine_type": engine_type(args)}


def _value(v: float) -> str:
    """prometheus_client's floatToGoString for the values a server reports."""
    v = float(v)
    if v == float("inf"):
        return "+Inf"
    return repr(v)


def _labels(labels: dict[str, str]) -> str:
    inner = ",".join('{}="{}"'.format(k, str(v).replace("\\", r"\\").replace('"', r"\""))
                     for k, v in labels.items())
    return "{" + inner + "}" if inner else ""


class Histogram:
    """Counts per bucket, as prometheus_client keeps them."""

    def __init__(self, name: str) -> None:
        self.bounds = BUCKETS[name]
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """`times` observations of `value` (observe_inter_token_latency's fast path)."""
        index = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[index] += times
        self.count += times
        self.total += value * times

    def cumulative(self) -> list[int]:
        out, running = [], 0
        for c in self.counts:
            running += c
            out.append(running)
        return out


class RequestStats:
    """The tokenizer manager's per-request counts, by whether the request streamed."""

    def __init__(self) -> None:
        self.counters: dict[tuple[str, str], float] = {}
        self.histograms: dict[tuple[str, str], Histogram] = {}

    def add(self, name: str, label: str, value: float) -> None:
        self.counters[(name, label)] = self.counters.get((name, label), 0.0) + value

    def observe(self, name: str, label: str, value: float, times: int = 1) -> None:
        self.histograms.setdefault((name, label), Histogram(name)).observe(value, times)

    def observe_interval(self, interval: float, tokens: int) -> None:
        """observe_inter_token_latency: an output's `tokens` new tokens came `interval`
        seconds after the previous output; each counts interval/tokens (unlabelled by
        streaming)."""
        if tokens > 0:
            self.observe("sglang:inter_token_latency_seconds", "", interval / tokens, tokens)

    def finished(self, streaming: bool, prompt: int, cached: int, generated: int,
                 ttft: float | None, e2e: float) -> None:
        flag = "true" if streaming else "false"
        self.add("sglang:prompt_tokens_total", flag, prompt)
        self.add("sglang:generation_tokens_total", flag, generated)
        self.add("sglang:cached_tokens_total", "device", cached)
        self.add("sglang:num_requests_total", flag, 1)
        if ttft is not None:
            self.observe("sglang:time_to_first_token_seconds", flag, ttft)
        self.observe("sglang:e2e_request_latency_seconds", flag, e2e)

    def write(self, out: Exposition, labels: dict[str, str]) -> None:
        extra = {"sglang:cached_tokens_total": "cache_source",
                 "sglang:num_aborted_requests_total": None}
        for (name, label), value in sorted(self.counters.items()):
            key = extra.get(name, "is_streaming")
            out.add(name, {**labels, key: label} if key else labels, value)
        for (name, label), histogram in sorted(self.histograms.items()):
            out.histogram(name, {**labels, "is_streaming": label} if label else labels,
                          histogram)


class Exposition:
    """Samples gathered family by family, written out in the text format."""

    def __init__(self) -> None:
        self.samples: dict[str, list[str]] = {}

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        self.samples.setdefault(name, []).append(f"{name}{_labels(labels)} {_value(value)}")

    def histogram(self, name: str, labels: dict[str, str], histogram: Histogram) -> None:
        lines = self.samples.setdefault(name, [])
        for bound, count in zip((*BUCKETS[name], float("inf")), histogram.cumulative(),
                                strict=True):
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            lines.append(f"{name}_bucket{_labels({**labels, 'le': le})} {_value(count)}")
        lines.append(f"{name}_count{_labels(labels)} {_value(histogram.count)}")
        lines.append(f"{name}_sum{_labels(labels)} {_value(histogram.total)}")

    def text(self) -> str:
        out = []
        for name, kind, doc, _ in (*SCHEDULER_FAMILIES, *TOKENIZER_FAMILIES):
            if name not in self.samples:
                continue
            out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *self.samples[name]]
        return "\n".join(out) + "\n"
