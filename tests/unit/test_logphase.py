"""Phase, progress and failure lines from SGLang logs in both formats (fixtures written from
the reference's start-up tables)."""

from __future__ import annotations

import calendar
import re
import time
from pathlib import Path

import pytest
import yaml

from sglang_fleet.node.common.vocab import PHASES
from sglang_fleet.node.logs import failures as failures_grammar
from sglang_fleet.node.logs.logphase import (
    FAILURE_HINTS,
    FAILURE_WHY,
    FAILURES,
    FATAL_KINDS,
    RUN_SEPARATOR,
    count_runs,
    current_run,
    fatal_failures,
    parse_log,
    phase_timeline,
    progress_text,
)

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
    # One failure per traceback: "Scheduler hit an exception: Traceback ..." ending in a CUDA
    # OOM is the OOM (the kind its final line names), said once.
    assert kinds >= {"cuda_oom", "child_failed", "warmup_failed", "capture_failed",
                     "health_check_failed", "watchdog_timeout"}
    oom = next(f for f in parsed["failures"] if f["kind"] == "cuda_oom")
    assert oom["message"].startswith("Scheduler hit an exception") and oom["traceback"]
    assert any("CUDA out of memory" in line for line in parsed["error_lines"])


def test_without_cuda_graphs_the_memory_pool_end_leaves_kv_allocation():
    text = upto(read("sglang-0.5.23-startup.log"), "Memory pool end")
    assert parse_log(text)["phase"] == "allocating_kv_cache"
    assert parse_log(text, cuda_graph=False)["phase"] == "starting_http"


# ---- the fixture table: every log shape, with its truth --------------------------------------

TRUTH = yaml.safe_load((LOGS / "truth.yml").read_text())


def test_every_fixture_has_its_truth():
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(TRUTH)
    assert len(TRUTH) >= 30


def progress_of(parsed: dict) -> str | None:
    p = parsed["progress"]
    return None if p is None else f"{p['done']}/{p['total']} {p['unit']}"


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_fixture_reads_as_its_truth(name):
    truth = TRUTH[name]
    text = read(name)
    parsed = parse_log(text)
    assert parsed["phase"] == truth["phase"]
    if "step" in truth:
        assert parsed["step"] == truth["step"]
    assert progress_of(parsed) == truth["progress"]
    assert [f["kind"] for f in parsed["failures"]] == truth["failures"]
    assert parsed["fatal"] is truth["fatal"]
    # A fatal kind is not fatal in a requested stop's own exits.
    assert all(f["fatal"] == (f["kind"] in FATAL_KINDS and not f.get("during_stop"))
               for f in parsed["failures"])
    assert count_runs(text) == truth.get("runs", 1)
    # The timeline starts at launch, moves forward only, and ends in the current phase.
    phases = [row["phase"] for row in parsed["timeline"]]
    assert phases[0] == "launching" and phases[-1] == truth["phase"]
    assert [PHASES.index(p) for p in phases] == sorted(PHASES.index(p) for p in phases)


def test_failure_kinds_are_defined_once_with_their_reason():
    kinds = [row[0] for row in FAILURES]
    assert len(kinds) == len(set(kinds))
    assert all(FAILURE_WHY[k] for k in kinds)
    assert set(FAILURE_HINTS) <= set(kinds)
    assert {"health_check_failed", "soft_watchdog_timeout", "memory_unbalanced_warning",
            "traceback"}.isdisjoint(FATAL_KINDS)
    assert {"scheduler_exception", "cuda_oom", "nccl_error", "nccl_timeout", "process_abort",
            "capture_failed", "warmup_failed", "kv_pool_too_small", "killed"} <= FATAL_KINDS


