"""sglang-sim behaves like SGLang 0.5.23 from outside: log, processes, GPUs, HTTP, failures.

Every expectation here is SGLang 0.5.23's own (the source locations are named in the
simulator's modules); the simulator is only what runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

from sglang_fleet.known.models import known_models
from sglang_fleet.node.gpu.gpu import gpu_snapshot
from sglang_fleet.node.process import procs
from sglang_fleet.testfleet.local import free_port_block, http_status, start_sim, wait_for

pytestmark = pytest.mark.integration

GB = 1024**3
READY = "The server is fired up and ready to roll!"
TS = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"  # the start of every logged line


def in_order(lines: list[str], patterns: list[str]) -> None:
    """Each pattern matches a line after the previous pattern's line."""
    position = 0
    for pattern in patterns:
        regex = re.compile(pattern)
        for i in range(position, len(lines)):
            if regex.search(lines[i]):
                position = i + 1
                break
        else:
            pytest.fail(f"{pattern!r} not found after line {position}:\n"
                        + "\n".join(lines[max(0, position - 5):position + 40]))


def ready(sim, timeout: float = 90) -> None:
    """Wait for the ready line; fail at once, with the log, if the server ended instead."""
    wait_for(lambda: READY in sim.log() or sim.proc.poll() is not None, timeout=timeout)
    assert READY in sim.log(), sim.log()[-3000:]


def server_args(log: str) -> dict:
    line = next(x for x in log.splitlines() if " server_args={" in x)
    return ast.literal_eval(line.split("server_args=", 1)[1])


def titles(sim) -> list[str]:
    return sorted(p["cmdline"] for p in procs.deployment_processes(sim.marker)
                  if p["cmdline"].startswith("sglang::"))


def by_title(sim) -> dict[str, dict]:
    return {p["cmdline"]: p for p in procs.deployment_processes(sim.marker)}


@pytest.fixture
def launch(tmp_path):
    """start_sim in this test's folder; whatever it started is stopped afterwards, pass or
    fail, so no test leaves a process behind."""
    started = []

    def start(*flags, **kwargs):
        sim = start_sim(tmp_path / f"server-{len(started)}", *flags, **kwargs)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


# --- the default: Kimi-K2.5 (MLA) at TP=8 on SM120 ----------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sim = start_sim(tmp_path_factory.mktemp("sim"), "--tp-size", "8", "--enable-metrics",
                    "--attention-backend", "triton")
    ready(sim)
    yield sim
    sim.stop()


DEFAULT_STARTUP = [
    TS + r"\] server_args=\{'model_path': ",
    TS + r" TP0\] Init parallel begin\.$",
    TS + r" TP0\] Init parallel ends\. elapsed=\d+\.\d\d s$",
    TS + r" TP0\] Memory baseline taken\. mem usage=0\.25 GB$",
    TS + r" TP0\] Load weight begin\. avail mem=95\.34 GB$",
    r"^Multi-thread loading shards:\s+\d+% Completed \| \d+/64 \[\d\d:\d\d<",
    TS + r" TP0\] Load weight end\. elapsed=\d+\.\d\d s, type=DeepseekV3ForCausalLM, "
    r"avail mem=\d+\.\d\d GB, mem usage=73\.40 GB\.$",
    TS + r" TP0\] KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: 812345, "
    r"KV size: 9\.87 GB$",
    TS + r" TP0\] Memory pool end\. avail mem=\d+\.\d\d GB$",
    TS + r" TP0\] Capture target prefill CUDA graph begin\. backend=breakable, "
    r"num_tokens=\[4, 8, 12, .*, 8192\], avail mem=\d+\.\d\d GB$",
    r"Capturing prefill shape \(num_tokens=\d+ avail_mem=\d+\.\d\d GB\):\s+\d+%\|",
    TS + r" TP0\] Capture target prefill CUDA graph end\. elapsed=\d+\.\d\d s, "
    r"mem usage=0\.31 GB, avail mem=\d+\.\d\d GB\.$",
    TS + r" TP0\] Capture target decode CUDA graph begin\. backend=full, num_tokens_per_req=1, "
    r"avail mem=\d+\.\d\d GB$",
    r"Capturing batches \(bs=512 avail_mem=\d+\.\d\d GB\):\s+\d+%\|",
    TS + r" TP0\] Capture target decode CUDA graph end\. bs=\[1, 2, 4, 8, 12, 16, 24, .*, 496, "
    r"512\], elapsed=\d+\.\d\d s, mem usage=0\.95 GB, avail mem=\d+\.\d\d GB\.$",
    TS + r" TP0\] max_total_num_tokens=812345, chunked_prefill_size=8192, "
    r"max_prefill_tokens=16384, max_running_requests=2048, context_len=262144, "
    r"available_gpu_mem=\d+\.\d\d GB$",
    # engine.py _set_startup_time: the slowest rank's times
    TS + r"\] Engine startup timings \(s\): load_weight=\d+\.\d\d, kv_cache_allocation="
    r"\d+\.\d\d, scheduler_e2e=\d+\.\d\d, cuda_graph=\{prefill=\d+\.\d\d, decode=\d+\.\d\d, "
    r"target_verify=0\.00, draft_prefill=0\.00, draft_decode=0\.00, draft_extend=0\.00\}, "
    r"tokenizer_e2e=\d+\.\d\d$",
    TS + r"\] INFO:     Started server process \[\d+\]$",
    TS + r"\] INFO:     Waiting for application startup\.$",
    TS + r"\] INFO:     Application startup complete\.$",
    TS + r"\] INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ \(Press CTRL\+C to quit\)$",
    r'\] INFO:     127\.0\.0\.1:\d+ - "GET /model_info HTTP/1\.1" 200 OK$',
    TS + r" TP0\] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: "
    r"0\.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: True, "
    r"input throughput \(token/s\): \d+\.\d\d$",
    r'"POST /generate HTTP/1\.1" 200 OK$',
    r'"POST /freeze_gc HTTP/1\.1" 200 OK$',
    TS + r"\] " + re.escape(READY) + "$",
]


def test_startup_log_follows_sglang_order(server):
    in_order(server.lines(), DEFAULT_STARTUP)
    assert "\r" in server.log(), "0.5.23 redraws tqdm bars with carriage returns"
    assert "Loading safetensors checkpoint shards" not in server.log()


def test_server_args_is_logged_as_the_resolved_dict(server):
    args = server_args(server.log())
    assert args["tp_size"] == 8 and args["port"] == server.port
    assert args["served_model_name"] == "Kimi-K2.5" and args["attention_backend"] == "triton"
    assert args["chunked_prefill_size"] == 8192, "resolved from the GPU's memory"
    assert args["api_key"] is None


def test_worker_processes_are_titled_like_sglang_and_carry_the_marker(server):
    expected = sorted([f"sglang::scheduler_TP{i}" for i in range(8)] + ["sglang::detokenizer"])
    assert titles(server) == expected
    members = procs.deployment_processes(server.marker)
    assert any("sglang_fleet.sim.launch_server" in p["cmdline"] for p in members)
    assert {p["ppid"] for p in members if p["cmdline"].startswith("sglang::")} == {
        server.proc.pid}


def test_schedulers_hold_their_gpu_and_its_memory(server):
    members = by_title(server)
    snap = gpu_snapshot("simulated", str(server.gpu_dir))
    for i in range(8):
        pid = members[f"sglang::scheduler_TP{i}"]["pid"]
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert str(server.gpu_dir / f"nvidia{i}") in held
        assert snap[i]["processes"] == [{"pid": pid, "used_memory": snap[i]["memory_used"]}]
        # weights 73.40 + KV 9.87 + prefill graphs 0.31 + decode graphs 0.95 GB
        assert 84 * GB < snap[i]["memory_used"] < 85 * GB


