"""Phase, progress and failure lines from SGLang logs in both formats (fixtures written from
the reference's start-up tables)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_fleet_node.sglang_fleet_logphase import RUN_SEPARATOR, parse_log, progress_text

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# (line that enters the phase, phase) for each format, in order.
EXPECTED = {
    "sglang-0.5.23-startup.log": [
        ("server_args=", "launching"),
        ("Load weight begin", "loading_weights"),
        ("Load weight end", "allocating_kv_cache"),
        ("KV Cache is allocated", "allocating_kv_cache"),
        ("Capture target decode CUDA graph begin", "capturing_cuda_graph"),
        ("Capture target decode CUDA graph end", "starting_http"),
        ("Uvicorn running on", "warming_up"),
        ("POST /generate", "warming_up"),
        ("fired up and ready to roll", "serving"),
    ],
    "sglang-0.5.4-startup.log": [
        ("Init torch distributed begin", "launching"),
        ("Load weight begin", "loading_weights"),
        ("Load weight end", "allocating_kv_cache"),
        ("Capture cuda graph begin", "capturing_cuda_graph"),
        ("Capture cuda graph end", "starting_http"),
        ("max_total_num_tokens", "starting_http"),
        ("Application startup complete", "warming_up"),
        ("fired up and ready to roll", "serving"),
    ],
}


def read(name: str) -> str:
    return (LOGS / name).read_bytes().decode()  # keep the \r of tqdm redraws


def upto(text: str, needle: str) -> str:
    """The log as it stood when the line (or bar redraw) holding `needle` was written."""
    start = text.index(needle)
    ends = [i for i in (text.find("\n", start), text.find("\r", start)) if i >= 0]
    return text[:min(ends)] + "\n"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_phase_in_order(name):
    text = read(name)
    for needle, phase in EXPECTED[name]:
        assert parse_log(upto(text, needle))["phase"] == phase, needle


def test_shard_progress_from_carriage_return_redraws_0523():
    text = read("sglang-0.5.23-startup.log")
    mid = text[:text.index("\rLoading safetensors checkpoint shards: 100%")]
    parsed = parse_log(mid)
    assert parsed["shards"] == [27, 61]
    assert progress_text(parsed) == "loading_weights 27/61 shards"


def test_shard_progress_with_newline_per_update_054():
    text = read("sglang-0.5.4-startup.log")
    parsed = parse_log(upto(text, "27/163"))
    assert parsed["shards"] == [27, 163] and parsed["phase"] == "loading_weights"


@pytest.mark.parametrize("name,done,total", [("sglang-0.5.23-startup.log", 13, 36),
                                             ("sglang-0.5.4-startup.log", 12, 23)])
def test_capture_progress(name, done, total):
    text = read(name)
    parsed = parse_log(upto(text, f" {done}/{total} "))
    assert parsed["phase"] == "capturing_cuda_graph"
    assert parsed["capture"] == [done, total]
    assert progress_text(parsed) == f"capturing_cuda_graph {done}/{total} batches"


def test_access_lines_are_not_progress():
    text = read("sglang-0.5.23-startup.log")
    base = parse_log(text)["meaningful_lines"]
    more = text + '[2026-11-30 00:40:00] INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
    assert parse_log(more)["meaningful_lines"] == base


def test_timestamps_date_the_phase_and_the_last_line():
    text = upto(read("sglang-0.5.23-startup.log"), "Capture target decode CUDA "
                "graph begin")
    parsed = parse_log(text + "Capturing batches (bs=160 avail_mem=7.80 GB):   0%|    | 0/36")
    assert parsed["phase_started_at"] == parsed["last_line_at"]
    assert parsed["last_line_is_bar"] is True


def test_only_the_current_run_counts():
    old_run = read("sglang-0.5.23-startup.log")
    text = (old_run + f"\n{RUN_SEPARATOR}x config-digest y at z =====\n"
            "[2026-11-30 02:00:00] server_args=ServerArgs()\n")
    parsed = parse_log(text)
    assert parsed["phase"] == "launching" and parsed["shards"] is None


def test_failure_lines_are_recognised():
    parsed = parse_log(read("sglang-failures.log"))
    kinds = {f["kind"] for f in parsed["failures"]}
    assert kinds >= {"scheduler_exception", "cuda_oom", "child_failed", "warmup_failed",
                     "capture_failed", "health_check_failed", "watchdog_timeout", "traceback"}
    assert any("CUDA out of memory" in line for line in parsed["error_lines"])


def test_without_cuda_graphs_the_memory_pool_end_leaves_kv_allocation():
    text = upto(read("sglang-0.5.23-startup.log"), "Memory pool end")
    assert parse_log(text)["phase"] == "allocating_kv_cache"
    assert parse_log(text, cuda_graph=False)["phase"] == "starting_http"
