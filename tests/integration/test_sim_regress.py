"""SGLANG_SIM_REGRESS as a client and /metrics see it, against a baseline server side by side.

Two regressed servers beside one baseline, under the same streaming load: one decodes at half
speed, fails 5% of requests with 500 and answers other tokens; the other has first tokens twice
as slow, an inter-token latency tail five times as slow and aborts 5% of requests. Each signal
is read where a canary judge would read it: the client's tokens per second and status codes,
and SGLang's /metrics histograms. The factors are larger than a canary's thresholds so that a
loaded machine's jitter, which lands on every server alike, cannot hide them. All figures are
simulated.

The logprobs test: `/generate` with `return_logprob` answers in SGLang 0.5.23's shape, and
outputs=near differs from the baseline only where the baseline's second choice is a near tie,
while outputs=changed answers tokens the baseline ranks far below its own.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_fleet.rollout.judge import logprob_gap
from sglang_fleet.rollout.window import answer_of, server_release
from sglang_fleet.testfleet.local import start_sim, wait_for

pytestmark = pytest.mark.integration

READY = "The server is fired up and ready to roll!"
FLAGS = ("--tp-size", "8", "--enable-metrics", "--attention-backend", "triton")
SLOWER = "decode=0.5,errors=0.05,outputs=changed"
LATER = "ttft=2,itl=5,aborts=0.05"
REQUESTS, CONCURRENCY = 40, 8
# 41 tokens: 40 intervals, of which the 20th and the 40th are the tail's (5%).
TOKENS = 41
PROBES = ("What is 2+2?", "Name a colour.", "Say hello.")


@contextlib.contextmanager
def sims(tmp_path, regressions: dict[str, str], flags=FLAGS, gpus: int = 8):
    """Simulated servers by name, each with its SGLANG_SIM_REGRESS, ready; stopped after."""
    started = {}
    try:
        for name, regress in regressions.items():
            started[name] = start_sim(tmp_path / name, *flags, gpus=gpus,
                                      env={"SGLANG_SIM_REGRESS": regress})
        for sim in started.values():
            wait_for(lambda s=sim: READY in s.log() or s.proc.poll() is not None, timeout=90)
            assert READY in sim.log(), sim.log()[-3000:]
        yield started
    finally:
        for sim in started.values():
            sim.stop()


@pytest.fixture
def servers(tmp_path):
    with sims(tmp_path, {"baseline": "", "slower": SLOWER, "later": LATER}) as started:
        yield started


def chat_stream(url: str, i: int) -> dict:
    """One streaming chat request: its status, when each content chunk came, and how it ended."""
    body = {"messages": [{"role": "user", "content": f"request {i}"}], "max_tokens": TOKENS,
            "stream": True, "temperature": 0}
    arrivals, finish = [], None
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=60) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "body": r.json()}
        for line in r.iter_lines(decode_unicode=True):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice["delta"].get("content"):
                arrivals.append(time.monotonic())
            finish = choice["finish_reason"] or finish
    return {"status": 200, "arrivals": arrivals, "finish": finish}


def load(url: str) -> list[dict]:
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(lambda i: chat_stream(url, i), range(REQUESTS)))


def greedy(url: str, prompt: str) -> str:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    r = requests.post(url + "/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["text"]


def decode_rate(result: dict) -> float:
    """The client's tokens per second after the first token."""
    arrivals = result["arrivals"]
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def histogram(metrics: str, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram's buckets, summed over its series."""
    counts: dict[float, float] = {}
    for le, value in re.findall(rf'^{name}_bucket{{.*le="([^"]+)"}} (\S+)$', metrics, re.M):
        counts[float(le)] = counts.get(float(le), 0.0) + float(value)
    return sorted(counts.items())


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile: linear within the bucket that holds the rank."""
    rank, lower, below = q * buckets[-1][1], 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    raise AssertionError("empty histogram")


def share_above(bound: float, buckets: list[tuple[float, float]]) -> float:
    """The share of observations above `bound` (a bucket's upper bound)."""
    total = buckets[-1][1]
    return (total - dict(buckets)[bound]) / total


def mean(metrics: str, name: str) -> float:
    total = sum(map(float, re.findall(rf"^{name}_sum{{.*}} (\S+)$", metrics, re.M)))
    count = sum(map(float, re.findall(rf"^{name}_count{{.*}} (\S+)$", metrics, re.M)))
    return total / count


def aborted_total(metrics: str) -> float:
    found = re.search(r"^sglang:num_aborted_requests_total{.*} (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_each_regression_shows_where_a_canary_judge_looks(servers):
    baseline, slower = servers["baseline"], servers["slower"]
    # Greedy probes first, twice each: the same prompt answers alike on one server, and the
    # changed server answers otherwise (these are its requests 1-6: no error strikes them).
    for prompt in PROBES:
        assert greedy(baseline.url, prompt) == greedy(baseline.url, prompt)
        changed = greedy(slower.url, prompt)
        assert changed == greedy(slower.url, prompt) != greedy(baseline.url, prompt)
    with ThreadPoolExecutor(3) as pool:
        runs = dict(zip(servers, pool.map(load, (s.url for s in servers.values())),
                        strict=True))
    metrics = {name: requests.get(sim.url + "/metrics", timeout=10).text
               for name, sim in servers.items()}

    # errors=0.05: 5% of requests are SGLang's internal-error 500; nothing else fails.
    failed = [r for r in runs["slower"] if r["status"] != 200]
    assert len(failed) == REQUESTS // 20
    assert {json.dumps(r["body"], sort_keys=True) for r in failed} == {json.dumps(
        {"object": "error", "message": "Internal error (simulated: SGLANG_SIM_REGRESS errors)",
         "type": "500", "param": None, "code": 500}, sort_keys=True)}
    assert all(r["status"] == 200 for name in ("baseline", "later") for r in runs[name])

    # aborts=0.05: 5% end with finish_reason abort, and /metrics counts them.
    finishes = {name: [r["finish"] for r in run if r["status"] == 200]
                for name, run in runs.items()}
    assert finishes["later"].count("abort") == REQUESTS // 20
    assert aborted_total(metrics["later"]) == REQUESTS // 20
    assert set(finishes["baseline"]) == set(finishes["slower"]) == {"length"}
    assert aborted_total(metrics["baseline"]) == 0

    # decode=0.5: the client's tokens per second halve.
    rates = {name: statistics.median(decode_rate(r) for r in run
                                     if r["status"] == 200 and r["finish"] == "length")
             for name, run in runs.items()}
    assert 0.4 < rates["slower"] / rates["baseline"] < 0.65, rates

    # ttft=2: the mean first-token latency doubles, less the delay that load adds to both
    # alike (a p99 of 40 requests is their slowest one: load decides it, not the factor).
    ttft = "sglang:time_to_first_token_seconds"
    assert 1.25 < mean(metrics["later"], ttft) / mean(metrics["baseline"], ttft) < 2.2

    # itl=5: 5% of intervals take five times as long (about 78 ms: the 0.08 s bucket), which
    # moves the tail a canary judge reads (the share past 60 ms, hence the p99) while the mean
    # moves only by that share (1 + 0.05 * 4 = 1.2). A loaded machine's late wake-ups reach
    # 60 ms in far fewer of the baseline's intervals.
    itl = "sglang:inter_token_latency_seconds"
    tail = {name: share_above(0.06, histogram(metrics[name], itl))
            for name in ("baseline", "later")}
    assert tail["later"] > 0.035 and tail["later"] - tail["baseline"] > 0.025, tail
    assert quantile(0.99, histogram(metrics["later"], itl)) > 0.06
    assert mean(metrics["later"], itl) / mean(metrics["baseline"], itl) < 1.35


def test_a_bad_value_ends_the_simulator_at_start_naming_it(tmp_path):
    sim = start_sim(tmp_path, *FLAGS, env={"SGLANG_SIM_REGRESS": "decode=0.8,erors=0.05"})
    try:
        assert sim.proc.wait(60) == 1
    finally:
        sim.stop()
    assert ("ValueError: SGLANG_SIM_REGRESS='decode=0.8,erors=0.05': unknown item "
            "'erors=0.05'; use decode=F") in sim.log()


LOGPROB_TOKENS, TOP = 20, 5


@pytest.fixture
def logprob_servers(tmp_path):
    with sims(tmp_path, {"baseline": "", "near": "outputs=near", "changed": "outputs=changed"},
              ("--tp-size", "1", "--attention-backend", "triton"), gpus=1) as started:
        yield started


def generate(url: str, **extra) -> dict:
    body = {"text": "Name a colour.", "sampling_params": {"max_new_tokens": LOGPROB_TOKENS,
                                                          "temperature": 0}, **extra}
    r = requests.post(url + "/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_logprobs_in_0_5_23s_shape_and_near_ties_flipped(logprob_servers):
    base_url, near_url = logprob_servers["baseline"].url, logprob_servers["near"].url
    assert server_release(base_url, None) == "0.5.23"  # what the judge asks each server
    plain = generate(base_url)
    assert not any("logprob" in key for key in plain["meta_info"])  # only when asked

    body = generate(base_url, return_logprob=True, top_logprobs_num=TOP)
    meta = body["meta_info"]
    # add_logprob_to_meta_info's fields, in its order; logprob_start_len -1: no prompt rows.
    keys = list(meta)
    assert keys[keys.index("input_token_logprobs"):keys.index("output_top_logprobs") + 1] == [
        "input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length",
        "input_top_logprobs", "output_top_logprobs"]
    assert meta["input_token_logprobs"] == meta["input_top_logprobs"] == []
    chosen, top = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert meta["output_token_logprobs_length"] == len(chosen) == len(top) == LOGPROB_TOKENS
    assert [e[1] for e in chosen] == body["output_ids"]
    assert all(e[2] is None and isinstance(e[0], float) for e in chosen)  # no text asked
    for (logprob, token, _), row in zip(chosen, top, strict=True):
        assert len(row) == TOP and [e[1] for e in row][0] == token and row[0][0] == logprob
        assert [e[0] for e in row] == sorted((e[0] for e in row), reverse=True)
        assert 0 < row[0][0] - row[1][0] < 0.5  # the near tie
        assert row[1][0] - row[2][0] > 5  # the rest far below
    texted = generate(base_url, return_logprob=True, return_text_in_logprobs=True)
    assert "output_top_logprobs" not in texted["meta_info"]  # top_logprobs_num 0
    assert texted["meta_info"]["output_token_logprobs"][1][2] == " tok1"

    baseline = answer_of(body)
    near = answer_of(generate(near_url, return_logprob=True, top_logprobs_num=TOP))
    assert near == answer_of(generate(near_url, return_logprob=True, top_logprobs_num=TOP))
    differ = [k for k, (a, b) in enumerate(zip(near.token_ids, baseline.token_ids,
                                               strict=True)) if a != b]
    assert differ == [3, 11, 19]
    # Each differing token is the baseline's second choice there, a near tie.
    assert all(near.token_ids[k] == list(baseline.top[k])[1] for k in differ)
    at, gap = logprob_gap(near, baseline)
    assert at == 3 and 0 < gap < 0.5

    changed = answer_of(generate(logprob_servers["changed"].url, return_logprob=True,
                                 top_logprobs_num=TOP))
    at, gap = logprob_gap(changed, baseline)
    assert at == 0 and gap > 5