def test_status_and_info_endpoints(server):
    for path in ("/health", "/health_generate", "/ready", "/ping"):
        r = requests.get(server.url + path, timeout=30)
        assert (r.status_code, r.content) == (200, b""), path
    info = requests.get(server.url + "/model_info", timeout=5).json()
    assert info["served_model_name"] == "Kimi-K2.5" and info["is_generation"] is True
    assert info["architectures"] == ["DeepseekV3ForCausalLM"]
    assert {"weight_version", "load_format", "tokenizer_path"} <= set(info)
    assert requests.get(server.url + "/get_model_info", timeout=5).status_code == 200
    sinfo = requests.get(server.url + "/server_info", timeout=5).json()
    assert sinfo["version"] == "0.5.23" and sinfo["tp_size"] == 8 and sinfo["simulated"]
    assert "last_gen_throughput" in sinfo["internal_states"][0]
    models = requests.get(server.url + "/v1/models", timeout=5).json()
    card = models["data"][0]
    assert models["object"] == "list" and card["id"] == card["root"] == "Kimi-K2.5"
    assert card["owned_by"] == "sglang" and card["max_model_len"] == 262144
    one = requests.get(server.url + "/v1/models/Kimi-K2.5", timeout=5)
    assert one.status_code == 200 and one.json()["id"] == "Kimi-K2.5"
    missing = requests.get(server.url + "/v1/models/other", timeout=5)
    assert missing.status_code == 404
    assert missing.json()["error"] == {"message": "The model 'other' does not exist",
                                       "type": "invalid_request_error", "param": "model",
                                       "code": "model_not_found"}


def test_metrics_carry_sglangs_families_and_labels(server):
    requests.post(server.url + "/generate", json={"text": "count me",
                                                  "sampling_params": {"max_new_tokens": 3}},
                  timeout=30)
    text = requests.get(server.url + "/metrics", timeout=5).text
    labels = ('{model_name="Kimi-K2.5",engine_type="unified",tp_rank="0",pp_rank="0",'
              'moe_ep_rank="0"}')
    for family in ("num_running_reqs", "num_queue_reqs", "token_usage", "gen_throughput",
                   "max_total_num_tokens", "kv_available_tokens", "context_len"):
        assert re.search(rf"^sglang:{family}{re.escape(labels)} \d+(\.\d+)?(e[+-]\d+)?$", text,
                         re.M), family
    assert "# TYPE sglang:num_queue_reqs gauge\n" in text
    assert "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n" in text
    assert re.search(r'^sglang:num_requests_total\{model_name="Kimi-K2\.5",engine_type='
                     r'"unified",is_streaming="false"\} [1-9]\d*\.0$', text, re.M)
    assert re.search(r'^sglang:time_to_first_token_seconds_bucket\{model_name="Kimi-K2\.5",'
                     r'engine_type="unified",is_streaming="false",le="\+Inf"\} [1-9]', text, re.M)
    assert re.search(r'^sglang:graph_memory_usage_gb\{.*,phase="decode"\} 0\.95$', text, re.M)


def test_server_info_has_the_schedulers_state(server):
    info = requests.get(server.url + "/server_info", timeout=10).json()
    assert info["status"] == "ready" and info["version"] == "0.5.23"
    assert info["max_total_num_tokens"] == 812345
    assert info["max_req_input_len"] == 262138  # min(context - 1, pool - 1) - 5
    assert info["launch_command"].startswith("--model-path ")
    assert info["tp_size"] == 8 and info["frontend"] == "python"
    assert set(info["startup_time"]) == {"load_weight", "kv_cache_allocation", "scheduler_e2e",
                                         "cuda_graph", "tokenizer_e2e"}
    (state,) = info["internal_states"]
    assert state["world_size"] == 8 and state["tp_size"] == 8
    assert state["memory_usage"]["weight"] == 73.4 and state["memory_usage"]["kvcache"] == 9.87
    assert state["memory_usage"]["token_capacity"] == 812345
    assert "last_gen_throughput" in state
    assert state["disaggregation_mode"] == "null"
    assert state["decode_cuda_graph_bs"] and all(isinstance(b, int)
                                                 for b in state["decode_cuda_graph_bs"])
    assert state["decode_cuda_graph_memory_gb"] == 0.95  # the decode graphs' memory
    old = requests.get(server.url + "/get_server_info", timeout=10)
    assert old.status_code == 200
    assert "Endpoint '/get_server_info' is deprecated and will be removed in a future version. " \
           "Please use '/server_info' instead." in server.log()


def test_flush_cache_answers_get_and_post(server):
    for method in ("GET", "POST"):
        r = requests.request(method, server.url + "/flush_cache", timeout=5)
        assert r.status_code == 200 and r.text.startswith("Cache flushed.\n")
    assert "TP0] Cache flushed successfully!" in server.log()


def test_generate_refuses_bad_bodies_with_400(server):
    url = server.url + "/generate"
    empty = requests.post(url, json={}, timeout=5)
    assert empty.status_code == 400
    assert empty.json() == {"error": {"message":
                                      "Either text, input_ids or input_embeds should be provided."}}
    broken = requests.post(url, data=b"{bad", timeout=5,
                           headers={"Content-Type": "application/json"})
    body = broken.json()
    assert broken.status_code == 400 and set(body) == {"object", "message", "type", "param",
                                                       "code"}
    assert (body["object"], body["type"], body["param"], body["code"]) == (
        "error", "Bad Request", None, 400)
    assert body["message"].startswith("1 validation error:\n  {'type': 'json_invalid', "
                                      "'loc': ('body', 1), 'msg': 'JSON decode error'")
    assert "Expecting property name enclosed in double quotes" in body["message"]
    not_an_object = requests.post(url, json=["hi"], timeout=5).json()
    assert "Input should be a dictionary or an instance of GenerateReqInput" in (
        not_an_object["message"])
    nothing = requests.post(url, data=b"", timeout=5)
    assert nothing.status_code == 400 and "'type': 'missing'" in nothing.json()["message"]
    assert requests.get(url, timeout=5).status_code == 405
    assert requests.get(server.url + "/no_such_endpoint", timeout=5).json() == {
        "detail": "Not Found"}


def _sse(response):
    return [line[6:] for line in response.iter_lines(decode_unicode=True)
            if line.startswith("data: ")]


META_FIELDS = ["id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions",
               "queue_time", "reasoning_tokens", "completion_tokens", "cached_tokens"]


def test_a_negative_max_new_tokens_is_a_400_or_a_streams_one_error_chunk(server):
    """SamplingParams.verify raises ValueError in the tokenizer manager: serve_generate_request
    (0.5.23) answers 400, or, for a stream whose 200 went out with its StreamingResponse,
    sends the error as the stream's one chunk, then [DONE]."""
    message = "max_new_tokens must be at least 0, got -1."
    body = {"text": "hello", "sampling_params": {"max_new_tokens": -1}}
    plain = requests.post(server.url + "/generate", json=body, timeout=10)
    assert plain.status_code == 400 and plain.json() == {"error": {"message": message}}
    with requests.post(server.url + "/generate", json={**body, "stream": True}, stream=True,
                       timeout=10) as r:
        assert r.status_code == 200
        events = _sse(r)
    assert len(events) == 2 and events[1] == "[DONE]"
    assert json.loads(events[0]) == {"error": {"message": message,
                                               "type": "invalid_request_error", "code": 400,
                                               "retryable": False}}
    assert server.log().count(f"[http_server] Error: {message}") == 2


