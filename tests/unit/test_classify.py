"""The verdict classifier on recorded signal sequences."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sglang_fleet.node.common.vocab import VERDICTS, default_windows
from sglang_fleet.node.health.classify import classify
from sglang_fleet.node.health.observe import xids_and_ooms
from sglang_fleet.node.logs.logphase import parse_log

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

WINDOWS = {p: 10 for p in ("launching", "loading_weights", "allocating_kv_cache",
                           "capturing_cuda_graph", "starting_http", "warming_up")}
CEILINGS = {p: 1000 for p in WINDOWS}
T0 = 1_000_000.0


def obs(phase="loading_weights", shards=None, capture=None, lines=5, rchar=0, cpu=0, syscw=0,
        alive=True, health=None, port=False, gpu=0, xids=(), exit_status=None, run=T0,
        serves_http=True, state="S", failures=(), ticks=0, members=1):
    members = [{"pid": 10 + i, "state": state, "rchar": rchar if i == 0 else 0,
                "utime_ticks": cpu if i == 0 else 0, "stime_ticks": 0,
                "syscw": syscw if i == 0 else 0} for i in range(members)] if alive else []
    return {
        "run_id": run, "started": True, "started_at": run, "processes": members,
        "main_alive": alive, "serves_http": serves_http, "port_open": port, "health": health,
        "gpu_memory_used": gpu, "xids": list(xids), "exit_status": exit_status,
        "last_log_activity": None, "phase_started_at": None,
        "log": {"phase": phase, "shards": shards, "capture": capture,
                "failures": list(failures), "progress_ticks": ticks,
                "meaningful_lines": lines, "error_lines": [], "last_lines": ["..."]},
    }


def replay(sequence):
    """Feed (seconds after T0, observation) pairs; return the verdicts."""
    state, verdicts = None, []
    for t, o in sequence:
        verdict, state = classify(state, o, T0 + t, WINDOWS, CEILINGS)
        verdicts.append(verdict)
    return verdicts


def test_weights_loading_steadily_is_progressing_throughout():
    seq = [(t, obs(shards=[t // 5, 61], rchar=t * (1 << 30))) for t in range(0, 300, 5)]
    assert {v["verdict"] for v in replay(seq)} == {"progressing"}


def test_bytes_read_alone_keep_a_slow_shard_progressing():
    # One huge shard takes longer than the window, but the process keeps reading from disk.
    seq = [(t, obs(shards=[3, 61], rchar=t * (50 << 20))) for t in range(0, 60, 5)]
    assert replay(seq)[-1]["verdict"] == "progressing"


def test_flat_capture_with_busy_wait_is_stalled_after_the_window():
    seq = [(0, obs("capturing_cuda_graph", capture=[1, 36], cpu=0, syscw=0))]
    seq += [(t, obs("capturing_cuda_graph", capture=[1, 36], cpu=t * 100, syscw=t, rchar=t,
                    state="R")) for t in range(1, 15)]
    verdicts = replay(seq)
    first_stalled = next(i for i, v in enumerate(verdicts) if v["verdict"] == "stalled")
    assert seq[first_stalled][0] == 11  # window 10 s, observed every second
    v = verdicts[first_stalled]
    assert v["phase"] == "capturing_cuda_graph"
    assert "busy_wait" in v["evidence"] and "spinning" in v["evidence"]["busy_wait"]
    assert "capture_done" in v["evidence"]["flat_signals"]
    assert v["evidence"]["process_states"] == ["R"]


def test_a_slow_health_probe_after_a_moving_log_is_not_a_stall():
    # The log was read at the observation's start and had moved; /health then hung for 30 s
    # on a port that accepts and never answers. Quiet is measured to the read, not past it.
    first = obs(shards=[1, 64], port=True)
    moved = dict(obs(shards=[3, 64], port=True), read_at=T0 + 1, observed_at=T0 + 31)
    verdicts = replay([(0, first), (31, moved)])
    assert verdicts[-1]["verdict"] == "progressing", verdicts[-1].get("reason")


def test_capture_bar_moving_is_progress_even_with_the_cpu_busy():
    seq = [(t, obs("capturing_cuda_graph", capture=[t // 4, 36], cpu=t * 100))
           for t in range(0, 60, 2)]
    assert {v["verdict"] for v in replay(seq)} == {"progressing"}


def test_ceiling_stops_a_phase_that_trickles_forever():
    ceilings = dict(CEILINGS, loading_weights=30)
    state = None
    for t in range(0, 40, 2):
        verdict, state = classify(state, obs(lines=5 + t), T0 + t, WINDOWS, ceilings)
    assert verdict["verdict"] == "stalled" and "over its ceiling" in verdict["reason"]


def test_dead_main_process_is_crashed_with_status_and_lines():
    v = replay([(0, obs()), (3, obs(alive=False, exit_status=1))])[-1]
    assert v["verdict"] == "crashed" and v["exit_status"] == 1
    assert "last_lines" in v["evidence"]


def test_serving_with_failing_health_is_unhealthy():
    assert replay([(0, obs("serving", port=True, health=200))])[-1]["verdict"] == "ready"
    v = replay([(0, obs("serving", port=True, health=503))])[-1]
    assert v["verdict"] == "unhealthy" and "503" in v["reason"]
    assert "timed out" in replay([(0, obs("serving", port=True))])[-1]["reason"]


def test_warming_up_with_503_is_still_progressing():
    v = replay([(0, obs("warming_up", port=True, health=503))])[-1]
    assert v["verdict"] == "progressing"


def test_xid_is_a_gpu_fault_with_nvidias_action():
    xid = {"code": 79, "line": "NVRM: Xid (PCI:0000:01:00): 79", "action":
           "reboot or power-cycle the node", "device": "PCI:0000:01:00", "at": T0}
    v = replay([(0, obs(xids=[xid]))])[-1]
    assert v["verdict"] == "gpu_fault" and "power-cycle" in v["reason"]


def test_nothing_started_is_absent():
    o = obs(alive=False)
    o.update(started=False, run_id=None)
    assert replay([(0, o)])[-1]["verdict"] == "absent"


def test_non_http_rank_is_ready_once_its_workers_finished():
    v = replay([(0, obs("starting_http", serves_http=False))])[-1]
    assert v["verdict"] == "ready"


def test_a_new_start_forgets_the_previous_runs_history():
    seq = [(t, obs(lines=5)) for t in range(0, 12)]  # flat: stalled at 11 s
    assert replay(seq)[-1]["verdict"] == "stalled"
    seq.append((12, obs(lines=1, run=T0 + 12)))
    assert replay(seq)[-1]["verdict"] == "progressing"


def test_first_look_uses_the_log_files_age_on_the_nodes_clock():
    o = obs("capturing_cuda_graph", capture=[1, 36])
    o["log_age_s"] = 3600  # an hour-old hang seen for the first time
    v, _ = classify(None, o, T0, WINDOWS, CEILINGS)
    assert v["verdict"] == "stalled"


def test_default_windows_scale_with_model_size():
    big, _ = default_windows(1000)
    small, _ = default_windows(8)
    assert big["capturing_cuda_graph"] == 600 and small["loading_weights"] < big["loading_weights"]
    assert set(VERDICTS) == {"ready", "progressing", "stalled", "crashed", "unhealthy",
                             "gpu_fault", "stopped", "absent"}


# ---- fatal failure lines are verdicts --------------------------------------------------------

def failure(kind, fatal, line, at=T0 + 1):
    return {"kind": kind, "fatal": fatal, "line": line, "message": line, "at": at}


SCHEDULER_DIED = failure("scheduler_exception", True,
                         "[2026-11-30 04:02:10 DP1 TP0] Scheduler hit an exception: Traceback "
                         "(most recent call last):")


def test_a_fatal_line_while_processes_live_is_crashed_at_the_next_poll():
    seq = [(t, obs("capturing_cuda_graph", capture=[t, 36], lines=5 + t, members=9))
           for t in range(0, 4)]
    seq.append((4, obs("capturing_cuda_graph", capture=[4, 36], lines=12, members=9,
                       failures=[SCHEDULER_DIED])))
    verdicts = replay(seq)
    assert [v["verdict"] for v in verdicts] == ["progressing"] * 4 + ["crashed"]
    v = verdicts[-1]
    assert v["exit_status"] is None and v["phase"] == "capturing_cuda_graph"
    assert v["reason"] == SCHEDULER_DIED["line"] + "; 9 of its processes are still running"
    assert v["headline"].startswith("crashed in capturing_cuda_graph: ")
    assert v["evidence"]["fatal_line"] == SCHEDULER_DIED["line"]
    assert v["evidence"]["processes_alive"] == 9


def test_a_fatal_line_beats_a_health_200_when_a_generation_fails():
    o = obs("serving", port=True, health=200, failures=[SCHEDULER_DIED])
    o["health_generate"] = 503
    v = replay([(0, o)])[-1]
    assert v["verdict"] == "crashed" and v["evidence"]["health_generate"] == 503


def test_a_fatal_line_never_crashes_a_server_that_generates():
    # The log and the server disagree: one line of text is not enough to kill a server that
    # answers /health and a one-token /health_generate.
    o = obs("serving", port=True, health=200, failures=[SCHEDULER_DIED])
    o["health_generate"] = 200
    v = replay([(0, o)])[-1]
    assert v["verdict"] == "ready"
    assert "/health and /health_generate answered 200, though the log reads as " \
           "scheduler_exception" in v["reason"]
    assert v["evidence"]["log_disagrees"]["kind"] == "scheduler_exception"


@pytest.mark.parametrize("kind,line,phase,health,expected", [
    ("health_check_failed", "[2026-11-30 03:12:21] Health check failed. Server couldn't get a "
     "response from detokenizer for last 20 seconds.", "serving", 200, "ready"),
    ("soft_watchdog_timeout", "[2026-11-30 01:20:11] TokenizerManager watchdog timeout "
     "(self.watchdog_timeout=300, self.soft=True)", "serving", 200, "ready"),
    ("traceback", "ValueError: The input (300000 tokens) is longer than the model's context "
     "length (262144 tokens).", "serving", 200, "ready"),
    ("memory_unbalanced_warning", "[2026-10-10 10:10:31 TP3] The memory capacity is "
     "unbalanced. Some GPUs may be occupied by other processes.", "loading_weights", None,
     "progressing"),
])
def test_non_fatal_warnings_never_crash(kind, line, phase, health, expected):
    o = obs(phase, port=health is not None, health=health,
            failures=[failure(kind, False, line)])
    assert replay([(0, o)])[-1]["verdict"] == expected


def test_an_exited_server_reports_its_cause_and_exit_status():
    log = parse_log((LOGS / "nccl-error-init.log").read_text())
    o = obs(alive=False, exit_status=1)
    o["log"] = log
    v = replay([(0, o)])[-1]
    assert v["verdict"] == "crashed" and v["exit_status"] == 1
    assert v["reason"].startswith("TP2: RuntimeError: NCCL error: unhandled system error")
    assert v["reason"].endswith("; the server exited (status 1)")
    assert v["cause"] == "configuration" and v["failure"]["kind"] == "nccl_error"


def test_dp2_scheduler_death_from_the_real_log_shape_is_crashed_with_its_line():
    log = parse_log((LOGS / "dp2-scheduler-oom-alive.log").read_text())
    o = obs("capturing_cuda_graph", members=10)
    o["log"] = log
    o["run_id"] = o["started_at"] = time.mktime((2026, 9, 22, 7, 0, 0, 0, 0, -1))
    v, _ = classify(None, o, o["started_at"] + 60, WINDOWS, CEILINGS)
    assert v["verdict"] == "crashed"
    assert v["evidence"]["fatal_line"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert v["reason"].startswith("DP1 TP0: torch.OutOfMemoryError: CUDA out of memory. Tried "
                                  "to allocate 2.00 GiB.")
    assert [f["kind"] for f in v["evidence"]["failures"]] == ["cuda_oom"]


def oom_kill(pid, at=T0 + 20):
    return {"at": at, "pid": pid, "name": "sglang::schedul",
            "line": f"Out of memory: Killed process {pid} (sglang::schedul) total-vm:4123kB, "
                    f"anon-rss:9876kB, file-rss:0kB, shmem-rss:0kB, UID:0 oom_score_adj:0"}


def test_oom_killed_scheduler_while_the_main_process_lives_is_crashed_at_once():
    # dp_size > 1: the OOM killer takes a scheduler (it prints nothing); the controller and the
    # main process live on, so only the kernel log says what happened.
    before = obs("capturing_cuda_graph", capture=[3, 36], members=4)
    after = obs("capturing_cuda_graph", capture=[3, 36], members=3)  # pid 13 is gone
    after["oom_kills"] = [oom_kill(13)]
    v = replay([(0, before), (25, after)])[-1]
    assert v["verdict"] == "crashed" and v["exit_status"] is None
    assert v["reason"].startswith("the kernel's OOM killer killed pid 13 (host memory)")
    assert v["reason"].endswith("; 3 of its processes are still running")
    assert v["evidence"]["fatal_line"].startswith("Out of memory: Killed process 13 ")
    assert v["cause"] == "environment"


def test_the_observation_names_the_pid_of_each_kernel_oom_kill():
    lines = [(T0, oom_kill(4242)["line"]),
             (T0 + 1, "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
                      "mems_allowed=0-1,global_oom,task_memcg=/,task=python3,pid=5151,uid=0")]
    _, ooms = xids_and_ooms(lines, set())
    assert [(k["pid"], k["name"]) for k in ooms] == [(4242, "sglang::schedul"), (5151, "python3")]


def test_oom_kill_of_another_process_on_the_node_is_not_this_servers_failure():
    seq = [(0, obs("capturing_cuda_graph", capture=[3, 36], members=4))]
    other = obs("capturing_cuda_graph", capture=[4, 36], members=4)
    other["oom_kills"] = [oom_kill(4242)]
    seq.append((5, other))
    assert replay(seq)[-1]["verdict"] == "progressing"


def test_an_oom_kill_before_the_gates_first_look_is_still_the_node_fault():
    # Under load the gate's first look comes after the kernel killed a scheduler: its pid was
    # never seen. The server then died of it; a kill of an SGLang process since this start is
    # taken as its own, and the reason says the gate never saw it.
    dead = obs(alive=False, exit_status=1, failures=[{
        "kind": "child_failed", "fatal": True, "line": "Received sigquit from a child process.",
        "message": "Received sigquit from a child process."}])
    dead["log"]["cause"] = dead["log"]["failures"][0]
    dead["oom_kills"] = [oom_kill(4242)]
    v = replay([(5, dead)])[-1]
    assert v["verdict"] == "crashed" and v["cause"] == "environment"
    assert v["reason"].startswith("the kernel's OOM killer killed pid 4242, an SGLang process "
                                  "killed after this start that the gate never saw")
    # A process of another name is not taken for the server's.
    dead["oom_kills"] = [dict(oom_kill(4242), name="python3")]
    assert replay([(5, dead)])[-1]["cause"] != "environment"


SCHEDULER_DIED_AT_INIT = """\
[2026-12-03 10:00:00] server_args=ServerArgs(model_path='/models/m', tp_size=8)
[2026-12-03 10:00:06 TP0] Load weight begin. avail mem=94.50 GB
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/sglang/launch_server.py", line 32, in <module>
    run_server(server_args)
  File "/usr/lib/python3/sglang/srt/entrypoints/engine.py", line 1990, in \
