"""The canary's plan, its Prometheus readings and its judgement, signal by signal."""

from __future__ import annotations

import pytest

from sglang_fleet.rollout.judge import FAILED, INCONCLUSIVE, PASSED, Answer, Side, judge
from sglang_fleet.rollout.metrics import Histogram, ServerSample, router_outcomes, server_sample
from sglang_fleet.rollout.plan import MAX_PROBES, plan_from_vars
from sglang_fleet.rollout.targets import canary_targets
from sglang_fleet.rollout.window import answer_of

PLAN = plan_from_vars({})[0]
TTFT_BOUNDS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, float("inf"))
ITL_BOUNDS = (0.010, 0.015, 0.020, 0.025, 0.030, 0.040, float("inf"))


def histogram(bounds, values) -> Histogram:
    return Histogram({le: float(sum(v <= le for v in values)) for le in bounds},
                     float(sum(values)), float(len(values)))


def side(requests=100, aborted=0, ttft=0.15, itl=0.016, slow_tail=1.0, failures=0,
         outputs=None, probes=0, release=None) -> Side:
    itls = [itl * (slow_tail if i % 20 == 19 else 1.0) for i in range(2000)]
    sample = ServerSample(float(requests + probes), float(aborted),
                          histogram(TTFT_BOUNDS, [ttft] * requests), histogram(ITL_BOUNDS, itls))
    return Side(sample, router_success=float(requests - failures),
                router_failure=float(failures), probes_sent=probes,
                outputs={p: a if isinstance(a, Answer) else Answer(a)
                         for p, a in (outputs or {"p": " tok0 tok1"}).items()},
                release=release)


@pytest.mark.parametrize("canary, signal", [
    (side(failures=5), "error rate"),
    (side(outputs={"p": " tok1 tok2"}), "greedy outputs"),
    (side(aborted=5), "abort rate"),
    (side(itl=0.016 / 0.8), "generation tokens/s"),
    (side(ttft=0.15 * 1.3), "p99 time to first token"),
    (side(slow_tail=1.6), "p99 inter-token latency"),
])
def test_each_regression_fails_the_canary_on_its_own_signal(canary, signal):
    result = judge(canary, [side(), side()], PLAN)
    assert result["verdict"] == FAILED and not result["passed"]
    assert result["decided_by"] == signal
    assert result["message"].startswith(f"failed on {signal}: canary ")
    assert "over 300 s of live traffic (canary 100 requests, baseline 200)" in result["message"]


def test_a_canary_like_its_baseline_passes_every_signal():
    result = judge(side(), [side(), side()], PLAN)
    assert result["verdict"] == PASSED and result["passed"]
    assert not any(s["failed"] for s in result["signals"])


def test_p99s_in_one_bucket_are_told_apart_by_their_means():
    # 0.15 s and 0.195 s both sit in SGLang's 0.1-0.2 s bucket: the p99s are equal there.
    ttft = next(s for s in judge(side(ttft=0.195), [side()], PLAN)["signals"]
                if s["signal"] == "p99 time to first token")
    assert ttft["failed"] and ttft["canary"] == pytest.approx(0.195)
    assert "both p99s in the 0.1-0.2 s bucket: means compared" in ttft["note"]


def test_too_little_live_traffic_is_inconclusive_never_passed():
    result = judge(side(requests=5, probes=40), [side()], PLAN)
    assert result["verdict"] == INCONCLUSIVE and not result["passed"]
    assert "canary got fewer than 20 live requests" in result["message"]
    # A latency regression is not believed on five requests...
    assert judge(side(requests=5, ttft=1.0), [side()], PLAN)["verdict"] == INCONCLUSIVE
    # ...but what the judge's own probes measured still decides.
    changed = judge(side(requests=5, outputs={"p": "other"}), [side()], PLAN)
    assert changed["verdict"] == FAILED and changed["decided_by"] == "greedy outputs"


def test_no_baseline_is_inconclusive():
    assert judge(side(), [], PLAN)["verdict"] == INCONCLUSIVE


def test_baselines_that_disagree_leave_the_outputs_unjudged():
    result = judge(side(outputs={"p": "a"}), [side(outputs={"p": "a"}),
                                              side(outputs={"p": "b"})], PLAN)
    outputs = next(s for s in result["signals"] if s["signal"] == "greedy outputs")
    assert outputs["failed"] is None and "answer the probes differently" in outputs["note"]