def test_generate_streams_cumulative_text_then_done(server):
    body = {"input_ids": [1, 2, 3], "stream": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0}}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=30) as r:
        events = _sse(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4]
    assert chunks[2]["text"].startswith(chunks[1]["text"])
    assert list(chunks[0]["meta_info"]) == META_FIELDS  # --enable-metrics adds queue_time
    done = chunks[-1]["meta_info"]
    assert done["finish_reason"] == {"type": "length", "length": 4}
    assert {"e2e_latency", "request_received_ts", "first_token_latency",
            "request_finished_ts", "decode_throughput"} <= set(done)
    assert done["prompt_tokens"] == 3 and done["weight_version"] == "default"


def test_cached_tokens_count_the_radix_cache_hit(server):
    body = {"input_ids": list(range(100, 140)), "sampling_params": {"max_new_tokens": 2}}
    requests.post(server.url + "/flush_cache", timeout=5)
    first = requests.post(server.url + "/generate", json=body, timeout=30).json()
    again = requests.post(server.url + "/generate", json=body, timeout=30).json()
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] == 39, "all but the last prompt token"
    assert re.search(r"TP0\] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 39, ",
                     server.log())


def test_a_long_prompt_is_prefilled_in_chunks_each_logged_as_its_batch(server):
    # --chunked-prefill-size 8192 (the default here): 19900 uncached tokens are three prefill
    # batches; the first has the cache hit, each says what the request still has to prefill.
    prefix = list(range(5000, 5100))
    requests.post(server.url + "/flush_cache", timeout=5)
    requests.post(server.url + "/generate", timeout=30, json={
        "input_ids": prefix, "sampling_params": {"max_new_tokens": 1}})
    out = requests.post(server.url + "/generate", timeout=60, json={
        "input_ids": prefix + [7] * 19900, "sampling_params": {"max_new_tokens": 1}}).json()
    assert out["meta_info"]["cached_tokens"] == 100
    in_order(server.lines(), [
        r"TP0\] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 100, .*"
        r"#running-req: 0, #queue-req: 0, #pending-token: 11708, ",
        r"TP0\] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, .*"
        r"#pending-token: 3516, ",
        r"TP0\] Prefill batch, #new-seq: 1, #new-token: 3516, #cached-token: 0, .*"
        r"#pending-token: 0, "])


def test_a_batch_of_prompts_answers_one_result_per_prompt(server):
    prompts = [[7, 8, 9], [10, 11], [12]]
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 3}}
    results = requests.post(server.url + "/generate", json=body, timeout=30).json()
    assert [r["meta_info"]["prompt_tokens"] for r in results] == [3, 2, 1]
    assert all(r["meta_info"]["completion_tokens"] == 3 and "index" not in r for r in results)
    with requests.post(server.url + "/generate", json={**body, "stream": True}, stream=True,
                       timeout=30) as r:
        events = _sse(r)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and len(chunks) == 9
    for index in range(3):
        mine = [c for c in chunks if c["index"] == index]
        assert [c["meta_info"]["completion_tokens"] for c in mine] == [1, 2, 3]
        assert mine[0]["meta_info"]["prompt_tokens"] == len(prompts[index])
    assert re.search(r"TP0\] Prefill batch, #new-seq: 3, #new-token: 6, ", server.log())


def test_decode_batch_lines_every_40_decode_steps(server):
    body = {"text": "decode lines", "sampling_params": {"max_new_tokens": 90}}
    assert requests.post(server.url + "/generate", json=body, timeout=60).status_code == 200
    lines = [x for x in server.lines() if "Decode batch" in x]
    assert lines, "a Decode batch line after 40 decode steps"
    assert re.search(TS + r" TP0\] Decode batch, #running-req: 1, #token: \d+, token usage: "
                     r"\d\.\d\d, cuda graph: True, gen throughput \(token/s\): \d+\.\d\d, "
                     r"#queue-req: 0$", lines[-1])


