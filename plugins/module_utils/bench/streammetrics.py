# -*- coding: utf-8 -*-
# Figures from streaming generations, defined as SGLang 0.5.23's own benchmarks define them:
#   bench_one_batch_server (sglang/benchmark/one_batch_server.py run_one_case, with
#   benchmark/stream_metrics.py BatchStreamRecorder): one request carrying the whole batch;
#     ttft = time until EVERY prompt of the batch has its first token (last_ttft),
#     output tok/s = output tokens / (latency - ttft), input tok/s = input tokens / ttft,
#     overall tok/s = (input + output tokens) / latency. At batch 1 these are single-stream.
#   bench_serving (sglang/benchmark/serving.py async_request_sglang_generate,
#   calculate_metrics): ITL per token, each chunk's gap spread evenly over the tokens it
#     brings (chunks that bring none are skipped); TPOT = (latency - ttft) / (tokens - 1).
# Pure functions, so that hand-worked streams test them and node and controller share them.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import statistics


def per_token_itl(chunks):
    """bench_serving's ITL: after the chunk with the first token, each chunk's gap to the
    previous token-bearing chunk, divided evenly among the tokens it brings."""
    itl = []
    last_time = last_tokens = None
    for t, n in chunks:
        if n < 1:
            continue
        if last_time is not None:
            new = n - last_tokens
            if new <= 0:
                continue
            itl.extend([(t - last_time) / new] * new)
        last_time, last_tokens = t, n
    return itl


def request_metrics(sent_at, chunks, done_at, input_tokens=0):
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
    return {
        "output_tokens": tokens,
        "ttft_s": ttft,
        "latency_s": latency,
        # SGLang's bench_one_batch_server figure: counts the first token, not its time.
        "output_tok_s": tokens / decode_s if decode_s > 0 else None,
        "input_tok_s": input_tokens / ttft if input_tokens and ttft > 0 else None,
        "overall_tok_s": (input_tokens + tokens) / latency if latency > 0 else None,
        "tpot_s": decode_s / (tokens - 1) if tokens > 1 else None,
        # 1 / TPOT: the decode step rate, the figure the first token does not inflate.
        "decode_tok_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else None,
        "itl_s": per_token_itl(chunks),
    }


def batch_metrics(sent_at, streams, done_at, input_tokens):
    """Figures of one batched request, as bench_one_batch_server computes them.

    streams: for each prompt of the batch (by its `index`), its chunks as (arrival time,
    cumulative completion tokens); done_at: when the response ended; input_tokens: the
    batch's prompt tokens. Per-prompt figures (TPOT, ITL) are bench_serving's.
    """
    if not streams or any(not any(n >= 1 for _, n in c) for c in streams):
        missing = [i for i, c in enumerate(streams) if not any(n >= 1 for _, n in c)]
        raise ValueError("no stream chunk with a token for request indices %s" % missing)
    firsts = [next(t for t, n in c if n >= 1) for c in streams]
    ttft = max(firsts) - sent_at  # every prompt has its first token
    latency = done_at - sent_at
    output = sum(c[-1][1] for c in streams)
    per_request = []
    for i, chunks in enumerate(streams):
        first, n, end = firsts[i], chunks[-1][1], chunks[-1][0]
        per_request.append({
            "ttft_s": first - sent_at,
            "tpot_s": (end - first) / (n - 1) if n > 1 else None,
            "decode_tok_s": (n - 1) / (end - first) if n > 1 and end > first else None,
            "itl_s": per_token_itl(chunks),
        })
    return {
        "batch_size": len(streams),
        "output_tokens": output,
        "input_tokens": input_tokens,
        "ttft_s": ttft,
        "latency_s": latency,
        "output_tok_s": output / (latency - ttft) if latency > ttft else None,
        "input_tok_s": input_tokens / ttft if ttft > 0 else None,
        "overall_tok_s": (input_tokens + output) / latency if latency > 0 else None,
        "requests": per_request,
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


def _itl_summary(gaps):
    return {"p50": percentile(gaps, 50), "p95": percentile(gaps, 95),
            "p99": percentile(gaps, 99), "n": len(gaps)}


def summarize(requests):
    """One single-stream level's repetitions: median and spread of each figure, ITL
    percentiles over every token of every repetition."""
    return {
        "output_tok_s": spread([r["output_tok_s"] for r in requests]),
        "input_tok_s": spread([r["input_tok_s"] for r in requests]),
        "overall_tok_s": spread([r["overall_tok_s"] for r in requests]),
        "decode_tok_s": spread([r["decode_tok_s"] for r in requests]),
        "ttft_s": spread([r["ttft_s"] for r in requests]),
        "latency_s": spread([r["latency_s"] for r in requests]),
        "tpot_s": spread([r["tpot_s"] for r in requests]),
        "itl_s": _itl_summary([g for r in requests for g in r["itl_s"]]),
    }


def summarize_batches(batches):
    """One batch level's repetitions: the batch figures' spread over repetitions; TPOT,
    decode rate and ITL over every prompt of every repetition."""
    prompts = [p for b in batches for p in b["requests"]]
    return {
        "output_tok_s": spread([b["output_tok_s"] for b in batches]),
        "input_tok_s": spread([b["input_tok_s"] for b in batches]),
        "overall_tok_s": spread([b["overall_tok_s"] for b in batches]),
        "ttft_s": spread([b["ttft_s"] for b in batches]),
        "latency_s": spread([b["latency_s"] for b in batches]),
        "decode_tok_s": spread([p["decode_tok_s"] for p in prompts]),
        "tpot_s": spread([p["tpot_s"] for p in prompts]),
        "itl_s": _itl_summary([g for p in prompts for g in p["itl_s"]]),
    }