def greedy(tokens) -> Answer:
    """An answer whose server ranks, at position k, token k first (-0.6), the near tie
    100000+k second (-0.8, 0.2 nat below) and k+1 far below (-7.0); its tokens are `tokens`."""
    return Answer("".join(f" tok{t}" for t in tokens), tuple(tokens), (-0.6,) * len(tokens),
                  tuple({k: -0.6, 100000 + k: -0.8, k + 1: -7.0} for k in range(len(tokens))))


BASELINE, NEAR, FAR, UNRANKED = [0, 1, 2, 3], [0, 1, 2, 100003], [1, 2, 3, 4], [0, 999, 2, 3]


def outputs_signal(canary_tokens, canary_release, baseline_release="0.5.4.post3"):
    result = judge(side(outputs={"p": greedy(canary_tokens)}, release=canary_release),
                   [side(outputs={"p": greedy(BASELINE)}, release=baseline_release)] * 2, PLAN)
    return next(s for s in result["signals"] if s["signal"] == "greedy outputs")


def test_one_release_compares_the_tokens_exactly_a_near_tie_too():
    near = outputs_signal(NEAR, "0.5.4.post3")
    assert near["failed"] and near["canary"] == 1.0
    assert near["note"].startswith("compared exactly (both on 0.5.4.post3); 1 of 1 prompts "
                                   "differ, e.g. 'p': ' tok0 tok1 tok2 tok100003' against")
    assert not outputs_signal(BASELINE, "0.5.4.post3")["failed"]
    unknown = outputs_signal(NEAR, None)  # a release not known: exact
    assert unknown["failed"] and unknown["note"].startswith("compared exactly (a release not")


def test_across_releases_a_near_tie_is_equivalent():
    near = outputs_signal(NEAR, "0.5.23")
    assert near["failed"] is False and near["canary"] == 0.0
    assert near["note"] == (
        "releases differ (canary 0.5.23, baseline 0.5.4.post3): compared by log-probability "
        "distance; 1 of 1 prompts differ, 0 by more than 1 nat, e.g. 'p' at token 3: the "
        "baseline ranks the canary's token 0.20 nat below its own")


@pytest.mark.parametrize("tokens, says", [
    (FAR, "at token 0: the baseline ranks the canary's token 6.40 nat below its own"),
    (UNRANKED, "at token 1: the baseline ranks the canary's token outside its top logprobs"),
])
def test_across_releases_a_real_change_still_fails(tokens, says):
    changed = outputs_signal(tokens, "0.5.23")
    assert changed["failed"] and changed["canary"] == 1.0
    assert "1 of 1 prompts differ, 1 by more than 1 nat" in changed["note"]
    assert says in changed["note"]


def test_across_releases_answers_without_logprobs_are_compared_by_their_text():
    result = judge(side(outputs={"p": "a"}, release="0.5.23"),
                   [side(outputs={"p": "b"}, release="0.5.4.post3")], PLAN)
    assert result["decided_by"] == "greedy outputs"
    assert "outside its top logprobs" in result["message"]


def test_a_tighter_gap_fails_the_near_tie_too():
    plan = plan_from_vars({"sglang_bench_canary_max_logprob_gap": 0.1})[0]
    result = judge(side(outputs={"p": greedy(NEAR)}, release="0.5.23"),
                   [side(outputs={"p": greedy(BASELINE)}, release="0.5.4.post3")], plan)
    assert result["decided_by"] == "greedy outputs"
    assert "0.20 nat below its own" in result["message"]


def test_a_generate_answer_in_0_5_23s_shape_is_read_with_its_logprobs():
    body = {"text": " tok0 tok100001", "output_ids": [0, 100001], "meta_info": {
        "id": "x", "input_token_logprobs": [],
        "output_token_logprobs": [[-0.6, 0, None], [-0.6, 100001, None]],
        "output_token_logprobs_length": 2, "input_top_logprobs": [],
        "output_top_logprobs": [[[-0.6, 0, None], [-0.8, 100000, None]],
                                [[-0.6, 100001, None], [-0.8, 1, None]]]}}
    assert answer_of(body) == Answer(" tok0 tok100001", (0, 100001), (-0.6, -0.6),
                                     ({0: -0.6, 100000: -0.8}, {100001: -0.6, 1: -0.8}))
    assert answer_of({"text": "hi", "meta_info": {}}) == Answer("hi")