def test_capture_sub_steps_do_not_pass_through_starting_http():
    parsed = parse_log(read("piecewise-to-serving.log"))
    rows = [(r["phase"], r["step"]) for r in parsed["timeline"]]
    assert rows == [("launching", None), ("loading_weights", None),
                    ("allocating_kv_cache", None), ("capturing_cuda_graph", "decode"),
                    ("capturing_cuda_graph", "piecewise"), ("starting_http", None),
                    ("warming_up", None), ("serving", None)]
    # The capture's ceiling counts from its first sub-step.
    mid = read("piecewise-capture.log")
    first = next(r["at"] for r in parse_log(mid)["timeline"]
                 if r["phase"] == "capturing_cuda_graph")
    assert parse_log(mid)["phase_started_at"] == first


def test_a_new_sub_steps_bar_restarting_at_zero_is_still_progress():
    text = read("0523-prefill-then-decode.log")
    before = parse_log(upto(text, "Capture target decode CUDA graph begin"))
    after = parse_log(text)
    assert before["progress"] is None  # prefill's finished bar is not decode's progress
    assert after["progress_ticks"] > before["progress_ticks"]


def test_glued_lines_are_split_and_keep_their_stamps():
    parsed = parse_log(read("glued-bar-next-line.log"))
    row = next(r for r in parsed["timeline"] if r["phase"] == "allocating_kv_cache")
    assert row["line"].startswith("[2026-08-01 12:01:46 TP0] Load weight end.")
    assert row["at"] == time.mktime((2026, 8, 1, 12, 1, 46, 0, 0, -1))


def test_time_only_stamps_roll_over_midnight():
    parsed = parse_log(read("time-only-stamps.log"),
                       now=time.mktime((2026, 12, 1, 6, 0, 0, 0, 0, -1)))
    ats = [r["at"] for r in parsed["timeline"]]
    assert ats == sorted(ats)
    assert ats[-1] - ats[0] == 3 * 60 + 31  # 23:58:40 -> 00:02:11


def test_docker_timestamps_date_the_bars():
    parsed = parse_log(read("docker-timestamps.log"))
    assert parsed["last_line_is_bar"] is False
    assert parsed["last_line_at"] == calendar.timegm((2026, 11, 30, 10, 21, 47, 0, 0, 0))


def test_traceback_source_lines_are_not_failures():
    parsed = parse_log(read("nccl-error-init.log"))
    assert not any("raise RuntimeError" in f["line"] for f in parsed["failures"])


def test_a_launch_that_logs_its_arguments_twice_is_one_run():
    text = ("[2026-01-01 00:00:00] server_args=ServerArgs(tp_size=1)\n"
            "[2026-01-01 00:00:00] server_args=ServerArgs(tp_size=1)\n"
            "[2026-01-01 00:00:09] Load weight begin. avail mem=70.00 GB\n")
    assert count_runs(text) == 1
    assert current_run(text) == text


def test_a_separator_leaves_an_earlier_runs_fatal_line_out_whatever_the_clocks():
    # The gate reads the current run from its separator (and from the byte offset the start
    # recorded): the log's stamps, which a TZ offset shifts by hours, never decide.
    old = read("killed-during-load.log")
    new = (f"\n{RUN_SEPARATOR}n1:m-30000 config abc at 2026-11-30T06:30:00 =====\n"
           "[2026-11-30 03:30:01] server_args=ServerArgs(tp_size=8)\n"
           "[2026-11-30 03:30:40 TP0] Load weight begin. avail mem=93.51 GB\n")
    parsed = parse_log(old + new)
    assert fatal_failures(parsed) == [] and parsed["phase"] == "loading_weights"


def test_fatal_failures_leave_out_lines_older_than_the_start():
    # A log appended to across restarts without a separator (systemd's append:) keeps the
    # previous run's lines until the new run prints its arguments.
    text = read("killed-during-load.log").replace("Killed", "[2026-11-30 06:20:00] Killed")
    parsed = parse_log(text + "[2026-11-30 06:40:00] Received sigquit from a child process. "
                              "It usually means the child failed.\n")
    started = time.mktime((2026, 11, 30, 6, 30, 0, 0, 0, -1))
    assert [f["kind"] for f in fatal_failures(parsed, since=started)] == ["child_failed"]
    assert len(fatal_failures(parsed)) == 2