_wait_for_scheduler_ready
    raise _scheduler_died_error(rank, proc)
RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 \
(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.
"""


def test_sglangs_scheduler_died_error_is_a_consequence_the_oom_killer_explains():
    # SGLang 0.5.23's main process names a scheduler that died before it was ready; the
    # kernel's OOM kill of it (seen by the gate or not) is the cause, not the configuration.
    dead = obs(alive=False, exit_status=1)
    dead["log"] = parse_log(SCHEDULER_DIED_AT_INIT)
    assert dead["log"]["cause"]["kind"] == "subprocess_exited"
    dead["oom_kills"] = [oom_kill(4242)]
    v = replay([(5, dead)])[-1]
    assert v["verdict"] == "crashed" and v["cause"] == "environment"
    assert v["reason"].startswith("the kernel's OOM killer killed pid 4242")


def test_health_200_during_warm_up_is_ready():
    # /health answers 200 only after warm-up succeeded; the ready line may not be in the log
    # (not yet written, or gone from a long-running server's tail).
    assert replay([(0, obs("warming_up", port=True, health=200))])[-1]["verdict"] == "ready"


def test_a_new_capture_sub_step_restarting_its_bar_is_progress():
    # prefill 12/12, then decode's bar restarts at 1/36: the capture count went down, the
    # monotonic bar ticks went up.
    seq = [(0, obs("capturing_cuda_graph", capture=[12, 12], ticks=12)),
           (12, obs("capturing_cuda_graph", capture=[1, 36], ticks=13)),
           (24, obs("capturing_cuda_graph", capture=[2, 36], ticks=14))]
    verdicts = replay(seq)
    assert [v["verdict"] for v in verdicts] == ["progressing"] * 3
    assert "progress_ticks" in verdicts[1]["moved"]


# ---- time: the node's monotonic clock, never the log's ---------------------------------------

def _variant(text: str, variant: str) -> str:
    """The log as a server with another clock would write it."""
    import re as _re
    if variant == "no_stamps":
        return _re.sub(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( [A-Z0-9 ]+)?\] ", "", text, flags=_re.M)
    hours = {"tz_3h_behind": -3, "tz_3h_ahead": 3}.get(variant, 0)

    def shift(m):
        at = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + hours * 3600
        return "[" + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return _re.sub(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", shift, text, flags=_re.M)


@pytest.mark.parametrize("variant", ["tz_3h_behind", "tz_3h_ahead", "no_stamps", "clock_step"])
def test_the_logs_clock_and_a_clock_step_never_change_a_verdict(variant):
    """A server whose TZ is 3 h off the node's, a log without stamps, or the node's wall clock
    stepping by 3 h: the same verdicts at the same moments as the log written in step."""
    lines = (LOGS / "sglang-0.5.23-startup.log").read_text().splitlines(keepends=True)[:12]

    def verdicts(kind):
        state, out = None, []
        for t in range(0, 30):
            grown = min(t + 1, len(lines))  # a line a second, then a hang
            o = obs("loading_weights", alive=True)
            o["log"] = parse_log(_variant("".join(lines[:grown]), kind))
            o["log_age_s"] = max(0, t - (grown - 1))  # the file's mtime on the node's clock
            o["wall_now"] = T0 + t + (10800 if kind == "clock_step" and t >= 15 else 0)
            v, state = classify(state, o, T0 + t, WINDOWS, CEILINGS)
            out.append((v["verdict"], v["phase"], round(v["quiet_s"])))
        return out

    expected = verdicts("as_written")
    assert verdicts(variant) == expected
    first_stall = next(t for t, v in enumerate(expected) if v[0] == "stalled")
    assert first_stall == len(lines) - 1 + WINDOWS["capturing_cuda_graph"] + 1


# ---- causes, stops, GPU errors in the log -------------------------------------------------

def exited(name, status=1, **extra):
    o = obs(alive=False, exit_status=status)
    o["log"] = parse_log((LOGS / name).read_text())
    o.update(extra)
    return replay([(0, o)])[-1]


def test_a_sigkill_from_outside_is_external_and_never_blamed_on_the_oom_killer():
    v = exited("killed-zh-locale.log", status=137)
    assert v["verdict"] == "crashed" and v["cause"] == "external"
    assert v["reason"].startswith("killed by SIGKILL from outside SGLang: the log has no fatal "
                                  "line from SGLang and the kernel log no OOM kill")
    assert "OOM killer sent it" in v["advice"] and "find who sent it" in v["advice"]
    # The same log with the kernel's kill of one of its processes: the host's memory.
    o = obs(alive=False, exit_status=137)
    o["log"] = parse_log((LOGS / "killed-zh-locale.log").read_text())
    o["oom_kills"] = [oom_kill(10)]
    v = replay([(0, obs()), (5, o)])[-1]
    assert v["cause"] == "environment"
    assert v["reason"].startswith("the kernel's OOM killer killed pid 10 (host memory)")


def test_sglangs_own_tree_kill_leaves_the_childs_error_as_the_cause():
    v = exited("keyerror-tp8-per-rank.log", status=137)
    assert v["cause"] == "configuration"
    assert v["reason"].startswith("TP0-7: KeyError: 'model.layers.0.mlp.experts.w2_qweight'")


def test_a_full_disk_and_a_reboot_are_the_nodes_faults():
    assert exited("disk-full-loading.log")["cause"] == "environment"
    v = exited("killed-during-load.log", status=None, boot_changed=True)
    assert v["cause"] == "environment" and v["reason"].startswith("the node rebooted")


def test_a_frozen_process_is_an_external_stall_with_its_fix():
    seq = [(t, obs(lines=5, state="T")) for t in range(0, 12)]
    v = replay(seq)[-1]
    assert v["verdict"] == "stalled" and v["cause"] == "external"
    assert "stopped (state T: SIGSTOP or a debugger)" in v["reason"]
    assert "send SIGCONT" in v["advice"]


def test_a_gpu_error_in_the_log_is_a_gpu_fault_naming_the_rank():
    v = exited("ecc-error-serving.log")
    assert v["verdict"] == "gpu_fault" and v["cause"] == "hardware"
    assert v["reason"].startswith("TP3: RuntimeError: CUDA error: uncorrectable ECC error")


def test_a_recorded_stop_and_a_drained_sigterm_are_stopped_not_crashed():
    v = exited("sglang-0.5.23-startup.log", status=0,
               stopped={"at": T0, "by": "stop.yml"})
    assert v["verdict"] == "stopped" and v["stopped_by"] == "stop.yml"
    assert v["headline"].startswith("stopped: stopped by stop.yml at ")
    v = exited("sigterm-drain-stop.log", status=143)
    assert v["verdict"] == "stopped" and v["stopped_by"] == "SIGTERM"
    assert "stopped by a SIGTERM from outside sglang-fleet (log line 4: " in v["reason"]
    # A crash before the SIGTERM stays a crash.
    assert exited("nccl-error-init.log", status=1)["verdict"] == "crashed"


# ---- a multi-node group whose other node never started -----------------------------------

def test_ranks_waiting_at_the_rendezvous_are_progressing_then_stalled_naming_the_missing():
    waiting = parse_log((LOGS / "rendezvous-waiting-0523.log").read_text())
    seq = [(t, obs("launching", members=10)) for t in range(0, 14)]
    for _, o in seq:
        o["log"] = waiting
    verdicts = replay(seq)
    names = "TP0-7 wait at the rendezvous on 10.0.0.11:20000 for TP8-15 (node rank 1)"
    assert verdicts[0]["verdict"] == "progressing"
    assert verdicts[0]["reason"].startswith("launching: " + names)
    stalled = verdicts[-1]
    assert stalled["verdict"] == "stalled" and stalled["phase"] == "launching"
    assert stalled["reason"].endswith("; " + names)
    assert stalled["advice"].startswith("a rank or node never joined: check that every node of "
                                        "the group started")
    assert stalled["evidence"]["rendezvous"]["missing"] == "TP8-15"
    assert "ready" not in {v["verdict"] for v in verdicts}


def test_after_the_store_timeout_the_group_is_crashed_with_torchs_own_text():
    log = parse_log((LOGS / "rendezvous-store-timeout-0523.log").read_text())
    o = obs("launching", alive=False, exit_status=137)
    o["log"] = log
    v = replay([(0, o)])[-1]
    assert v["verdict"] == "crashed" and v["phase"] == "launching"
    assert v["reason"].startswith("TP0: torch.distributed.DistStoreError: Timed out after 601 "
                                  "seconds waiting for clients. 8/16 clients joined.")
    assert v["failure"]["kind"] == "dist_init_timeout" and v["cause"] == "configuration"
    assert v["advice"].startswith("a rank or node never joined")


def test_a_server_its_watchdog_ended_after_a_hang_is_crashed_while_serving():
    log = parse_log((LOGS / "watchdog-generation-hang-0523.log").read_text())
    o = obs("serving", alive=False, exit_status=137)
    o["log"] = log
    v = replay([(0, o)])[-1]
    assert v["verdict"] == "crashed" and v["phase"] == "serving"
    assert v["failure"]["kind"] == "watchdog_timeout"
    assert v["reason"].startswith("TP0-1: Scheduler watchdog timeout (self.watchdog_timeout=300, "
                                  "self.soft=False)")


def test_a_server_answering_queue_full_503s_is_ready_not_unhealthy():
    # SGLang refuses what is past --max-queued-requests with 503; its own /health still
    # answers 200: the refusals are load, not a health failure.
    log = parse_log((LOGS / "queue-full-overload-0523.log").read_text())
    assert log["failures"] == [] and log["cause"] is None
    o = obs("serving", port=True, health=200)
    o["log"] = log
    v = replay([(0, o)])[-1]
    assert v["verdict"] == "ready" and v["phase"] == "serving"


def test_a_cuda_oom_with_torchs_process_memory_is_crashed_in_the_kv_cache_allocation():
    log = parse_log((LOGS / "cuda-oom-expandable-segments-0523.log").read_text())
    o = obs("allocating_kv_cache", alive=False, exit_status=137)
    o["log"] = log
    v = replay([(0, o)])[-1]
    assert v["verdict"] == "crashed" and v["phase"] == "allocating_kv_cache"
    assert v["failure"]["kind"] == "cuda_oom"
    assert "Including non-PyTorch memory, this process has 93.40 GiB memory in use." \
        in v["reason"]
    assert v["advice"].startswith("lower --mem-fraction-static")


def test_a_503_at_once_while_the_log_shows_requests_is_still_starting_not_unhealthy():
    """A router that never took a restarting server out sends it requests before its warm-up
    ends: the log shows them served, while /health answers 503 at once (SGLang's Starting
    status), not after the second its generation check waits at least."""
    early = obs("serving", port=True, health=503)
    early["health_s"] = 0.004
    v = replay([(0, early)])[-1]
    assert v["verdict"] == "progressing" and v["phase"] == "serving", v
    late = obs("serving", port=True, health=503)
    late["health_s"] = 3.01  # SGLANG_HEALTH_CHECK_TIMEOUT=3: the generation failed
    assert replay([(0, late)])[-1]["verdict"] == "unhealthy"
    # Serving's window (300 s by default) still holds a server that never comes Up.
    stuck = [(t, early) for t in range(0, 400, 10)]
    assert replay(stuck)[-1]["verdict"] == "stalled"


# ---- faults that are not the configuration's at start-up ----------------------------------

def test_a_scheduler_sigkilled_while_loading_without_an_oom_line_is_external():
    # SGLang 0.5.23's main process reports the scheduler's death with its exit code; with no
    # OOM kill in the kernel log the kill came from outside, not from the configuration.
    dead = obs(alive=False, exit_status=1)
    dead["log"] = parse_log(SCHEDULER_DIED_AT_INIT)
    v = replay([(5, dead)])[-1]
    assert v["verdict"] == "crashed" and v["cause"] == "external"
    assert v["reason"].startswith("a scheduler was killed by SIGKILL from outside SGLang in "
                                  "loading_weights (SGLang: RuntimeError: Rank 0 scheduler died")
    assert "the kernel log no OOM kill of its processes" in v["reason"]
    assert "find who sent it" in v["advice"]


def test_an_unreadable_kernel_log_is_said_and_the_kill_is_not_the_configurations():
    # A container without /dev/kmsg: a real OOM kill leaves no line the node can read.
    dead = obs(alive=False, exit_status=1)
    dead["log"] = parse_log(SCHEDULER_DIED_AT_INIT)
    dead["kernel_log_error"] = "/dev/kmsg: No such file or directory"
    v = replay([(5, dead)])[-1]
    assert v["cause"] == "external"
    assert ("the kernel log could not be read (/dev/kmsg: No such file or directory), so a "
            "kill by the kernel's OOM killer cannot be told from one by another process"
            in v["reason"])


def test_a_port_taken_while_loading_is_the_nodes_fault_naming_the_holder():
    o = obs(alive=False, exit_status=1)
    o["log"] = parse_log((LOGS / "bind-failed.log").read_text())
    o["port_holders"] = {"port": 30000, "held": True,
                         "holders": ["4242 (python3 -m http.server 30000)"]}
    v = replay([(0, o)])[-1]
    assert v["verdict"] == "crashed" and v["cause"] == "environment"
    assert "address already in use (log line 5); port 30000 is held by 4242 (python3 -m " \
           "http.server 30000)" in v["reason"]
    assert v["failure"]["holders"] == ["4242 (python3 -m http.server 30000)"]
    assert "stop the program that holds port 30000" in v["advice"]
    assert "configuration" not in v["cause"]


def test_an_ecc_error_through_nccls_watchdog_is_a_gpu_fault_not_a_process_abort():
    v = exited("ecc-nccl-watchdog-custom-allreduce.log", status=134)
    assert v["verdict"] == "gpu_fault" and v["cause"] == "hardware"
    assert "uncorrectable ECC error encountered" in v["reason"]