@pytest.mark.parametrize("variable, value, says", [
    ("max_ttft_p99_ratio", 1.0, "above 1"),
    ("max_itl_p99_ratio", float("inf"), "infinity could never fail"),
    ("min_tokens_ratio", 0, "0 could never fail"),
    ("max_error_increase", 1, "1 or more could never fail"),
    ("max_output_mismatch", 1.0, "1 could never fail"),
    ("max_logprob_gap", 0, "a finite number of nats above 0"),
    ("max_logprob_gap", float("inf"), "infinity could never fail"),
    ("max_logprob_gap", "nan", "a finite number of nats above 0"),
    ("max_logprob_gap", "near", "is not a number"),
    ("max_abort_increase", "lots", "is not a number"),
    ("window", 0, "positive finite number of seconds"),
    ("min_requests", 2.5, "positive whole number"),
    ("probes", [], "give 1 to 64 prompts"),
    ("probes", ["x"] * (MAX_PROBES + 1), "has 65 prompts"),
    ("probes", ["ok", ""], "non-empty prompt strings"),
])
def test_a_plan_that_could_not_judge_is_refused_naming_the_variable(variable, value, says):
    plan, problems = plan_from_vars({f"sglang_bench_canary_{variable}": value})
    assert plan is None and len(problems) == 1
    assert problems[0].startswith(f"sglang_bench_canary_{variable}=") or \
        problems[0].startswith(f"sglang_bench_canary_{variable} has")
    assert says in problems[0]


def test_prometheus_text_in_sglangs_and_the_routers_shapes():
    text = "\n".join([
        "# HELP sglang:num_requests_total Number of requests processed.",
        "# TYPE sglang:num_requests_total counter",
        'sglang:num_requests_total{model_name="m",is_streaming="true"} 30.0',
        'sglang:num_requests_total{model_name="m",is_streaming="false"} 12.0',
        "# TYPE sglang:num_aborted_requests_total counter",
        'sglang:num_aborted_requests_total{model_name="m"} 2.0',
        "# TYPE sglang:time_to_first_token_seconds histogram",
        'sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 10.0',
        'sglang:time_to_first_token_seconds_bucket{le="0.2",model_name="m"} 40.0',
        'sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 42.0',
        'sglang:time_to_first_token_seconds_sum{model_name="m"} 6.3',
        'sglang:time_to_first_token_seconds_count{model_name="m"} 42.0',
        "# TYPE smg_worker_cb_outcomes_total counter",
        'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:3000",outcome="success"} 97',
        'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:3000",outcome="failure"} 3',
        ""])
    sample = server_sample(text)
    assert (sample.requests, sample.aborted) == (42.0, 2.0)
    assert sample.ttft.count == 42.0 and sample.ttft.buckets[0.2] == 40.0
    assert sample.ttft.quantile(0.5)[1:] == (0.1, 0.2)
    assert sample.minus(sample).requests == 0.0
    assert router_outcomes(text) == {"http://127.0.0.1:3000": {"success": 97.0, "failure": 3.0}}


def _server(port: int, model: str = "/models/kimi", pd: str | None = None) -> dict:
    spec = {"http": {"port": port}, "group": {"serves_http": True},
            "settings": {"sglang_server_host": "0.0.0.0", "sglang_server_model_path": model}}
    return {"ansible_host": f"10.0.0.{port - 30000}", "sglang_server_launch_spec":
            {**spec, "pd": {"mode": pd} if pd else None}}


def test_the_baseline_is_the_other_servers_behind_the_canarys_routers():
    from sglang_fleet.rollout.targets import canary_problem, canary_targets

    hostvars = {"n1": _server(30001), "n2": _server(30002), "n3": _server(30003),
                "other": _server(30004, "/models/llama"),
                "r1": {"sglang_router_workers_group": "kimi",
                       "sglang_router__spec": {"metrics_url": "http://10.0.0.9:29000"}}}
    groups = {"sglang_servers": ["n1", "n2", "n3", "other"], "kimi": ["n1", "n2", "n3"],
              "sglang_routers": ["r1"]}
    found = canary_targets("n1", groups, hostvars)
    assert found["canary"] == {"host": "n1", "url": "http://10.0.0.1:30001", "release": None,
                               "worker_url": "http://10.0.0.1:30001"}
    assert [b["host"] for b in found["baselines"]] == ["n2", "n3"]
    assert found["router_metrics"] == ["http://10.0.0.9:29000"]
    # A batch leaves out the servers this run deployed already.
    assert [b["host"] for b in canary_targets("n2", groups, hostvars, ["n1", "n2"])[
        "baselines"]] == ["n3"]
    # Without a router: the other servers of the same model.
    no_router = {k: v for k, v in groups.items() if k != "sglang_routers"}
    assert [b["host"] for b in canary_targets("n1", no_router, hostvars)["baselines"]] == \
        ["n2", "n3"]
    assert canary_problem("n1", hostvars) is None
    hostvars["n1"] = _server(30001, pd="decode")
    assert "decode server of a PD deployment" in canary_problem("n1", hostvars)
    # Not the canary, but a later batch's server, judged alone like it.
    later = canary_problem("n1", hostvars, canary=False)
    assert later.startswith("n1 is a decode server of a PD deployment, and with "
                            "sglang_fleet_canary set each later batch's servers are judged")
    assert "Fix: leave the PD deployment out of this run (--limit)" in later