def test_phase_timeline_keeps_its_rows_for_the_evidence_bundle():
    rows = phase_timeline(read("sglang-0.5.23-startup.log"))
    assert [p for p, _ in rows] == list(PHASES)
    assert rows[1][1].startswith("[2026-11-30 00:28:40 TP0] Load weight begin")


def test_the_docs_state_every_failure_kind_and_whether_it_is_fatal():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "verdicts.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| .*? \| (yes|no) \| ", docs, re.M)
    assert dict(rows) == {row[0]: "yes" if row[1] else "no" for row in FAILURES}


# ---- what a failure says -------------------------------------------------------------------

def test_a_traceback_per_rank_is_one_failure_named_by_its_final_line_ranks_and_line():
    parsed = parse_log(read("keyerror-tp8-per-rank.log"))
    first = parsed["failures"][0]
    assert first["count"] == 8 and first["ranks"] == [f"TP{r}" for r in range(8)]
    assert parsed["cause"]["said"] == ("TP0-7: KeyError: 'model.layers.0.mlp.experts.w2_qweight'"
                                       " (log line 14)")
    assert read("keyerror-tp8-per-rank.log").splitlines()[13].startswith("KeyError: ")
    assert parsed["failures_total"] == 10


def test_a_kind_the_grammar_does_not_name_still_shows_its_exception():
    cause = parse_log(read("triton-out-of-resources.log"))["cause"]
    assert cause["kind"] == "scheduler_exception"
    assert cause["said"].startswith("TP0: triton.runtime.errors.OutOfResources: out of "
                                    "resource: shared memory")


def test_known_kinds_keep_their_own_message_and_hint():
    cause = parse_log(read("kv-no-memory-0523-configurator.log"))["cause"]
    assert cause["kind"] == "kv_pool_too_small"
    assert cause["said"].startswith("TP0-1: ValueError: Loaded weights leave no GPU memory for "
                                    "the KV cache under --mem-fraction-static=0.8. Raise")
    assert "raise --mem-fraction-static" in cause["hint"]


def test_the_04_overlap_thread_and_its_sigquit_are_fatal():
    parsed = parse_log(read("tpworker-client-044.log"))
    assert parsed["fatal"] and parsed["cause"]["kind"] == "scheduler_exception"
    assert parsed["cause"]["said"].startswith(
        "TP0: RuntimeError: forward thread failed (the chain began with: RuntimeError: CUDA "
        "error: an illegal memory access was encountered)")
    assert [f["kind"] for f in parsed["failures"]][1] == "child_failed"  # "proces." (sic)


def test_a_dp8_server_decoding_for_clients_is_serving():
    assert parse_log(read("dp8-decoding-tail.log"))["phase"] == "serving"
    # Warm-up's one request per rank is not serving.
    warm = ("[2026-01-01 00:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 6, "
            "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0,\n"
            "[2026-01-01 00:00:01 TP0] Decode batch, #running-req: 1, #token: 7, token usage: "
            "0.00, gen throughput (token/s): 9.10, #queue-req: 0\n")
    assert parse_log(warm)["phase"] == "warming_up"


def test_sglangs_own_kill_of_its_tree_is_not_blamed_on_the_oom_killer():
    parsed = parse_log(read("keyerror-tp8-per-rank.log"))
    killed = next(f for f in parsed["failures"] if f["kind"] == "killed")
    assert killed["after_sglang_failure"] and parsed["cause"]["kind"] != "killed"
    assert "SGLang killed its own process tree" in failures_grammar.hint(killed, "loading_weights")
    # A Killed with nothing before it: the log alone cannot name the OOM killer.
    alone = parse_log(read("killed-zh-locale.log"))["cause"]
    assert alone["kind"] == "killed" and alone["said"] == "已杀死 (log line 7)"
    assert "kernel log says whether the OOM killer" in alone["hint"]