def test_chat_completions_stream_like_openai(server):
    body = {"model": "Kimi-K2.5", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True,
                       timeout=30) as r:
        events = _sse(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


# --- other configurations -------------------------------------------------------------------

def test_mha_model_without_cuda_graphs_or_multithread_loading(launch):
    # --disable-cuda-graph turns off prefill and decode capture, as parse_cuda_graph_config;
    # enable_multithread_load false selects the single-threaded shard loader.
    sim = launch("--tp-size", "1", "--disable-cuda-graph",
                    "--model-loader-extra-config", '{"enable_multithread_load": false}',
                    model_arch="LlamaForCausalLM")
    try:
        ready(sim)
        in_order(sim.lines(), [
            TS + r"\] Attention backend not specified\. Use flashinfer backend by default\.$",
            TS + r"\] server_args=\{",
            TS + r"\] Load weight begin\.",
            r"^Loading safetensors checkpoint shards:\s+\d+% Completed \| \d+/64 \[",
            TS + r"\] Load weight end\. .*type=LlamaForCausalLM",
            TS + r"\] KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: 812345, "
            r"K size: 4\.93 GB, V size: 4\.93 GB$",
            TS + r"\] Disable prefill CUDA graph because cuda_graph_config resolved "
            r"prefill\.backend='disabled'",
            TS + r"\] max_total_num_tokens=",
            TS + r"\] Prefill batch, .* cuda graph: False, ",
            re.escape(READY),
        ])
        assert "Multi-thread loading shards" not in sim.log()
        assert not re.search(r"(?i)capture .*cuda graph begin|Capturing", sim.log())
        assert server_args(sim.log())["attention_backend"] == "flashinfer"
        assert titles(sim) == ["sglang::detokenizer", "sglang::scheduler"]
    finally:
        sim.stop()


def test_pipeline_and_expert_parallel_titles_and_pp_prefill_default(launch):
    sim = launch("--tp-size", "2", "--pp-size", "2", "--ep-size", "2",
                    "--disable-custom-all-reduce", "--attention-backend", "triton")
    try:
        ready(sim)
        assert titles(sim) == ["sglang::detokenizer", "sglang::scheduler_PP0_TP0_EP0",
                               "sglang::scheduler_PP0_TP1_EP1", "sglang::scheduler_PP1_TP0_EP0",
                               "sglang::scheduler_PP1_TP1_EP1"]
        in_order(sim.lines(), [
            TS + r"\] Disabling breakable prefill CUDA graph by default for pipeline "
            r"parallelism\. Set --cuda-graph-backend-prefill=breakable to opt in\.$",
            TS + r"\] server_args=",
            TS + r" PP0 TP0 EP0\] Load weight begin\.",
            TS + r" PP0 TP0 EP0\] Capture target decode CUDA graph begin\.",
            TS + r" PP0 TP0 EP0\] max_total_num_tokens=",
            re.escape(READY),
        ])
        # Not anchored: a rank's line may be glued to PP0 TP0's loader bar.
        assert re.search(TS[1:] + r" PP1 TP1 EP1\] Load weight begin\.", sim.log())
        assert "Capture target prefill CUDA graph begin" not in sim.log()
        # Each PP stage's TP rank 0 draws the capture bar; GPUs are pp * tp on the node.
        snap = gpu_snapshot("simulated", str(sim.gpu_dir))
        assert [bool(d["processes"]) for d in snap] == [True] * 4 + [False] * 4
    finally:
        sim.stop()


def test_decode_graphs_off_leaves_prefill_capture_on(launch):
    sim = launch("--tp-size", "1", "--cuda-graph-backend-decode", "disabled",
                    "--attention-backend", "triton", "--api-key", "sk-test")
    try:
        ready(sim)
        in_order(sim.lines(), [TS + r"\] Capture target prefill CUDA graph begin\.",
                               TS + r"\] Capture target prefill CUDA graph end\.",
                               TS + r"\] max_total_num_tokens="])
        assert "Capture target decode CUDA graph" not in sim.log()
        # --api-key guards everything but /health*, /ready*, /metrics*
        r = requests.get(sim.url + "/v1/models", timeout=5)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        auth = {"Authorization": "Bearer sk-test"}
        assert requests.get(sim.url + "/v1/models", timeout=5, headers=auth).status_code == 200
        assert requests.get(sim.url + "/ping", timeout=5).status_code == 401
        assert http_status(sim.url + "/health") == 200
        assert http_status(sim.url + "/ready") == 200
        assert http_status(sim.url + "/metrics") == 404  # not enabled
        assert requests.post(sim.url + "/flush_cache", timeout=5).status_code == 401
        # SGLang 0.5.23 logs the whole resolved dict, API key included (only watermark
        # secrets are redacted); deployments keep the key out of the rendered files.
        assert server_args(sim.log())["api_key"] == "sk-test"
    finally:
        sim.stop()


def test_data_parallel_runs_a_controller_that_owns_the_schedulers(launch):
    sim = launch("--tp-size", "2", "--dp-size", "2", "--disable-custom-all-reduce",
                    "--attention-backend", "triton")
    try:
        ready(sim)
        assert titles(sim) == ["sglang::data_parallel_controller", "sglang::detokenizer",
                               "sglang::scheduler_DP0_TP0", "sglang::scheduler_DP0_TP1",
                               "sglang::scheduler_DP1_TP0", "sglang::scheduler_DP1_TP1"]
        members = by_title(sim)
        controller = members["sglang::data_parallel_controller"]
        assert controller["ppid"] == sim.proc.pid
        assert members["sglang::scheduler_DP1_TP1"]["ppid"] == controller["pid"]
        in_order(sim.lines(), [TS + r"\] Launch DP0 starting at GPU #0\.$",
                               TS + r"\] Launch DP1 starting at GPU #2\.$",
                               TS + r" DP1 TP0\] max_total_num_tokens=",
                               re.escape(READY)])
        # The warm-up sends one prompt per replica; each replica logs its own prefill.
        assert re.search(r" DP0 TP0\] Prefill batch, #new-seq: 1, ", sim.log())
        assert re.search(r" DP1 TP0\] Prefill batch, #new-seq: 1, ", sim.log())
    finally:
        sim.stop()


def test_non_zero_node_rank_runs_a_dummy_health_server_and_only_logs_sigterm(launch):
    group = ["--tp-size", "16", "--nnodes", "2", "--attention-backend", "triton",
             "--enable-metrics", "--dist-init-addr", f"127.0.0.1:{free_port_block(1)}"]
    launch(*group, "--node-rank", "0")  # rank 0 hosts the rendezvous both nodes meet at
    sim = launch(*group, "--node-rank", "1", "--host", "127.0.0.2")
    url = f"http://127.0.0.2:{sim.port}"
    try:
        wait_for(lambda: "Dummy health check server started" in sim.log(), timeout=90)
        assert f"Dummy health check server started in background thread at 127.0.0.2:" \
               f"{sim.port}" in sim.log()
        for path in ("/health", "/health_generate", "/ping"):
            r = requests.get(url + path, timeout=5)
            assert (r.status_code, r.content) == (200, b""), path
        assert requests.get(url + "/ready", timeout=5).status_code == 404
        assert requests.post(url + "/generate", json={"text": "x"}, timeout=5).status_code == 404
        # --enable-metrics mounts /metrics: no stats-logging scheduler on this node, so empty.
        metrics = requests.get(url + "/metrics", timeout=5)
        assert (metrics.status_code, metrics.content) == (200, b"")
        assert metrics.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert titles(sim) == sorted(f"sglang::scheduler_TP{i}" for i in range(8, 16)), \
            "no detokenizer on a non-zero node rank"
        assert READY not in sim.log() and "Uvicorn running" not in sim.log()

        sim.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq "
                         "broadcast to stop the schedulers." in sim.log(), timeout=10)
        time.sleep(1.0)  # long enough for a handler that exits to have exited
        assert sim.proc.poll() is None, ("SIGTERM is only logged on a non-zero rank",
                                         sim.log()[-3000:])
        assert requests.get(url + "/health", timeout=5).status_code == 200

        schedulers = [p for p in procs.deployment_processes(sim.marker)
                      if p["cmdline"].startswith("sglang::scheduler")]
        for p in schedulers:
            os.kill(p["pid"], signal.SIGTERM)
        assert sim.proc.wait(30) == 0, "it returns once its schedulers are gone"
        assert len(re.findall(r"Scheduler or DataParallelController \d+ terminated with -15",
                              sim.log())) == 8
    finally:
        sim.stop()


# --- HTTP status over the server's life ---------------------------------------------------

def test_generate_is_served_during_warm_up_while_health_waits(launch):
    sim = launch("--tp-size", "1", "--attention-backend", "triton")
    try:
        wait_for(lambda: "Uvicorn running on" in sim.log(), timeout=90, interval=0.02)
        body = {"input_ids": [5, 6], "stream": True, "sampling_params": {"max_new_tokens": 2}}
        with requests.post(sim.url + "/generate", json=body, stream=True, timeout=30) as r:
            lines = r.iter_lines(decode_unicode=True)
            first = next(x for x in lines if x.startswith("data: "))
            # The server is still Starting: the warm-up has not finished.
            health = requests.get(sim.url + "/health", timeout=5)
            ready = requests.get(sim.url + "/ready", timeout=5)
            rest = [x for x in lines if x.startswith("data: ")]
        assert r.status_code == 200 and json.loads(first[6:])["meta_info"]["completion_tokens"]
        assert rest[-1] == "data: [DONE]"
        assert (health.status_code, health.content) == (503, b"")
        assert (ready.status_code, ready.content) == (503, b"")
        wait_for(lambda: READY in sim.log(), timeout=30)
        assert http_status(sim.url + "/health") == 200
    finally:
        sim.stop()


