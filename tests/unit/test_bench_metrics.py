"""Benchmark figures against hand-worked streams, as SGLang's benchmarks define them."""

from __future__ import annotations

import pytest

from sglang_fleet.results import canary_check, hardware_key, results_for
from sglang_fleet_node.sglang_fleet_streammetrics import (
    percentile,
    request_metrics,
    spread,
    summarize,
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
    m = request_metrics(0.0, [(0.25, 1), (0.45, 3), (0.65, 5)], 0.70)
    assert m["ttft_s"] == pytest.approx(0.25)
    assert m["output_tok_s"] == pytest.approx(5 / 0.45)
    assert m["tpot_s"] == pytest.approx(0.45 / 4)
    assert m["itl_s"] == pytest.approx([0.2, 0.2])


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


SPEC = {"host": "n1", "gpu": {"model": "RTX PRO 6000 Blackwell", "count": 8,
                              "compute_capability": "12.0"},
        "facts": {"interconnect": "pcie", "tp": 8}, "model": {"served_name": "Kimi-K2.5"},
        "group": {"nnodes": 1}, "install": {"mode": "simulator"}}


def entry(config_hash: str, tok_s: float, hardware=None) -> dict:
    return {"kind": "benchmark", "config_hash": config_hash, "host": "n1", "simulated": True,
            "hardware": hardware or hardware_key(SPEC),
            "benchmark": {"levels": [{"output_tok_s": {"median": tok_s}}]}}


def test_canary_gate_compares_decode_speed_with_the_previous_spec():
    slower = canary_check(entry("old", 90.0), entry("new", 63.6), max_drop_pct=5)
    assert not slower["passed"]
    assert slower["drop_pct"] == pytest.approx(29.33, abs=0.01)
    assert "90.0 -> 63.6 simulated tok/s (-29.3%)" in slower["message"]
    assert canary_check(entry("old", 90.0), entry("new", 86.0), max_drop_pct=5)["passed"]
    assert canary_check(entry("old", 63.6), entry("new", 90.0), max_drop_pct=0)["passed"]
    first = canary_check(None, entry("new", 63.6), max_drop_pct=5)
    assert first["passed"] and "nothing to compare" in first["message"]
    same = canary_check(entry("h", 90.0), entry("h", 80.0), max_drop_pct=5)
    assert same["passed"] and "unchanged" in same["message"]


def test_results_compare_only_on_the_same_hardware():
    other = dict(hardware_key(SPEC), gpu_count=4)
    store = [entry("a", 60.0), entry("a", 61.0, other), entry("b", 90.0),
             {"kind": "ready", "config_hash": "a"}]
    found = results_for(store, "a", hardware_key(SPEC))
    assert [e["benchmark"]["levels"][0]["output_tok_s"]["median"] for e in found] == [60.0]