def test_oom_while_loading_weights_says_the_weights_do_not_fit_with_the_numbers():
    hint = parse_log(read("oom-loading-weights-16gb.log"))["cause"]["hint"]
    assert hint.startswith("the weights do not fit on the GPUs: GPU 0 has 15.57 GiB in all, "
                           "310.00 MiB free, with 14.71 GiB already loaded, and loading asked "
                           "for 1.88 GiB more")
    assert "does not help" in hint
    # The same OOM in graph capture is about the memory fraction.
    capture = parse_log(read("warning-level-kv-oom.log"))["cause"]
    assert "weights do not fit" not in (capture["hint"] or "")


@pytest.mark.parametrize("name,rank", [("ecc-error-serving.log", "TP3"),
                                       ("hsa-hardware-exception.log", None)])
def test_gpu_errors_in_the_log_are_gpu_faults(name, rank):
    cause = parse_log(read(name))["cause"]
    assert cause["kind"] in failures_grammar.GPU_FAULT_KINDS
    assert cause.get("rank") == rank


@pytest.mark.parametrize("name", ["sigterm-drain-stop.log", "graceful-exit-ready-before.log"])
def test_a_requested_stop_is_a_stop_and_its_exits_are_not_failures(name):
    parsed = parse_log(read(name))
    assert parsed["stop"] is not None and not parsed["fatal"]
    assert all(f.get("during_stop") for f in parsed["failures"])


def test_the_request_log_never_forges_a_failure():
    text = read("log-requests-quoting-failures.log")
    # The fixture's prompts quote a line of every kind the grammar knows...
    quoted = [q.replace("\\'", "'") for q in
              re.findall(r"Please explain this log line:\\n(.*?)', input_ids", text)]
    for kind, _, _, pattern, _ in FAILURES:
        if pattern:
            assert any(re.match(pattern, q) for q in quoted), kind
    # ...and none of them is a failure: they are client data in SGLang's request records.
    parsed = parse_log(text)
    assert parsed["failures"] == [] and parsed["phase"] == "serving"


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_every_string_from_the_log_is_inert():
    parsed = parse_log(read("escape-sequences-in-lines.log"))
    for text in _strings(parsed):
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text), text
    assert "\\x1b]0;title\\x07\\x00\\x9b31m" in parsed["cause"]["said"]


def test_a_finished_sub_step_shows_its_final_count():
    parsed = parse_log(read("lagging-rank-bars.log"))
    rows = [(r["phase"], r["progress"] and f"{r['progress']['done']}/{r['progress']['total']}")
            for r in parsed["timeline"]]
    assert rows == [("launching", None), ("loading_weights", "2/2"),
                    ("allocating_kv_cache", None), ("capturing_cuda_graph", "23/23"),
                    ("starting_http", None)]
    assert parsed["progress"] is None and parsed["shards"] == [2, 2]


def test_an_unnamed_exception_in_an_attention_backend_is_named_by_its_final_line():
    """A TypeError raised building the attention backend's ForwardMetadata while capturing,
    from both ranks: one failure, named by the exception's own final line, not by the
    scheduler's `Traceback (most recent call last):` header."""
    parsed = parse_log(read("forwardmetadata-typeerror-capture.log"))
    cause = parsed["cause"]
    assert cause["kind"] == "scheduler_exception" and parsed["fatal"]
    assert cause["said"] == ("TP0-1: TypeError: ForwardMetadata.__init__() got an unexpected "
                             "keyword argument 'num_kv_splits' (log line 16)")
    assert read("forwardmetadata-typeerror-capture.log").splitlines()[15].startswith(
        "TypeError: ForwardMetadata")
    assert parsed["failures"][0]["count"] == 2


# ---- a multi-node group's rendezvous ---------------------------------------------------------

def test_the_ranks_of_each_node_as_sglang_places_them():
    from sglang_fleet.node.logs.logphase import node_ranks
    assert node_ranks(1, 2, 16, 1) == [f"TP{t}" for t in range(8, 16)]
    assert node_ranks(0, 2, 16, 1) == [f"TP{t}" for t in range(8)]
    # pp across nodes: each node holds one stage's whole TP group
    assert node_ranks(1, 2, 8, 2) == [f"PP1 TP{t}" for t in range(8)]
    assert node_ranks(2, 4, 16, 2) == [f"PP1 TP{t}" for t in range(8)]


