# -*- coding: utf-8 -*-
# Figures from one streaming generation, defined as SGLang's own benchmarks define them:
#   bench_one_batch_server: ttft = time to the chunk that brings the first token,
#     output tok/s = output tokens / (latency - ttft)
#   bench_serving: ITL = gaps between chunks, TPOT = (latency - ttft) / (output tokens - 1)
# Pure functions, so that hand-worked streams test them and node and controller share them.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import statistics


def request_metrics(sent_at, chunks, done_at):
    """Figures of one request.

    sent_at: when the request was sent; chunks: (arrival time, cumulative completion tokens)
    for each streamed chunk, in arrival order; done_at: when the stream ended ([DONE]).
    """
    if not chunks:
        raise ValueError("the stream carried no tokens")
    tokens = chunks[-1][1]
    first = next((t for t, n in chunks if n >= 1), None)
    if first is None:
        raise ValueError("the stream carried no tokens")
    ttft = first - sent_at
    latency = done_at - sent_at
    decode_s = latency - ttft
    times = [t for t, n in chunks if n >= 1]
    itl = [times[i + 1] - times[i] for i in range(len(times) - 1)]
    return {
        "output_tokens": tokens,
        "ttft_s": ttft,
        "latency_s": latency,
        # SGLang's bench_one_batch_server figure: counts the first token, not its time.
        "output_tok_s": tokens / decode_s if decode_s > 0 else None,
        "tpot_s": decode_s / (tokens - 1) if tokens > 1 else None,
        # 1 / TPOT: the decode step rate, the figure the first token does not inflate.
        "decode_tok_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else None,
        "itl_s": itl,
    }


def percentile(values, pct):
    """Linear-interpolated percentile (numpy's default method)."""
    values = sorted(values)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    rank = (len(values) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def spread(values):
    """Median and spread of repeated measurements."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def summarize(requests):
    """One concurrency level's repetitions: median and spread of each figure, ITL percentiles
    over every gap of every repetition."""
    gaps = [g for r in requests for g in r["itl_s"]]
    return {
        "output_tok_s": spread([r["output_tok_s"] for r in requests]),
        "decode_tok_s": spread([r["decode_tok_s"] for r in requests]),
        "ttft_s": spread([r["ttft_s"] for r in requests]),
        "latency_s": spread([r["latency_s"] for r in requests]),
        "tpot_s": spread([r["tpot_s"] for r in requests]),
        "itl_s": {"p50": percentile(gaps, 50), "p95": percentile(gaps, 95),
                  "p99": percentile(gaps, 99), "n": len(gaps)},
    }
