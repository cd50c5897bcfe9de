"""sglang-sim behaves like SGLang 0.5.23 from outside: log, processes, GPUs, HTTP, failures."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import requests

from sglang_fleet.testfleet.local import http_status, start_sim, wait_for
from sglang_fleet_node import sglang_fleet_procs as procs
from sglang_fleet_node.sglang_fleet_gpu import gpu_snapshot

GB = 1024**3
READY = "The server is fired up and ready to roll!"

# reference/sglang-server.md, "Start-up, in order, as it appears in the log" (0.5.23)
STARTUP_ORDER = [
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=ServerArgs\(",
    r"^\[[\d\- :]+ TP0\] Load weight begin\. avail mem=\d+\.\d\d GB$",
    r"^Loading safetensors checkpoint shards:\s+\d+% Completed \| \d+/64 \[",
    r"^\[[\d\- :]+ TP0\] Load weight end\. elapsed=\d+\.\d\d s, type=DeepseekV3ForCausalLM, "
    r"avail mem=\d+\.\d\d GB, mem usage=73\.40 GB\.$",
    r"^\[[\d\- :]+ TP0\] KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, "
    r"KV size: \d+\.\d\d GB$",
    r"^\[[\d\- :]+ TP0\] Memory pool end\. avail mem=\d+\.\d\d GB$",
    r"(?i)^\[[\d\- :]+ TP0\] capture .*cuda graph begin",
    r"^Capturing batches \(bs=\d+ avail_mem=\d+\.\d\d GB\):",
    r"(?i)^\[[\d\- :]+ TP0\] capture .*cuda graph end\. bs=\[",
    r"^\[[\d\- :]+ TP0\] max_total_num_tokens=\d+, chunked_prefill_size=",
    r"^\[[\d\- :]+\] INFO:     Started server process \[\d+\]$",
    r"^\[[\d\- :]+\] INFO:     Waiting for application startup\.$",
    r"^\[[\d\- :]+\] INFO:     Application startup complete\.$",
    r"^\[[\d\- :]+\] INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ \(Press CTRL\+C",
    r'"GET /model_info HTTP/1\.1" 200',
    r'"POST /generate HTTP/1\.1" 200',
    re.escape(READY),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sim = start_sim(tmp_path_factory.mktemp("sim"), "--tp-size", "8", "--enable-metrics",
                    "--attention-backend", "triton")
    wait_for(lambda: READY in sim.log(), timeout=60)
    yield sim
    sim.stop()


def test_startup_log_follows_sglang_order(server):
    lines = server.lines()
    position = 0
    for pattern in STARTUP_ORDER:
        regex = re.compile(pattern)
        for i in range(position, len(lines)):
            if regex.search(lines[i]):
                position = i + 1
                break
        else:
            pytest.fail(f"{pattern!r} not found after line {position}:\n" + "\n".join(lines))
    assert "\r" in server.log(), "0.5.23 redraws tqdm bars with carriage returns"


def test_worker_processes_are_titled_like_sglang_and_carry_the_marker(server):
    members = procs.deployment_processes(server.marker)
    titles = sorted(p["cmdline"] for p in members)
    expected = sorted([f"sglang::scheduler_TP{i}" for i in range(8)] + ["sglang::detokenizer"])
    assert [t for t in titles if t.startswith("sglang::")] == expected
    assert any("sglang_fleet.sim.launch_server" in t for t in titles)
    assert {p["ppid"] for p in members if p["cmdline"].startswith("sglang::")} == {
        server.proc.pid}


def test_schedulers_hold_their_gpu_and_its_memory(server):
    members = {p["cmdline"]: p["pid"] for p in procs.deployment_processes(server.marker)}
    snap = gpu_snapshot("simulated", str(server.gpu_dir))
    for i in range(8):
        pid = members[f"sglang::scheduler_TP{i}"]
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert str(server.gpu_dir / f"nvidia{i}") in held
        assert snap[i]["processes"] == [{"pid": pid, "used_memory": snap[i]["memory_used"]}]
        assert 84 * GB < snap[i]["memory_used"] < 85 * GB


def test_health_ready_and_info_endpoints(server):
    assert http_status(server.url + "/health") == 200
    assert http_status(server.url + "/health_generate") == 200
    assert http_status(server.url + "/ready") == 200
    info = requests.get(server.url + "/model_info", timeout=5).json()
    assert info["served_model_name"] == "Kimi-K2.5"
    assert requests.get(server.url + "/get_model_info", timeout=5).status_code == 200
    sinfo = requests.get(server.url + "/server_info", timeout=5).json()
    assert sinfo["version"] == "0.5.23" and sinfo["tp_size"] == 8 and sinfo["simulated"]
    assert "last_gen_throughput" in sinfo["internal_states"][0]
    models = requests.get(server.url + "/v1/models", timeout=5).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "Kimi-K2.5"
    assert models["data"][0]["owned_by"] == "sglang"
    metrics = requests.get(server.url + "/metrics", timeout=5).text
    assert 'sglang:num_running_reqs{model_name="Kimi-K2.5"}' in metrics
    assert requests.post(server.url + "/flush_cache", timeout=5).status_code == 200


def _sse(response):
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            events.append(line[6:])
    return events


def test_generate_streams_cumulative_text_then_done(server):
    body = {"input_ids": [1, 2, 3], "stream": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0}}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=30) as r:
        events = _sse(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4]
    assert chunks[2]["text"].startswith(chunks[1]["text"])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[0]["meta_info"]["prompt_tokens"] == 3
    plain = requests.post(server.url + "/generate", json={**body, "stream": False},
                          timeout=30).json()
    assert plain["meta_info"]["completion_tokens"] == 4


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
    plain = requests.post(server.url + "/v1/chat/completions", json={**body, "stream": False},
                          timeout=30).json()
    assert plain["choices"][0]["message"]["role"] == "assistant"


def test_sigterm_exits_and_releases_everything(tmp_path):
    sim = start_sim(tmp_path, "--tp-size", "4", "--attention-backend", "triton")
    wait_for(lambda: READY in sim.log(), timeout=60)
    assert list(sim.shm_dir.iterdir()), "the server holds a shared-memory segment"
    sim.proc.terminate()
    assert sim.proc.wait(10) == 0
    wait_for(lambda: not procs.deployment_processes(sim.marker), timeout=10)
    assert all(d["memory_used"] == 0 for d in gpu_snapshot("simulated", str(sim.gpu_dir)))
    assert not list(sim.shm_dir.iterdir()), "a clean exit removes its segment"


def test_port_is_refused_not_503_while_loading(tmp_path):
    sim = start_sim(tmp_path, "--tp-size", "4", "--attention-backend", "triton",
                    time_factor=0.05)
    try:
        wait_for(lambda: "Load weight begin" in sim.log(), timeout=30)
        assert http_status(sim.url + "/health", timeout=2) is None
    finally:
        sim.stop()


def test_api_key_guards_everything_but_health_ready_metrics(tmp_path):
    sim = start_sim(tmp_path, "--tp-size", "1", "--api-key", "sk-test", "--attention-backend",
                    "triton")
    try:
        wait_for(lambda: READY in sim.log(), timeout=60)
        r = requests.get(sim.url + "/v1/models", timeout=5)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        assert requests.get(sim.url + "/v1/models", timeout=5,
                            headers={"Authorization": "Bearer sk-test"}).status_code == 200
        assert http_status(sim.url + "/health") == 200
        assert http_status(sim.url + "/ready") == 200
        assert http_status(sim.url + "/metrics") == 404  # not enabled
        assert "api_key='sk-test'" in sim.log(), "SGLang logs its key; deploys filter it"
        titles = [p["cmdline"] for p in procs.deployment_processes(sim.marker)]
        assert "sglang::scheduler" in titles  # TP=1 naming
    finally:
        sim.stop()


def test_incident_configuration_hangs_in_graph_capture_with_busy_wait(tmp_path):
    # flashinfer + MLA model + SM120: the Rule makes the simulator fail as the incident did.
    sim = start_sim(tmp_path, "--tp-size", "8", "--attention-backend", "flashinfer")
    try:
        wait_for(lambda: "Capture target decode CUDA graph begin" in sim.log(), timeout=60)
        tp0 = next(p for p in procs.deployment_processes(sim.marker)
                   if p["cmdline"] == "sglang::scheduler_TP0")

        def counters():
            io_text = Path(f"/proc/{tp0['pid']}/io").read_text()
            io = dict(line.split(": ") for line in io_text.splitlines())
            return int(io["syscw"]), procs.process_info(tp0["pid"])["utime_ticks"]

        writes0, cpu0 = counters()
        time.sleep(3.2)  # observing a once-a-second signature needs a few seconds
        writes1, cpu1 = counters()
        assert writes1 - writes0 >= 2, "TP0 writes to its event pipe about once a second"
        assert cpu1 > cpu0, "TP0 spins"
        assert "CUDA graph end" not in sim.log()
        assert http_status(sim.url + "/health", timeout=2) is None
        assert len(procs.deployment_processes(sim.marker)) == 10
    finally:
        sim.stop()


def test_crash_in_weight_loading_exits_with_the_error(tmp_path):
    sim = start_sim(tmp_path, "--tp-size", "4", "--attention-backend", "triton",
                    fault="crash:loading_weights")
    assert sim.proc.wait(60) == 1
    log = sim.log()
    assert "Scheduler hit an exception: Traceback" in log
    assert "Received sigquit from a child process" in log
    wait_for(lambda: not procs.deployment_processes(sim.marker), timeout=10)


def test_cuda_oom_at_kv_allocation(tmp_path):
    sim = start_sim(tmp_path, "--tp-size", "4", "--attention-backend", "triton",
                    fault="oom:allocating_kv_cache")
    assert sim.proc.wait(60) == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in sim.log()


def test_generation_hanging_after_ready_makes_health_fail(tmp_path):
    sim = start_sim(tmp_path, "--tp-size", "1", "--attention-backend", "triton",
                    fault="hang_generation", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    try:
        wait_for(lambda: READY in sim.log(), timeout=60)
        assert http_status(sim.url + "/ready") == 200
        with pytest.raises(requests.Timeout):
            requests.post(sim.url + "/generate", json={"text": "hi"}, timeout=1.5)
        assert http_status(sim.url + "/health") == 503
        assert "Health check failed" in sim.log()
    finally:
        sim.stop()