def test_ranks_waiting_at_the_rendezvous_name_the_ranks_they_wait_for():
    parsed = parse_log(read("rendezvous-waiting-0523.log"))
    assert parsed["phase"] == "launching" and not parsed["failures"]
    assert parsed["rendezvous"] == {"addr": "10.0.0.11:20000", "here": "TP0-7",
                                    "missing": "TP8-15", "node_ranks": [1]}
    assert progress_text(parsed) == ("launching: TP0-7 wait at the rendezvous on "
                                     "10.0.0.11:20000 for TP8-15 (node rank 1)")


def test_a_single_node_server_or_a_finished_rendezvous_waits_for_no_one():
    single = read("rendezvous-waiting-0523.log").replace("'nnodes': 2", "'nnodes': 1")
    assert parse_log(single)["rendezvous"] is None
    ended = read("rendezvous-waiting-0523.log") + "".join(
        f"[2026-12-01 09:01:02 TP{r}] Init parallel ends. elapsed=31.20 s\n" for r in range(8))
    assert parse_log(ended)["rendezvous"] is None


@pytest.mark.parametrize("name, kind, said", [
    ("rendezvous-store-timeout-0523.log", "dist_init_timeout",
     "TP0: torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. "
     "8/16 clients joined. (log line 37)"),
    ("rendezvous-client-timeout-0523.log", "dist_init_timeout",
     "TP8-9: torch.distributed.DistNetworkError: The client socket has timed out after "
     "600000ms while trying to connect to (10.0.0.11, 20000). (log line 37)"),
    ("dist-store-port-in-use-0523.log", "dist_store_bind_failed",
     "TP0: torch.distributed.DistNetworkError: The server socket has failed to listen on any "
     "local network address. port: 20000, useIpv6: false, code: -98, name: EADDRINUSE, "
     "message: address already in use (log line 30)"),
])
def test_the_stores_errors_end_the_launch_with_their_own_text_and_hint(name, kind, said):
    parsed = parse_log(read(name))
    cause = parsed["cause"]
    assert (cause["kind"], cause["said"]) == (kind, said)
    assert cause["hint"] == failures_grammar.FAILURE_HINTS[kind]
    assert parsed["rendezvous"] is None, "a failed launch waits for no one"


def test_nccls_teardown_lines_are_the_nccl_timeout_they_follow():
    parsed = parse_log(read("nccl-teardown-serving-0523.log"))
    assert parsed["cause"]["said"].startswith("rank3: [Rank 3] Watchdog caught collective "
                                              "operation timeout")
    messages = [f["message"] for f in parsed["failures"] if f["kind"] == "nccl_timeout"]
    assert messages[1].startswith("[Rank 3] Some NCCL operations have failed or timed out.")
    assert messages[2] == ("[Rank 3] To avoid data inconsistency, we are taking the entire "
                           "process down.")


def test_a_watchdog_after_a_hung_generation_is_the_cause_not_the_health_check():
    parsed = parse_log(read("watchdog-generation-hang-0523.log"))
    assert parsed["cause"]["kind"] == "watchdog_timeout"
    assert parsed["cause"]["said"] == ("TP0-1: Scheduler watchdog timeout "
                                       "(self.watchdog_timeout=300, self.soft=False) (log line 13)")
    assert parsed["cause"]["hint"] == "a forward batch hung for --watchdog-timeout seconds"


def test_the_detokenizers_exception_ends_the_server_with_its_final_line():
    cause = parse_log(read("detokenizer-exception-serving-0523.log"))["cause"]
    assert cause["kind"] == "subprocess_exception"
    assert cause["said"].startswith("RuntimeError: Decode status not found for request ")


