"""Hang signatures from the ranks' sampled stacks, and the gate's stack rule: no progress and
every rank's stack on the same frames is stalled long before the phase's window."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sglang_fleet.node.health import stacks
from sglang_fleet.node.health.classify import classify

REF = Path("/work/main/.cache/sglang-ref/sglang-0.5.23/sglang")
WINDOWS = {p: 600 for p in ("launching", "loading_weights", "allocating_kv_cache",
                            "capturing_cuda_graph", "starting_http", "warming_up")}
CEILINGS = {p: 3600 for p in WINDOWS}
T0 = 1_000_000.0


def f(function, file, line=1):
    return {"function": function, "file": file, "line": line}


CAPTURE = [f("hang", "sglang_fleet/sim/scheduler.py"),
           f("capture_one_shape", "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"),
           f("_capture_one_stream",
             "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py")]
IN_ALL_REDUCE = [f("all_reduce", "torch/distributed/distributed_c10d.py"),
                 f("all_reduce", "sglang/srt/distributed/parallel_state.py"), *CAPTURE[1:]]
PEER_WAIT = [f("broadcast", "torch/distributed/distributed_c10d.py"),
             f("broadcast_pyobj", "sglang/srt/utils/common.py"),
             f("recv_requests", "sglang/srt/managers/scheduler_components/request_receiver.py"),
             f("event_loop_overlap", "sglang/srt/managers/scheduler.py")]
DEEP_GEMM = [f("wait", "subprocess.py"),
             f("_compile_deep_gemm_one_type_all",
               "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py")]
WEIGHTS = [f("get_tensor", "safetensors/torch.py", 3),
           f("_load_file", "sglang/srt/model_loader/weight_utils.py")]
DETOKENIZER = [f("acquire", "threading.py"),
               f("handle_batch_token_id_out", "sglang/srt/managers/detokenizer_manager.py"),
               f("event_loop", "sglang/srt/managers/detokenizer_manager.py")]


@pytest.mark.parametrize("frames,key", [
    (CAPTURE, "cuda_graph_capture"),
    (IN_ALL_REDUCE, "nccl_collective"),  # the innermost marked frame decides
    (PEER_WAIT, "scheduler_peer_wait"),  # a broadcast inside recv_requests: its peer
    (DEEP_GEMM, "jit_compilation"),
    (WEIGHTS, "weight_io"),
    (DETOKENIZER, "detokenizer_deadlock"),
    ([f("select", "selectors.py"), f("run_forever", "asyncio/base_events.py")], None),
])
def test_each_stack_is_named_by_its_sglang_frames(frames, key):
    sig, _ = stacks.signature_of(frames)
    assert (sig.key if sig else None) == key


def test_a_rank_waiting_in_a_collective_points_at_the_rank_stuck_elsewhere():
    history = {label: [{"pid": n, "at": 0, "key": stacks.stack_key(fr), "frames": fr}]
               for n, (label, fr) in enumerate((("TP1", IN_ALL_REDUCE), ("TP0", CAPTURE),
                                                ("TP2", IN_ALL_REDUCE)))}
    read = stacks.read_signature(history, list(history))
    assert read["signature"] == "cuda_graph_capture" and read["rank"] == "TP0"
    assert read["waiting"] == ["TP1", "TP2"]
    assert "capture_one_shape" in read["frame"]
    assert "TP1, TP2 wait for it in a NCCL collective" in read["text"]


@pytest.mark.skipif(not REF.is_dir(), reason="SGLang 0.5.23's source is not installed")
def test_every_signature_names_functions_of_the_files_it_cites():
    """Each row's frames are functions defined in the file it cites: SGLang 0.5.23's own, and
    torch's of the release's pin where it cites torch."""
    torch = next(REF.parent.parent.glob("venv/lib/python3*/site-packages/torch"), None)
    for sig in stacks.SIGNATURES:
        for suffix, names, release in sig.frames:
            if release == stacks.SGLANG:
                path = REF / suffix
            elif release == stacks.TORCH and torch is not None:
                path = torch.parent / suffix
            else:
                continue  # 0.5.4.post3, flashinfer, triton, safetensors: not installed here
            source = path.read_text()
            assert suffix in sig.source
            for name in names or ():
                assert f"def {name}(" in source, (suffix, name)


def sample(frames, pid=10):
    return {"pid": pid, "at": 0, "frames": frames}


def obs(stacks_now=None, shards=0, compilers=0, error=None, health=None, phase=None,
        probes=0):
    members = [{"pid": 10, "state": "S", "cmdline": "sglang::scheduler_TP0"},
               {"pid": 11, "state": "S", "cmdline": "sglang::scheduler_TP1"}]
    members += [{"pid": 50 + i, "state": "S", "cmdline": "nvcc -O3 kernel.cu"}
                for i in range(compilers)]
    members += [{"pid": s["pid"], "state": "S", "cmdline": "sglang::" + label}
                for label, s in (stacks_now or {}).items() if s["pid"] not in (10, 11)]
    return {"run_id": T0, "started": True, "started_at": T0, "processes": members,
            "main_alive": True, "serves_http": True, "port_open": health is not None,
            "health": health, "health_s": 25.0 if health else None, "gpu_memory_used": 0,
            "xids": [], "exit_status": None, "stacks_error": error,
            "stacks": [{"at": 0, "samples": stacks_now}] if stacks_now else [],
            "log": {"phase": phase or "capturing_cuda_graph", "shards": None,
                    "capture": [shards, 36], "failures": [], "progress_ticks": 0,
                    "meaningful_lines": 5 + probes, "probe_prefills": probes,
                    "error_lines": [], "last_lines": ["..."]}}


def hung_ranks():
    return {"TP0": sample(CAPTURE, 10), "TP1": sample(IN_ALL_REDUCE, 11)}


def replay(sequence, window=30):
    state, verdicts = None, []
    for t, o in sequence:
        verdict, state = classify(state, o, T0 + t, WINDOWS, CEILINGS, window)
        verdicts.append(verdict)
    return verdicts


def test_frozen_stacks_with_no_progress_are_stalled_within_a_minute_not_the_window():
    # Progress until t=20, then the capture hangs; a sample of every rank every 10 s.
    seq = [(t, obs(hung_ranks(), shards=min(t, 20) // 10)) for t in range(0, 90, 10)]
    verdicts = replay(seq)
    stalled = next(i for i, v in enumerate(verdicts) if v["verdict"] == "stalled")
    decided = seq[stalled][0]
    assert decided - 20 <= 60 and decided - 20 >= 30  # within a minute, never before 30 s
    v = verdicts[stalled]
    assert v["signature"] == "cuda_graph_capture" and v["phase"] == "capturing_cuda_graph"
    assert "capture_one_shape" in v["reason"] and "TP1 waits for it" in v["reason"]
    assert v["evidence"]["stacks"]["rank"] == "TP0"


def test_stacks_that_move_leave_it_to_the_window():
    moving = [{"TP0": sample(CAPTURE if t % 20 else DEEP_GEMM, 10),
               "TP1": sample(IN_ALL_REDUCE, 11)} for t in range(0, 200, 10)]
    seq = [(t, obs(moving[i])) for i, t in enumerate(range(0, 200, 10))]
    assert {v["verdict"] for v in replay(seq)} == {"progressing"}


def test_a_compiler_child_is_progress_while_the_rank_waits_on_it():
    # A 23-minute DeepGEMM warm-up: the rank's stack never changes, NVCC works under it.
    jit = {"TP0": sample(DEEP_GEMM, 10), "TP1": sample(IN_ALL_REDUCE, 11)}
    seq = [(t, obs(jit, compilers=1)) for t in range(0, 23 * 60, 10)]
    assert {v["verdict"] for v in replay(seq)} == {"progressing"}


def test_sampling_off_is_said_once_and_the_window_still_judges():
    seq = [(t, obs(error="py-spy was not found")) for t in range(0, 700, 10)]
    verdicts = replay(seq)
    said = [v for v in verdicts if v.get("stack_sampling")]
    assert len(said) == 1 and "py-spy was not found" in said[0]["stack_sampling"]
    assert "judged by the phases' windows" in said[0]["stack_sampling"]
    assert verdicts[-1]["verdict"] == "stalled" and "window 600 s" in verdicts[-1]["reason"]
    assert all(v["verdict"] == "progressing" for v in verdicts[:55])


def test_a_serving_deadlock_is_stalled_naming_where_it_waits():
    deadlock = {"TP0": sample(IN_ALL_REDUCE[:2], 10), "TP1": sample(PEER_WAIT, 11)}
    seq = [(t, obs(deadlock, health=503 if t else 200, phase="serving"))
           for t in range(0, 60, 10)]
    verdicts = replay(seq)
    assert verdicts[1]["verdict"] == "unhealthy"  # before its stacks have been seen still
    v = next(v for v in verdicts if v["verdict"] == "stalled")
    assert v["phase"] == "serving" and v["signature"] == "nccl_collective"
    assert "TP1 waits for it in a scheduler waiting on a peer rank" in v["reason"]


def test_frames_are_masked_like_a_log_line():
    frame = stacks._frame({"name": "Scheduler.run\x1b[2J", "short_filename":
                           "sglang/srt/x.py --api-key sk-123"}, ["sk-123"])
    assert frame["function"] == "run\\x1b[2J"
    assert "sk-123" not in frame["file"] and "********" in frame["file"]


def test_a_probe_wait_ends_only_when_the_stacks_have_decided_and_nothing_moved():
    """The node's sampler stops waiting on /health once the stacks decided; not when this
    observation itself shows progress (the classifier judges that)."""
    from sglang_fleet.node.health.classify import progressed

    _, state = classify(None, obs(hung_ranks()), T0, WINDOWS, CEILINGS, 30)
    before = {"signals": state["signals"]}
    assert progressed(before, obs(hung_ranks())) == []
    assert "capture_done" in progressed(before, obs(hung_ranks(), shards=30))
    history = {}
    for wall in (100.0, 110.0, 120.0):
        history = stacks.merge(history, hung_ranks(), wall - 99, wall)
    assert stacks.frozen(history, ["TP0", "TP1"], 100.0, clock="wall")
    assert not stacks.frozen(history, ["TP0", "TP1"], 105.0, clock="wall")  # 2 since then


def test_frames_no_signature_names_are_left_to_the_window():
    own = [f("forward", "my_model/layers.py"), f("load_model", "my_model/loader.py")]
    unknown = {"TP0": sample(own, 10), "TP1": sample(own, 11)}
    seq = [(t, obs(unknown)) for t in range(0, 200, 10)]
    assert {v["verdict"] for v in replay(seq)} == {"progressing"}


def test_a_group_waiting_at_its_rendezvous_is_left_to_the_window():
    o = obs(hung_ranks())
    o["log"]["rendezvous"] = {"here": "TP0-7", "addr": "10.0.0.1:20000", "missing": "TP8-15",
                              "node_ranks": [1]}
    assert {v["verdict"] for v in replay([(t, o) for t in range(0, 200, 10)])} == {
        "progressing"}


IDLE = [f("wait", "threading.py"), f("serve", "sglang_fleet/sim/engine/scheduler.py")]


def test_a_deadlocked_detokenizer_is_stalled_though_the_schedulers_print_each_probe():
    # Serving; the detokenizer deadlocks at t=0. Each /health probe's one-token request is
    # still prefilled (one batch line per poll), its answer never comes back.
    hung = {"TP0": sample(IDLE, 10), "TP1": sample(IDLE, 11),
            "detokenizer": sample(DETOKENIZER, 12)}
    seq = [(t, obs(hung, health=503, phase="serving", probes=t // 10))
           for t in range(0, 80, 10)]
    v = next(v for v in replay(seq) if v["verdict"] == "stalled")
    assert v["signature"] == "detokenizer_deadlock"
    assert v["evidence"]["stacks"]["rank"] == "detokenizer"
    assert "handle_batch_token_id_out" in v["reason"]


def test_a_compile_lock_waited_on_with_no_compiler_is_stalled_as_jit():
    lock_wait = [f("_local_rank_compile_lock",
                   "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"),
                 f("__enter__", "contextlib.py"),
                 f("_maybe_compile_deep_gemm_one_type_all",
                   "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py")]
    ranks = {"TP0": sample(lock_wait, 10), "TP1": sample(lock_wait, 11)}
    v = next(v for v in replay([(t, obs(ranks)) for t in range(0, 80, 10)])
             if v["verdict"] == "stalled")
    assert v["signature"] == "jit_compilation"
    assert "_maybe_compile_deep_gemm_one_type_all" in v["reason"]


def test_the_detokenizer_is_sampled_beside_the_schedulers(tmp_path):
    # The deployment's processes are found by the marker its children inherit; the
    # detokenizer (a child of the launcher) is one, sampled under its own label.
    dump = json.dumps([{"thread_name": "MainThread", "active": False, "frames": [
        {"name": "DetokenizerManager.handle_batch_token_id_out",
         "short_filename": "sglang/srt/managers/detokenizer_manager.py", "line": 462}]}])
    py_spy = tmp_path / "py-spy"
    py_spy.write_text(f"#!/bin/sh\ncat <<'EOF'\n{dump}\nEOF\n")
    py_spy.chmod(0o755)
    members = [{"pid": os.getpid(), "cmdline": "sglang::detokenizer"}]
    samples, cost = stacks.sample_ranks(str(py_spy), members, {}, 100.0)
    assert list(samples) == ["detokenizer"] and cost["samples"] == 1
    assert samples["detokenizer"]["frames"][0]["function"] == "handle_batch_token_id_out"
