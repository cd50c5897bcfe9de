"""The benchmark against the simulator's known speed, and `sglang-fleet bench` (a canary is
judged under live traffic instead: tests/integration/test_canary.py)."""

from __future__ import annotations

import json
import re

import pytest
import requests

from sglang_fleet.known.reviewed import sim_profile
from sglang_fleet.node.bench.client import run_benchmark
from sglang_fleet.testfleet.local import http_status, make_fleet, sglang_fleet, start_sim, wait_for

pytestmark = pytest.mark.integration

PROFILE = sim_profile("kimi-k2.5-rtxpro6000-tp8")
TUNED_TOK_S = PROFILE["decode_tok_s"]["base"] * PROFILE["decode_tok_s"]["nccl_tuned_multiplier"]


@pytest.fixture(scope="module")
def tuned_sim(tmp_path_factory):
    # --enable-metrics: the server's own time-to-first-token histogram, the tests' reference.
    sim = start_sim(tmp_path_factory.mktemp("bench-sim"), "--enable-metrics", time_factor=0.002,
                    env={"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"})
    wait_for(lambda: http_status(sim.url + "/health") == 200, timeout=60)
    yield sim
    sim.stop()


def server_ttft(sim) -> tuple[float, float]:
    """The server's own time-to-first-token histogram: its sum and count, all requests."""
    text = requests.get(sim.url + "/metrics", timeout=10).text
    return tuple(sum(float(v) for v in re.findall(
        rf"^sglang:time_to_first_token_seconds_{part}{{[^}}]*}} (\S+)$", text, re.M))
        for part in ("sum", "count"))


def mean_server_ttft(sim, before: tuple[float, float]) -> float:
    """The server's mean first-token time over the requests since `before`."""
    total, count = server_ttft(sim)
    assert count > before[1]
    return (total - before[0]) / (count - before[1])


def test_benchmark_reports_the_simulators_speed(tuned_sim):
    """Within 1% of the simulator's paced speed on a quiet machine; the simulator paces its
    tokens with wall-clock sleeps, which a loaded 2-core machine wakes tens of milliseconds
    late, so the test allows 3% over the 2.8 s of each request's decode. The first token is
    held to the server's own record of it: the profile's time at the least, later when a
    loaded machine's eight schedulers take the batch late (as a loaded SGLang's would), and
    the benchmark must report what the server did, within 50 ms of transport."""
    assert 89.9 < TUNED_TOK_S < 90.1  # the incident's 90 tok/s
    # No warm-up, so that the server's histogram holds exactly the two measured requests.
    before = server_ttft(tuned_sim)
    result = run_benchmark("127.0.0.1", tuned_sim.port, input_len=1024, output_len=256,
                           warmup=0, repetitions=2, concurrency=[1])
    level = result["levels"][0]
    assert level["output_tok_s"]["n"] == 2
    assert level["output_tok_s"]["median"] == pytest.approx(TUNED_TOK_S, rel=0.03)
    assert level["decode_tok_s"]["median"] == pytest.approx(TUNED_TOK_S, rel=0.03)
    served = mean_server_ttft(tuned_sim, before)
    assert served >= PROFILE["ttft_s"] - 0.001
    # Two runs: their median is their mean, as the histogram's is.
    assert level["ttft_s"]["median"] == pytest.approx(served, abs=0.05)
    # TPOT, not the ITL gaps' median: a loaded machine's reader may take several chunks at
    # once, which moves the gaps' median but not a stream's decode time over its tokens.
    assert level["tpot_s"]["median"] == pytest.approx(1 / TUNED_TOK_S, rel=0.03)
    assert level["itl_s"]["n"] == 2 * 255