def test_each_target_carries_the_release_its_launchspec_pins():
    def spec(port, version):
        return {"sglang_server_launch_spec": {
            "sglang_version": version, "http": {"port": port}, "group": {"serves_http": True},
            "settings": {"sglang_server_model_path": "m"}}}
    hostvars = {"a": spec(30000, "0.5.23"), "b": spec(30001, "0.5.4.post3")}
    targets = canary_targets("a", {"sglang_servers": ["a", "b"]}, hostvars)
    assert targets["canary"]["release"] == "0.5.23"
    assert [(t["host"], t["release"]) for t in targets["baselines"]] == [("b", "0.5.4.post3")]


def test_a_p99_made_of_a_few_slow_requests_is_not_believed():
    base = side(ttft=0.19)  # every first token in SGLang's 0.1-0.2 s bucket
    # Three slow first tokens of a hundred (a loaded machine): the canary's p99 lands in the
    # next bucket, but three past the baseline's p99 is what 1% gives by chance (8%).
    unlucky = side(ttft=0.19)
    unlucky.sample.ttft = histogram(TTFT_BOUNDS, [0.19] * 97 + [0.3] * 3)
    ttft = next(s for s in judge(unlucky, [base], PLAN)["signals"]
                if s["signal"] == "p99 time to first token")
    assert ttft["canary"] / ttft["baseline"] > 1.15 and ttft["failed"] is False
    assert "3 of the canary's 100 past the baseline's p99 bucket (above 0.2 s)" in ttft["note"]
    assert ttft["note"].endswith("not believed")
    # Every first token later: believed.
    slower = judge(side(ttft=0.25), [base], PLAN)
    assert slower["decided_by"] == "p99 time to first token"
    assert "100 of the canary's 100 past" in slower["message"]


def test_errors_only_the_probes_see_fail_the_canary_and_one_error_is_not_believed():
    # Streamed live requests that SGLang failed after their 200 are successes to the router:
    # the probes' own share decides, not diluted by the router's count.
    canary = side(probes=40)
    canary.probes_failed = 2
    result = judge(canary, [side(probes=40)], PLAN)
    assert result["decided_by"] == "error rate"
    errors = result["signals"][0]
    assert errors["canary"] == pytest.approx(0.05)
    assert errors["note"] == "the probes: 2 of the canary's 40 failed"
    canary.probes_failed = 1
    errors = judge(canary, [side(probes=40)], PLAN)["signals"][0]
    assert errors["failed"] is False and errors["note"].endswith("(fewer than 2: not believed)")


def test_a_tail_that_grows_inside_the_baselines_p99_bucket_fails_the_canary():
    # A loaded machine puts 2% of the baseline's intervals past 20 ms, so its p99 is in the
    # 20-25 ms bucket; the canary's slowest 5% (x1.3) land in the same bucket. The means
    # barely move; the share past 20 ms more than doubles.
    def itl(extra: int) -> ServerSample:
        values = [0.0157] * (2000 - 40 - extra) + [0.021] * 40 + [0.0204] * extra
        return ServerSample(100.0, 0.0, histogram(TTFT_BOUNDS, [0.15] * 100),
                            histogram(ITL_BOUNDS, values))
    canary, base = side(), side()
    canary.sample, base.sample = itl(100), itl(0)
    found = next(s for s in judge(canary, [base], PLAN)["signals"]
                 if s["signal"] == "p99 inter-token latency")
    assert found["failed"] and found["canary"] / found["baseline"] < 1.15
    assert "past 0.02 s 7.0% of the canary's against 2.0% of the baseline's" in found["note"]
    assert found["note"].endswith("the tail at least doubled, FAILED")
    same = side()
    same.sample = itl(0)
    assert not judge(same, [base], PLAN)["signals"][-1]["failed"]