def test_health_fails_on_a_generation_hang_and_recovers_when_it_ends(launch):
    sim = launch("--tp-size", "1", "--attention-backend", "triton",
                    env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    try:
        ready(sim)
        sim.proc.send_signal(signal.SIGUSR1)  # generation hangs from now on
        time.sleep(0.2)
        assert http_status(sim.url + "/health") == 503
        assert re.search(r"Health check failed\. Server couldn't get a response from detokenizer "
                         r"for last 1 seconds\. tic start time: \d\d:\d\d:\d\d\. "
                         r"last_heartbeat time: \d\d:\d\d:\d\d", sim.log())
        assert http_status(sim.url + "/ping") == 503, "unhealthy until a check passes"
        assert http_status(sim.url + "/ready") == 503
        sim.proc.send_signal(signal.SIGUSR1)  # generation works again
        time.sleep(0.2)
        assert http_status(sim.url + "/health") == 200, "the next check that gets output"
        assert http_status(sim.url + "/ping") == 200
    finally:
        sim.stop()


def test_sigterm_drains_exits_and_releases_everything(launch):
    sim = launch("--tp-size", "4", "--attention-backend", "triton")
    ready(sim)
    assert list(sim.shm_dir.iterdir()), "the server holds a shared-memory segment"
    sim.proc.terminate()
    assert sim.proc.wait(20) == 0
    in_order(sim.lines(), [
        r"SIGTERM received\. signum=None frame=None\. Draining requests and shutting down\.\.\.",
        r"Gracefully exiting\.\.\. Remaining number of requests 0\. Remaining requests "
        r"remaining_rids=\[\]\.",
        r"kill_process_tree called: parent_pid=\d+, include_parent=False",
        r"INFO:     Finished server process \[\d+\]"])
    wait_for(lambda: not procs.deployment_processes(sim.marker), timeout=10)
    assert all(d["memory_used"] == 0 for d in gpu_snapshot("simulated", str(sim.gpu_dir)))
    assert not list(sim.shm_dir.iterdir()), "a clean exit removes its segment"


def test_port_is_refused_not_503_while_loading(launch):
    sim = launch("--tp-size", "4", "--attention-backend", "triton",
                    time_factor=0.05)
    try:
        wait_for(lambda: "Load weight begin" in sim.log(), timeout=30)
        assert http_status(sim.url + "/health", timeout=2) is None
    finally:
        sim.stop()


# --- failures ---------------------------------------------------------------------------

def test_incident_configuration_hangs_in_graph_capture_with_busy_wait(launch):
    # flashinfer + MLA model + SM120: the Rule makes the simulator fail as the incident did.
    sim = launch("--tp-size", "8", "--attention-backend", "flashinfer")
    try:
        wait_for(lambda: "Capture target decode CUDA graph begin" in sim.log(), timeout=90)
        tp0 = by_title(sim)["sglang::scheduler_TP0"]

        def counters():
            io_text = Path(f"/proc/{tp0['pid']}/io").read_text()
            io = dict(line.split(": ") for line in io_text.splitlines())
            return int(io["syscw"]), procs.process_info(tp0["pid"])["utime_ticks"]

        writes0, cpu0 = counters()
        time.sleep(3.2)  # observing a once-a-second signature needs a few seconds
        writes1, cpu1 = counters()
        assert writes1 - writes0 >= 2, "TP0 writes to its event pipe about once a second"
        assert cpu1 > cpu0, "TP0 spins"
        assert "Capture target decode CUDA graph end" not in sim.log()
        assert "Capture target prefill CUDA graph end" in sim.log(), "prefill capture passed"
        assert http_status(sim.url + "/health", timeout=2) is None
        assert len(procs.deployment_processes(sim.marker)) == 11  # and the resource tracker
    finally:
        sim.stop()


def crashed(sim, timeout: float = 90) -> str:
    """The log of a server whose failure ended it (SIGKILLed by its own kill_process_tree,
    or exiting 1 on an uncaught error), once no process of it is left."""
    code = sim.proc.wait(timeout)
    assert code in (-signal.SIGKILL, 1), code
    wait_for(lambda: not procs.deployment_processes(sim.marker), timeout=15)
    return sim.log()


def scheduler_exception(log: str, prefix: str, last_line: str) -> None:
    """prefix: a regex for the rank prefix ("" at TP=1)."""
    # A progress bar the failure interrupted has no newline: the line may be glued to it.
    assert re.search(TS[1:] + prefix + r"\] Scheduler hit an exception: Traceback "
                     r"\(most recent call last\):", log), log[-3000:]
    assert last_line in log


def test_crash_in_weight_loading_ends_the_whole_server(launch):
    sim = launch("--tp-size", "4", "--attention-backend", "triton",
                    fault="crash:loading_weights")
    log = crashed(sim)
    # Whichever rank reports first makes the main process kill the others.
    scheduler_exception(log, r" TP\d", "RuntimeError: simulated crash (SGLANG_SIM_FAULT)")
    in_order(log.splitlines(), [
        r"Scheduler hit an exception",
        TS + r"\] Received sigquit from a child process\. It usually means the child failed\.$",
        TS + r"\] kill_process_tree called: parent_pid=\d+, include_parent=True, pid=\d+$"])


@pytest.mark.parametrize("fault, flags, expected", [
    ("oom:allocating_kv_cache", [],
     ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.87 GiB. GPU 0 has a "
      "total capacity of 95.59 GiB of which 22.19 GiB is free. Including non-PyTorch memory, "
      "this process has 73.40 GiB memory in use. Of the allocated memory 73.15 GiB is "
      "allocated by PyTorch, and 256.00 MiB is reserved by PyTorch but unallocated. If reserved "
      "but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
      # the frames are SGLang's, where the gate reads the phase from
      '/sglang/srt/model_executor/model_runner.py", line 982, in alloc_memory_pool\n'
      "    result = self.kv_cache_configurator.configure(\n"]),
    ("no_kv_memory", ["--mem-fraction-static", "0.7"],
     ["ValueError: Loaded weights leave no GPU memory for the KV cache under "
      "--mem-fraction-static=0.7. Raise --mem-fraction-static above 0.768 (minimum viable = "
      "1 - available/pre = 0.7679). If using speculative decoding, draft weights are now "
      "counted.", '/sglang/srt/mem_cache/kv_cache_configurator.py", line 3050, in '
      "_profile_available_bytes\n    raise ValueError("]),
    ("not_enough_memory", ["--mem-fraction-static", "0.5"],
     ["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
      "value: mem_fraction_static=0.5"]),
    ("nccl_error", [],
     ["torch.distributed.DistBackendError: NCCL error in: ", "ncclSystemError: System call"]),
    ("capture_failed", [],
     ["Exception: Capture cuda graph failed: CUDA error: out of memory\nPossible solutions:\n"
      "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
      "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
      "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled."]),
    ("prefill_capture_failed", [],
     ["] RuntimeError: CUDA error: out of memory\nFail when using backend: breakable for prefill "
      "runner.\nPossible suggestions:\n1. disable the prefill CUDA graph by "
      "--cuda-graph-backend-prefill=disabled\n"]),
])
def test_start_up_failures_print_sglangs_lines(launch, fault, flags, expected):
    sim = launch("--tp-size", "1", "--attention-backend", "triton", *flags,
                    fault=fault)
    log = crashed(sim)
    scheduler_exception(log, "", expected[0].split("\n")[0].lstrip("] "))
    for text in expected:
        assert text in log, f"{text!r} not in:\n{log[-3000:]}"
    assert "Received sigquit from a child process" in log


@pytest.mark.parametrize("fault, expected", [
    ("prefill_oom", "Prefill out of memory. Try to lower your batch size.\nTry to allocate 8192 "
                    "tokens.\nAvailable tokens: 0 (available_size=0 + evictable_size=0)\n"),
    ("decode_oom", "Decode out of memory. Try to lower your batch size.\nTry to allocate 1 "
                   "tokens.\n"),
])
def test_serving_out_of_memory_ends_the_server(launch, fault, expected):
    sim = launch("--tp-size", "1", "--attention-backend", "triton", fault=fault)
    ready(sim)
    with pytest.raises(requests.RequestException):
        requests.post(sim.url + "/generate", json={"text": "hi"}, timeout=30)
    log = crashed(sim)
    assert re.search(TS + r"\] " + re.escape(expected.split("\n")[0]), log, re.M)
    scheduler_exception(log, "", "RuntimeError: " + expected)
    in_order(log.splitlines(), [
        r"Scheduler hit an exception",
        TS + r"\] SIGQUIT received\. signum=None, frame=None\. It usually means one child "
        r"failed\.$",
        r"kill_process_tree called"])


