"""Benchmark figures against hand-worked streams, as SGLang's benchmarks define them."""

from __future__ import annotations

import pytest

from sglang_fleet.node.bench.client import distinct_input_ids
from sglang_fleet.node.bench.streammetrics import (
    batch_metrics,
    per_token_itl,
    percentile,
    request_metrics,
    spread,
    summarize,
    summarize_batches,
)


def test_one_token_per_chunk():
    # Sent at t=10.0; first token after 200 ms, then one every 100 ms; [DONE] with the last.
    m = request_metrics(10.0, [(10.2, 1), (10.3, 2), (10.4, 3), (10.5, 4)], 10.5)
    assert m["output_tokens"] == 4
    assert m["ttft_s"] == pytest.approx(0.2)
    assert m["latency_s"] == pytest.approx(0.5)
    # bench_one_batch_server: output_len / (latency - ttft) = 4 / 0.3
    assert m["output_tok_s"] == pytest.approx(13.3333, rel=1e-4)
    # bench_serving: TPOT = (latency - ttft) / (n - 1) = 0.1 s; 1/TPOT = 10 tok/s
    assert m["tpot_s"] == pytest.approx(0.1)
    assert m["decode_tok_s"] == pytest.approx(10.0)
    assert m["itl_s"] == pytest.approx([0.1, 0.1, 0.1])


def test_chunks_carrying_several_tokens_and_a_late_done():
    # stream_interval=2: chunks bring 1, then 2 tokens at a time; [DONE] 50 ms after the last.
    m = request_metrics(0.0, [(0.25, 1), (0.45, 3), (0.65, 5)], 0.70, input_tokens=100)
    assert m["ttft_s"] == pytest.approx(0.25)
    assert m["output_tok_s"] == pytest.approx(5 / 0.45)
    assert m["tpot_s"] == pytest.approx(0.45 / 4)
    # bench_serving: each 200 ms gap spread over the two tokens its chunk brings
    assert m["itl_s"] == pytest.approx([0.1, 0.1, 0.1, 0.1])
    # bench_one_batch_server at batch 1: input tokens / ttft, all tokens / latency
    assert m["input_tok_s"] == pytest.approx(100 / 0.25)
    assert m["overall_tok_s"] == pytest.approx(105 / 0.70)


def test_itl_skips_chunks_that_bring_no_token():
    # A chunk repeating the count (no new token) neither adds a gap nor moves the clock.
    assert per_token_itl([(0.1, 0), (0.3, 1), (0.35, 1), (0.5, 2), (0.8, 5)]) == pytest.approx(
        [0.2, 0.1, 0.1, 0.1])


def test_ttft_is_the_chunk_that_brings_the_first_token():
    # A role/empty chunk (0 tokens) before the first token does not count as the first token.
    m = request_metrics(0.0, [(0.05, 0), (0.3, 1), (0.4, 2)], 0.4)
    assert m["ttft_s"] == pytest.approx(0.3)
    assert m["itl_s"] == pytest.approx([0.1])


def test_a_stream_without_tokens_is_an_error():
    with pytest.raises(ValueError, match="no tokens"):
        request_metrics(0.0, [], 1.0)
    with pytest.raises(ValueError, match="no tokens"):
        request_metrics(0.0, [(0.1, 0)], 1.0)


def test_percentiles_interpolate_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_summary_of_repetitions():
    runs = [request_metrics(0.0, [(0.2, 1), (0.3, 2), (0.4, 3)], 0.4),
            request_metrics(0.0, [(0.2, 1), (0.4, 2), (0.6, 3)], 0.6),
            request_metrics(0.0, [(0.1, 1), (0.2, 2), (0.3, 3)], 0.3)]
    s = summarize(runs)
    # output tok/s per run: 3/0.2=15, 3/0.4=7.5, 3/0.2=15
    assert s["output_tok_s"]["median"] == pytest.approx(15.0)
    assert s["output_tok_s"]["min"] == pytest.approx(7.5)
    assert s["output_tok_s"]["n"] == 3
    assert s["ttft_s"]["median"] == pytest.approx(0.2)
    # gaps: 0.1, 0.1, 0.2, 0.2, 0.1, 0.1 -> p50 0.1, p99 near 0.2
    assert s["itl_s"]["n"] == 6
    assert s["itl_s"]["p50"] == pytest.approx(0.1)
    assert s["itl_s"]["p99"] == pytest.approx(0.2)
    assert spread([None, 2.0])["n"] == 1


def test_a_batch_counts_ttft_until_every_prompt_started():
    # One request with three prompts sent at t=0 (100 input tokens each), one token per chunk:
    #   index 0: tokens at 0.20, 0.30, 0.40, 0.50
    #   index 1: tokens at 0.25, 0.35, 0.45, 0.55
    #   index 2: tokens at 0.40, 0.50, 0.60, 0.70  (the last to start)
    # [DONE] at 0.72.
    streams = [[(0.20 + 0.1 * k, k + 1) for k in range(4)],
               [(0.25 + 0.1 * k, k + 1) for k in range(4)],
               [(0.40 + 0.1 * k, k + 1) for k in range(4)]]
    m = batch_metrics(0.0, streams, 0.72, input_tokens=300)
    assert m["ttft_s"] == pytest.approx(0.40), "time until every prompt has a token"
    assert m["latency_s"] == pytest.approx(0.72)
    assert m["output_tokens"] == 12
    assert m["output_tok_s"] == pytest.approx(12 / 0.32)  # tokens / (latency - last ttft)
    assert m["input_tok_s"] == pytest.approx(300 / 0.40)
    assert m["overall_tok_s"] == pytest.approx(312 / 0.72)
    assert [r["ttft_s"] for r in m["requests"]] == pytest.approx([0.20, 0.25, 0.40])
    assert all(r["tpot_s"] == pytest.approx(0.1) for r in m["requests"])
    assert all(r["itl_s"] == pytest.approx([0.1] * 3) for r in m["requests"])


def test_a_batch_with_multi_token_chunks_and_its_summary():
    streams = [[(0.2, 1), (0.6, 5)], [(0.3, 2), (0.5, 5)]]
    m = batch_metrics(0.0, streams, 0.6, input_tokens=20)
    assert m["ttft_s"] == pytest.approx(0.3)
    assert m["output_tok_s"] == pytest.approx(10 / 0.3)
    assert m["requests"][0]["itl_s"] == pytest.approx([0.1] * 4)
    assert m["requests"][1]["itl_s"] == pytest.approx([0.2 / 3] * 3)
    s = summarize_batches([m, m])
    assert s["output_tok_s"]["median"] == pytest.approx(10 / 0.3) and s["output_tok_s"]["n"] == 2
    assert s["ttft_s"]["median"] == pytest.approx(0.3)
    assert s["itl_s"]["n"] == 14 and s["tpot_s"]["n"] == 4


def test_a_batch_where_a_prompt_never_started_is_an_error():
    with pytest.raises(ValueError, match=r"request indices \[1\]"):
        batch_metrics(0.0, [[(0.1, 1)], [(0.2, 0)]], 0.3, input_tokens=2)


def test_batch_prompts_are_distinct_and_repeatable():
    prompts = distinct_input_ids(4, 16)
    assert len({p[0] for p in prompts}) == 4 and all(len(p) == 16 for p in prompts)
    assert prompts == distinct_input_ids(4, 16)