def test_the_phase_of_a_cuda_oom_comes_from_sglangs_frames_when_its_lines_are_hidden():
    # With the phase lines filtered out (a log level, a wrapper's grep), the traceback's frames
    # (kv_cache_configurator.py, alloc_memory_pool) still place the failure.
    text = "\n".join(line for line in read("cuda-oom-expandable-segments-0523.log").splitlines()
                     if "Load weight" not in line)
    parsed = parse_log(text)
    assert parsed["phase"] == "allocating_kv_cache"
    assert parsed["cause"]["kind"] == "cuda_oom"
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in parsed["cause"]["said"]


def test_startup_warning_timings_and_queue_full_503s_are_not_failures():
    parsed = parse_log(read("queue-full-overload-0523.log"))
    assert parsed["phase"] == "serving" and parsed["failures"] == []
    assert not parsed["fatal"]


# ---- four shapes of real public logs -------------------------------------------------------

def test_a_watchdog_timeout_after_clients_were_answered_is_serving_not_launching():
    parsed = parse_log(read("watchdog-serving-access-only.log"))
    assert parsed["phase"] == "serving"
    assert parsed["cause"]["kind"] == "watchdog_timeout"
    # A health probe alone, or a single answer, says nothing of serving.
    assert parse_log('[2026-01-01 10:00:00] INFO:     10.0.0.1:1 - "GET /health HTTP/1.1" '
                     '200 OK\n')["phase"] == "launching"
    # The hard watchdog exists only once the model worker started: at least starting_http.
    alone = parse_log("[2026-01-01 10:00:00 TP0] Watchdog timeout "
                      "(self.watchdog_timeout=300)\n")
    assert alone["phase"] == "starting_http"


def test_an_ecc_error_said_through_nccls_watchdog_and_custom_all_reduce_is_the_cause():
    parsed = parse_log(read("ecc-nccl-watchdog-custom-allreduce.log"))
    assert parsed["cause"]["kind"] == "gpu_error"
    assert "uncorrectable ECC error encountered" in parsed["cause"]["said"]
    assert "nvidia-smi -q -d ECC" in parsed["cause"]["hint"]
    # An illegal memory access through the same watchdog is not the GPU's fault.
    other = parse_log("[rank1]:[E1209 02:28:15.281862353 ProcessGroupNCCL.cpp:2057] [PG ID 2 "
                      "PG GUID 3 Rank 1] Process group watchdog thread terminated with "
                      "exception: CUDA error: an illegal memory access was encountered\n")
    assert [f["kind"] for f in other["failures"]] != ["gpu_error"]


def test_a_draft_models_own_capture_keeps_its_progress():
    parsed = parse_log(read("speculative-draft-capture-glued-jit.log"))
    assert (parsed["phase"], parsed["step"]) == ("capturing_cuda_graph", "draft decode")
    assert parsed["progress"] == {"done": 12, "total": 36, "unit": "batches"}
    assert parsed["capture"] == [12, 36]


def test_a_failed_warm_up_after_a_first_batch_never_served():
    parsed = parse_log(read("warmup-error-after-first-batch.log"))
    assert parsed["phase"] == "warming_up"
    assert [r["phase"] for r in parsed["timeline"]][-1] == "warming_up"
    assert parsed["cause"]["kind"] == "warmup_failed"
    # The ready line before a failure keeps it serving: it did serve.
    served = read("warmup-error-after-first-batch.log").replace(
        "[2026-12-05 16:11:25] Initialization failed.",
        "[2026-12-05 16:01:26] The server is fired up and ready to roll!\n"
        "[2026-12-05 16:11:25] Initialization failed.")
    assert parse_log(served)["phase"] == "serving"


def test_the_prefills_of_health_probes_are_counted_apart_from_clients():
    text = read("sglang-0.5.23-startup.log")
    probe = ("[2026-11-30 00:40:00 TP0] Prefill batch, #new-seq: 1, #new-token: 1, "
             "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, "
             "#pending-token: 0, cuda graph: True, input throughput (token/s): 0.10\n")
    client = probe.replace("#new-token: 1,", "#new-token: 812,")
    parsed = parse_log(text + probe * 3 + client)
    assert parsed["probe_prefills"] == 3
    assert parsed["meaningful_lines"] == parse_log(text)["meaningful_lines"] + 4