def test_nccl_collective_timeout_aborts_the_scheduler_and_the_server(launch):
    # --dist-timeout below --watchdog-timeout: torch's NCCL watchdog aborts first.
    sim = launch("--tp-size", "2", "--disable-custom-all-reduce",
                    "--attention-backend", "triton", "--dist-timeout", "2",
                    "--watchdog-timeout", "60", fault="nccl_timeout")
    ready(sim)
    threading.Thread(target=lambda: http_status(sim.url + "/health", timeout=60),
                     daemon=True).start()
    log = crashed(sim)
    assert re.search(r"^\[rank0\]:\[E\d{4} \d\d:\d\d:\d\d\.\d{9} ProcessGroupNCCL\.cpp:\d+\] "
                     r"\[Rank 0\] Watchdog caught collective operation timeout: WorkNCCL\(SeqNum="
                     r"\d+, OpType=ALLREDUCE, NumelIn=\d+, NumelOut=\d+, Timeout\(ms\)=2000\) "
                     r"ran for \d+ milliseconds before timing out\.$", log, re.M)
    assert "\nterminate called after throwing an instance of 'c10::DistBackendError'\n" in log
    assert "Scheduler hit an exception" not in log, "a native abort runs no Python handler"
    assert "Scheduler watchdog timeout" not in log
    in_order(log.splitlines(), [
        r"Watchdog caught collective operation timeout",
        r"Some NCCL operations have failed or timed out\. Due to the asynchronous nature of "
        r"CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data\.$",
        r"To avoid data inconsistency, we are taking the entire process down\.$",
        TS + r"\] Subprocess scheduler_\d \(pid=\d+\) crashed with exit code -6\. Triggering "
        r"SIGQUIT for cleanup\.\.\.$",
        r"SIGQUIT received\. signum=None, frame=None\. It usually means one child failed\.",
        r"kill_process_tree called"])


def test_with_sglangs_defaults_the_scheduler_watchdog_fires_before_nccls(launch):
    # dist_timeout unset: torch's 10-minute NCCL timeout; the watchdog (here 2 s, 300 s by
    # default) fires first and SIGQUITs the tree.
    sim = launch("--tp-size", "2", "--disable-custom-all-reduce",
                    "--attention-backend", "triton", "--watchdog-timeout", "2",
                    fault="nccl_timeout")
    ready(sim)
    threading.Thread(target=lambda: http_status(sim.url + "/health", timeout=60),
                     daemon=True).start()
    log = crashed(sim)
    assert "Watchdog caught collective operation timeout" not in log
    in_order(log.splitlines(), [
        TS + r" TP\d\] Scheduler watchdog timeout \(self\.watchdog_timeout=2\.0, "
        r"self\.soft=False\)$",
        r"SIGQUIT received\. signum=None, frame=None",
        r"kill_process_tree called"])