def test_batch_levels_send_one_request_of_distinct_prompts(tuned_sim):
    # 128 tokens (1.4 s at the profile's speed): long enough that a wake-up a loaded machine
    # delays by tens of milliseconds moves the figures by a few percent at most.
    before = server_ttft(tuned_sim)
    result = run_benchmark("127.0.0.1", tuned_sim.port, input_len=16, output_len=128,
                           warmup=0, repetitions=1, concurrency=[1, 3])
    one, three = result["levels"]
    assert (one["concurrency"], one["mode"]) == (1, "single_stream")
    assert (three["concurrency"], three["mode"]) == (3, "batch")
    # bench_one_batch_server's request: one /generate with three distinct prompts, so the
    # server admits them as one prefill batch and nothing comes from the prefix cache.
    assert re.search(r"Prefill batch, #new-seq: 3, #new-token: 48, #cached-token: 0,",
                     tuned_sim.log())
    # Its figures: 3 x 128 tokens over (latency - time until all three have a token), which
    # the simulator's streams, paced side by side, make 3 x 128/127 x the decode speed. The
    # pacing is wall-clock sleeps, a few percent late on a loaded 2-core machine; the
    # arithmetic of the figures is checked exactly below.
    assert three["output_tok_s"]["median"] == pytest.approx(3 * 128 / 127 * TUNED_TOK_S,
                                                            rel=0.05)
    # The batch's first token is the server's (its record over the four requests, held to the
    # profile's time at the least, as in the test above): the client sees all three prompts'
    # first tokens after the server made them, never before. Three server threads write
    # them into one response, which the client reads chunk by chunk; beside a CPU-bound job
    # the last of them reached it 0.12 s after the server's mean, so the bound above is 0.25 s,
    # still far below the 1.4 s of decode the figure must not include.
    served = mean_server_ttft(tuned_sim, before)
    assert served >= PROFILE["ttft_s"] - 0.001
    assert served - 0.05 <= three["ttft_s"]["median"] <= served + 0.25
    assert three["input_tok_s"]["median"] == pytest.approx(
        48 / three["ttft_s"]["median"], rel=1e-6)
    assert three["overall_tok_s"]["median"] == pytest.approx(
        (48 + 3 * 128) / three["latency_s"]["median"], rel=1e-6)
    # Per prompt: bench_serving's TPOT, and ITL per token over the three streams. The ITL
    # gaps are the client's view of each chunk's arrival: a loaded machine's reader takes
    # several chunks of the shared response at once, so their median is not held to the
    # pacing; TPOT (each stream's decode time over its tokens) is.
    assert three["tpot_s"]["n"] == 3
    assert three["tpot_s"]["median"] == pytest.approx(1 / TUNED_TOK_S, rel=0.05)
    assert three["itl_s"]["n"] == 3 * 127
    # Single stream keeps its figures: output tok/s = 128 / (latency - ttft).
    assert one["output_tok_s"]["median"] == pytest.approx(128 / 127 * TUNED_TOK_S, rel=0.05)
    assert one["input_tok_s"]["median"] == pytest.approx(16 / one["ttft_s"]["median"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = make_fleet(tmp_path_factory.mktemp("bench-fleet"), hosts=2, time_factor=0.005)
    yield fleet
    fleet.kill_leftovers()


def bench_args(fleet, **more):
    return ["-i", str(fleet.inventory), "-e", json.dumps(fleet.with_stores(**more))]


def test_bench_command_measures_and_files_each_server(fleet, tmp_path):
    assert fleet.deploy(extra=fleet.with_stores()).rc == 0
    run = sglang_fleet("bench", *bench_args(fleet), "--output-len", "64", "--repetitions", "2",
                       "--run-dir", str(tmp_path / "run"))
    assert run.returncode == 0, run.stdout
    assert "output tok/s (simulated)" in run.stdout and "SIMULATED" in run.stdout
    results = [r for r in fleet.read_store("results.jsonl") if r["kind"] == "benchmark"]
    assert {r["host"] for r in results} == set(fleet.hosts)
    for r in results:
        assert r["simulated"] is True and r["sglang_version"] == "0.5.23"
        assert r["config_hash"] and r["hardware"]["gpu_model"] == "RTX PRO 6000 Blackwell"
        assert r["benchmark"]["levels"][0]["output_tok_s"]["median"] == pytest.approx(
            PROFILE["decode_tok_s"]["base"] * 64 / 63, rel=0.02)
    assert (tmp_path / "run" / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "| sim-node-1 |" in (tmp_path / "run" / "bench.md").read_text()