def test_a_generation_hang_ends_with_the_scheduler_watchdog_at_its_timeout(launch):
    sim = launch("--tp-size", "1", "--attention-backend", "triton",
                    "--watchdog-timeout", "2", fault="hang_generation",
                    env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    ready(sim)
    hung_at = time.monotonic()
    assert http_status(sim.url + "/health") == 503  # the health check's batch hangs
    log = crashed(sim)
    fired = time.monotonic() - hung_at
    assert 2 + 5 <= fired < 2 * 1.5 + 5 + 10, fired  # timeout..1.5x timeout, then 5 s
    in_order(log.splitlines(), [
        TS + r"\] Health check failed\. Server couldn't get a response from detokenizer",
        TS + r"\] Scheduler debug info:$",
        r"^scheduler\.cur_batch_for_debug\.batch_size\(\)=1$",
        r"^scheduler\.cur_batch_for_debug\.reqs=\[Req\(rid=HEALTH_CHECK_[0-9a-f]{32}, "
        r"input_ids=\[0\], output_ids=\[\], self\.grammar=None, self\.sampling_params="
        r"SamplingParams\(max_new_tokens=1, .*, temperature=1\.0, top_p=1\.0, top_k=1, .*\)\)\]$",
        r"^\[full\] total=\d+, available=\d+, evictable=0, protected=0, session_held=0, "
        r"uncached=0$",
        # py-spy on the scheduler itself (its dump, or the shell's word that it is missing)
        TS + r"\] Pyspy (dump for PID |failed \(py-spy dump --native --pid )\d+",
        TS + r"\] Scheduler watchdog timeout \(self\.watchdog_timeout=2\.0, self\.soft=False\)$",
        TS + r"\] SIGQUIT received\. signum=None, frame=None\. It usually means one child "
        r"failed\.$",
        r"kill_process_tree called"])


def test_tokenizer_watchdog_is_soft_and_only_reports(launch):
    sim = launch("--tp-size", "1", "--attention-backend", "triton",
                    "--soft-watchdog-timeout", "2", fault="tokenizer_watchdog")
    try:
        ready(sim)
        with pytest.raises(requests.Timeout):
            requests.post(sim.url + "/generate", json={"text": "hi"}, timeout=2)
        wait_for(lambda: "TokenizerManager watchdog timeout" in sim.log(), timeout=10)
        assert re.search(TS + r"\] TokenizerManager watchdog timeout \(self\.watchdog_timeout="
                         r"2\.0, self\.soft=True\)$", sim.log(), re.M)
        assert sim.proc.poll() is None, "a soft watchdog kills nothing"
    finally:
        sim.stop()


def test_with_data_parallelism_a_dead_scheduler_leaves_the_server_up(launch):
    # The kernel's OOM killer takes DP0's TP0: no Python handler runs, no SIGQUIT is sent,
    # and 0.5.23's controller does not watch its schedulers: the controller and the main
    # process stay up, DP1 keeps serving, and requests routed to DP0 never finish.
    sim = launch("--tp-size", "2", "--dp-size", "2", "--disable-custom-all-reduce",
                    "--attention-backend", "triton", fault="killed:serving")
    try:
        ready(sim)
        dp0 = by_title(sim)["sglang::scheduler_DP0_TP0"]["pid"]
        answers = []

        def ask():
            try:
                r = requests.post(sim.url + "/generate",
                                  json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                                  timeout=5)
                answers.append(r.status_code)
            except requests.Timeout:
                answers.append("timeout")

        for _ in range(4):
            ask()
        wait_for(lambda: not Path(f"/proc/{dp0}").exists()
                 or procs.process_info(dp0)["state"] == "Z", timeout=10)
        kmsg = (sim.gpu_dir.parent / "kmsg").read_text()
        assert re.search(rf"Out of memory: Killed process {dp0} \(sglang::schedul\)", kmsg)
        assert sorted(answers, key=str) == [200, 200, "timeout", "timeout"]
        assert sim.proc.poll() is None, "the main process stays up"
        assert "sglang::data_parallel_controller" in titles(sim)
        assert "kill_process_tree" not in sim.log()
        assert "sglang::scheduler_DP1_TP0" in titles(sim)
    finally:
        sim.stop()


def test_with_data_parallelism_a_scheduler_exception_still_ends_the_server(launch):
    # The scheduler's SIGQUIT goes to its parent, the controller, which has no handler and
    # dies; the main process's SubprocessWatchdog sees that and takes everything down.
    sim = launch("--tp-size", "1", "--dp-size", "2", "--attention-backend",
                    "triton", fault="crash:serving")
    ready(sim)
    threading.Thread(target=lambda: http_status(sim.url + "/health", timeout=30),
                     daemon=True).start()
    log = crashed(sim)
    scheduler_exception(log, " DP0", "RuntimeError: simulated crash (SGLANG_SIM_FAULT)")
    in_order(log.splitlines(), [
        r"Scheduler hit an exception",
        TS + r"\] Subprocess scheduler_0 \(pid=\d+\) crashed with exit code -3\. Triggering "
        r"SIGQUIT for cleanup\.\.\.$",
        r"SIGQUIT received\. signum=None, frame=None",
        r"kill_process_tree called"])


def test_generation_hanging_after_ready_makes_health_fail(launch):
    sim = launch("--tp-size", "1", "--attention-backend", "triton",
                    fault="hang_generation", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    try:
        ready(sim)
        assert http_status(sim.url + "/ready") == 200
        with pytest.raises(requests.Timeout):
            requests.post(sim.url + "/generate", json={"text": "hi"}, timeout=1.5)
        assert http_status(sim.url + "/health") == 503
        assert "Health check failed" in sim.log()
    finally:
        sim.stop()


def test_a_command_line_sglang_refuses_after_parsing_ends_as_sglangs_does(launch):
    """sglang/launch_server.py: resolve_once and the engine's check_server_args raise in the
    main process; its `finally` kills the (empty) process tree, Python prints the traceback
    through SGLang's files and exits 1. No worker starts."""
    sim = launch("--tp-size", "8", "--tokenizer-worker-num", "0")
    assert sim.proc.wait(60) == 1
    log = sim.log()
    assert "kill_process_tree called: parent_pid=" in log
    assert "Load weight begin" not in log and "scheduler" not in " ".join(titles(sim))
    frame, code, final = log.rstrip().splitlines()[-3:]
    assert frame.endswith('/sglang/srt/arg_groups/validation_hook.py", line 273, in '
                          'check_server_args')
    assert code.strip() == 'assert cfg.tokenizer_worker_num > 0, "Tokenizer worker num must ' \
        '>= 1"'
    assert final == "AssertionError: Tokenizer worker num must >= 1"
    assert log.index("kill_process_tree called") < log.index("Traceback (most recent call")


def test_a_tp_that_does_not_divide_the_heads_fails_when_the_model_is_built(launch):
    """Kimi-K2.5's 64 heads at TP 3: SGLang's argument checks pass, and the scheduler fails
    building the attention layers (sglang/srt/models/deepseek_v2.py), then the tree is
    killed."""
    shape = known_models()["Kimi-K2.5"].config_json()
    sim = launch("--tp-size", "3", "--disable-custom-all-reduce", model_config=shape)
    assert sim.proc.wait(60) != 0
    log = sim.log()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert ('/sglang/srt/models/deepseek_v2.py", line 2057, in __init__\n'
            "    assert num_heads % attn_tp_size == 0\nAssertionError\n") in log
    assert log.index("Load weight begin") < log.index("Scheduler hit an exception")
    assert "Received sigquit from a child process" in log


# ---- a multi-node group meets at --dist-init-addr --------------------------------------------

def test_rank_0_of_a_group_waits_at_the_rendezvous_until_the_stores_timeout(launch):
    port = free_port_block(1)
    sim = launch("--tp-size", "16", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr",
                 f"127.0.0.1:{port}", "--dist-timeout", "3", "--attention-backend", "triton")
    wait_for(lambda: sim.log().count("Init parallel begin.") == 8, timeout=60)
    log = crashed(sim)
    assert "Load weight begin" not in log and READY not in log
    assert "Init parallel ends" not in log, "no rank passed the rendezvous"
    # torch's TCPStore::waitForWorkers: whole seconds elapsed past the timeout, the count.
    scheduler_exception(log, " TP0", "\ntorch.distributed.DistStoreError: Timed out after 4 "
                                     "seconds waiting for clients. 8/16 clients joined.\n")
    in_order(log.splitlines(), [
        r'/sglang/srt/managers/scheduler\.py", line 6362, in run_scheduler_process$',
        r'/sglang/srt/distributed/bootstrap\.py", line 152, in init_parallel_runtime$',
        r'/sglang/srt/distributed/parallel_state\.py", line 2517, in '
        r'init_distributed_environment$',
        r'/torch/distributed/rendezvous\.py", line 215, in _create_c10d_store$',
        r"^torch\.distributed\.DistStoreError: ",
        TS + r"\] Received sigquit from a child process\. It usually means the child failed\.$",
        r"kill_process_tree called"])


def test_a_rank_that_never_reaches_the_stores_host_fails_with_torchs_connect_timeout(launch):
    port = free_port_block(1)
    sim = launch("--tp-size", "16", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr",
                 f"127.0.0.1:{port}", "--dist-timeout", "2", "--attention-backend", "triton",
                 "--host", "127.0.0.2")
    log = crashed(sim)
    message = (f"The client socket has timed out after 2000ms while trying to connect to "
               f"(127.0.0.1, {port}).")
    assert re.search(r"^\[E\d{4} \d\d:\d\d:\d\d\.\d{9} socket\.cpp:1028\] \[c10d\] "
                     + re.escape(message) + "$", log, re.M)
    scheduler_exception(log, r" TP\d+", "\ntorch.distributed.DistNetworkError: " + message)


def test_both_nodes_of_a_group_pass_the_rendezvous_and_serve(launch):
    group = ["--tp-size", "16", "--nnodes", "2", "--attention-backend", "triton",
             "--dist-init-addr", f"127.0.0.1:{free_port_block(1)}"]
    rank0 = launch(*group, "--node-rank", "0")
    wait_for(lambda: rank0.log().count("Init parallel begin.") == 8, timeout=60)
    time.sleep(1)  # rank 0 waits: the second node comes later, as a real one may
    assert "Init parallel ends" not in rank0.log()
    launch(*group, "--node-rank", "1", "--host", "127.0.0.2")
    ready(rank0)
    in_order(rank0.lines(), [TS + r" TP0\] Init parallel begin\.$",
                             TS + r" TP0\] Init parallel ends\. elapsed=\d+\.\d\d s$",
                             TS + r" TP0\] Memory baseline taken\. mem usage=0\.25 GB$",
                             TS + r" TP0\] Load weight begin\. "])


# ---- SGLang's own surfaces and texts -----------------------------------------------------------

def test_the_main_process_warns_of_its_entrypoint_and_runs_a_resource_tracker(server):
    log = server.log()
    assert log.index("UserWarning: 'python -m sglang.launch_server' is still supported, but "
                     "'sglang serve' is the recommended entrypoint.\n  Example: sglang serve "
                     "--model-path <model> [options]\n  warnings.warn(\n") < log.index(
                         "server_args=")
    assert re.search(r'^\S+/sglang/launch_server\.py:71: UserWarning: ', log, re.M)
    tracker = [p for p in procs.deployment_processes(server.marker)
               if "from multiprocessing.resource_tracker import main" in p["cmdline"]]
    assert len(tracker) == 1 and tracker[0]["ppid"] == server.proc.pid


def test_an_admin_key_guards_flush_cache_and_freeze_gc(launch):
    sim = launch("--tp-size", "1", "--attention-backend", "triton", "--api-key", "user-key",
                 "--admin-api-key", "admin-key")
    try:
        ready(sim)
        user = {"Authorization": "Bearer user-key"}
        admin = {"Authorization": "Bearer admin-key"}
        for path in ("/flush_cache", "/freeze_gc"):
            refused = requests.post(sim.url + path, headers=user, timeout=10)
            assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
            assert requests.post(sim.url + path, headers=admin, timeout=10).status_code == 200
        assert requests.get(sim.url + "/model_info", headers=user, timeout=10).status_code == 200
        assert requests.get(sim.url + "/model_info", headers=admin,
                            timeout=10).status_code == 401
        # the warm-up froze GC with the admin key
        assert re.search(r'"POST /freeze_gc HTTP/1\.1" 200 OK\n.*\n?.*fired up', sim.log())
    finally:
        sim.stop()


def test_quant_in_the_load_line_comes_from_the_checkpoints_config(launch):
    sim = launch("--tp-size", "1", "--attention-backend", "triton", model_config={
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "weight_block_size": [128, 128]}})
    try:
        ready(sim)
        assert re.search(TS + r"\] Load weight end\. elapsed=\d+\.\d\d s, "
                         r"type=DeepseekV3ForCausalLM, quant=fp8, fmt=e4m3, avail mem=",
                         sim.log(), re.M)
    finally:
        sim.stop()


def test_the_detokenizers_exception_takes_the_server_down(launch):
    sim = launch("--tp-size", "1", "--attention-backend", "triton",
                 fault="detokenizer_crash")
    ready(sim)
    threading.Thread(target=lambda: http_status(sim.url + "/health", timeout=30),
                     daemon=True).start()
    log = crashed(sim)
    in_order(log.splitlines(), [
        TS + r"\] DetokenizerManager hit an exception: Traceback \(most recent call last\):$",
        r"^KeyError: '[0-9a-f]{32}'$",
        r"^During handling of the above exception, another exception occurred:$",
        r'/sglang/srt/managers/detokenizer_manager\.py", line 385, in '
        r"_decode_batch_token_id_output$",
        r"^RuntimeError: Decode status not found for request [0-9a-f]{32}\. ",
        TS + r"\] SIGQUIT received\. signum=None, frame=None\. It usually means one child "
        r"failed\.$",
        r"kill_process_tree called"])


def test_a_scheduler_dead_at_start_up_ends_the_main_process_with_sglangs_traceback(launch):
    sim = launch("--tp-size", "2", "--disable-custom-all-reduce", "--attention-backend",
                 "triton", fault="killed:loading_weights")
    assert sim.proc.wait(90) == 1
    lines = sim.log().rstrip().splitlines()
    in_order(lines, [
        # (the line may be glued to a loader bar the kill interrupted)
        r"\] kill_process_tree called: parent_pid=\d+, include_parent=False, pid=\d+$",
        r"^Traceback \(most recent call last\):$",
        r'/sglang/launch_server\.py", line 84, in <module>$',
        r'/sglang/srt/entrypoints/engine\.py", line 2029, in _wait_for_scheduler_ready$'])
    assert re.match(r"RuntimeError: Rank \d scheduler died during initialization \(exit code: "
                    r"-9\)\. If exit code is -9 \(SIGKILL\), a common cause is the OS OOM "
                    r"killer\. Run `dmesg -T \| grep -i oom` to check\.$", lines[-1])


# --- hangs the gate calls by their stacks ---------------------------------------------------

GATE_SCALE = 0.5  # the gate's production timings, halved: a 10 s poll is 5 s


def stalled_by_stacks(sim, folder: Path, limit: float = 240) -> dict:
    """The health gate's verdicts on `sim`, stack sampling on with the real py-spy and the
    production timings scaled by GATE_SCALE, until it calls the server stalled."""
    from sglang_fleet.node.common.vocab import default_windows
    from sglang_fleet.node.health.classify import classify, stack_state
    from sglang_fleet.node.health.observe import observe
    from sglang_fleet.node.health.stacks import STACK_WINDOW_S

    state_file = folder / "gate-state.json"
    state_file.write_text(json.dumps({"pid": sim.proc.pid, "started_at": time.time()}))
    params = sim.gate_params(state_file, stacks=True, scale=GATE_SCALE)
    windows, ceilings = (dict((k, v * GATE_SCALE) for k, v in d.items())
                         for d in default_windows(1000))
    state, seen, began = None, [], time.monotonic()
    while time.monotonic() - began < limit:
        obs = observe(params, stack_state=stack_state(state))
        verdict, state = classify(state, obs, time.monotonic(), windows, ceilings,
                                  STACK_WINDOW_S * GATE_SCALE)
        seen.append(verdict["verdict"])
        if verdict["verdict"] == "stalled":
            return verdict
        assert verdict["verdict"] in ("progressing", "ready", "unhealthy"), verdict
        time.sleep(10 * GATE_SCALE)
    pytest.fail(f"never stalled in {limit} s: {seen}\n{sim.log()[-2000:]}")


def test_a_deadlocked_detokenizer_is_stalled_by_its_stacks_while_the_schedulers_serve(
        launch, tmp_path):
    sim = launch("--tp-size", "2", "--attention-backend", "triton",
                 "--disable-custom-all-reduce", fault="detokenizer_hang",
                 env={"SGLANG_HEALTH_CHECK_TIMEOUT": "10"})
    ready(sim)
    # A client's request: the schedulers run it, its output never comes back.
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(sim.url + "/generate", json={"text": "Hello", "sampling_params": {
            "max_new_tokens": 4}}, timeout=3)
    v = stalled_by_stacks(sim, tmp_path)
    assert v["phase"] == "serving" and v["signature"] == "detokenizer_deadlock", v["reason"]
    stacks = v["evidence"]["stacks"]
    assert stacks["rank"] == "detokenizer"
    assert stacks["frame"].startswith("_decode_batch_token_id_output (")
    assert "srt/managers/detokenizer_manager.py" in stacks["frame"]
    assert "_decode_batch_token_id_output" in v["reason"]
    # The schedulers went on: the client's prefill and each probe's are in the log.
    assert re.search(r"TP0\] Prefill batch, #new-seq: 1, #new-token: 1, ", sim.log())
    assert stacks["ranks"]["TP0"] is None and stacks["ranks"]["TP1"] is None
    assert sim.proc.poll() is None


def test_a_jit_warmup_waiting_on_a_compile_lock_with_no_compiler_is_stalled_as_jit(
        launch, tmp_path):
    sim = launch("--tp-size", "2", "--attention-backend", "triton",
                 "--disable-custom-all-reduce", fault="jit_hang",
                 env={"SGLANG_DG_CACHE_DIR": str(tmp_path / "deep_gemm")})
    v = stalled_by_stacks(sim, tmp_path)
    assert v["phase"] == "capturing_cuda_graph", v["reason"]
    assert v["signature"] == "jit_compilation", v["reason"]
    stacks = v["evidence"]["stacks"]
    assert stacks["frame"].startswith("_maybe_compile_deep_gemm_one_type_all (")
    assert "srt/layers/deep_gemm_wrapper/compile_utils.py" in stacks["frame"]
    assert set(stacks["ranks"].get(r) for r in ("TP0", "TP1")) == {"jit_compilation"}
    # No compiler child: the lock is what it waits on, not a compile.
    assert not any(p["cmdline"].startswith("nvcc")
                   for p in procs.deployment_processes(sim.marker))
    assert (tmp_path / "deep_gemm" / "locks").is_dir()


def test_the_jit_hang_fault_needs_a_deep_gemm_cache_folder(launch):
    sim = launch("--tp-size", "2", fault="jit_hang",
                 env={"SGLANG_DG_CACHE_DIR": "", "SGLANG_CACHE_DIR": ""})
    sim.proc.wait(60)
    assert "SGLANG_SIM_FAULT=jit_hang needs SGLANG_DG_CACHE_DIR or SGLANG_CACHE_DIR" in sim.log()
