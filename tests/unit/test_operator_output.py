"""What an operator reads: verdicts in words, reasons never cut and said once, a line at
least every heartbeat while anything runs, watch intervals start to start, charts that say
what they measured."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from sglang_fleet.bench.report import config_row, draw_chart
from sglang_fleet.cli.watch import watch_loop
from sglang_fleet.node.common.vocab import verdict_phrase
from sglang_fleet.node.health.classify import classify
from sglang_fleet.runs.outcomes import host_outcomes, stage_of
from sglang_fleet.runs.progress import Progress
from sglang_fleet.runs.reasons import group_by_reason, shorten, wrap
from sglang_fleet.runs.summary import build_summary, host_table

ROLE = "/p/roles/sglang_server/tasks/"
GATE_ACTION = "sglang.fleet.sglang_health"
# A refused typo as the LaunchSpec words it: long, with the fix near the end.
TYPO = ("host {h}: sglang_server_attention_backend='flashinfr': is not one of SGLang 0.5.23's "
        "choices for --attention-backend. Fix: 'flashinfer' is the closest, but rule "
        "flashinfer-mla-sm120-graph-capture-hang refuses it on this hardware: set "
        "sglang_server_attention_backend: 'triton'. valid: triton, torch_native, "
        "flex_attention, dsa, nsa, qsa, dsv4, compressed, fa3, fa4, flashinfer, flashmla, "
        "trtllm_mla, cutedsl_mla, trtllm_mha, aiter, wave, intel_amx, ascend, intel_xpu")


def ev(kind, host, path, action="x", task="t", uuid="u1", **res):
    return {"event": kind, "event_data": {"host": host, "task_path": path + ":3",
                                          "task_action": action, "task": task,
                                          "task_uuid": uuid, "res": res}}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- verdicts in words -------------------------------------------------------------------

def test_a_verdict_names_its_phase_only_where_it_says_where_the_server_is():
    assert verdict_phrase("absent", "launching") == "absent"
    assert verdict_phrase("ready", "serving") == "ready"
    assert verdict_phrase("stalled", "capturing_cuda_graph") == "stalled in capturing_cuda_graph"
    assert verdict_phrase("unhealthy", "serving") == "unhealthy while serving"


def observation(phase="loading_weights", shards=(3, 64), started=True, alive=True):
    log = {"phase": phase, "meaningful_lines": 10, "shards": list(shards), "capture": None,
           "progress": {"done": shards[0], "total": shards[1], "unit": "shards"},
           "failures": [], "error_lines": [], "last_lines": [], "progress_ticks": 0,
           "fatal": []}
    return {"log": log, "processes": [{"pid": 1, "state": "S", "utime_ticks": 1}] if alive
            else [], "main_alive": alive, "started": started, "started_at": 900.0,
            "run_id": 900.0, "log_age_s": 10.0, "run_age_s": 100.0}


def test_a_progressing_verdict_says_the_time_left_in_its_window():
    verdict, _ = classify(None, observation(), 1000.0, {"loading_weights": 300},
                          {"loading_weights": 7200})
    assert verdict["verdict"] == "progressing"
    assert (verdict["window_s"], verdict["ceiling_s"]) == (300, 7200)
    assert verdict["quiet_s"] == 10.0 and verdict["stalls_in_s"] == 290.0
    assert verdict["stalls_by"] == "window"
    assert verdict["headline"] == ("progressing: loading_weights 3/64 shards, last progress "
                                   "10 s ago; 4 min 50 s left in its 300 s window")
    # Near its ceiling, the ceiling is what is left (first seen, the phase counts from the
    # log file's last change).
    verdict, _ = classify(None, observation(), 1000.0, {"loading_weights": 300},
                          {"loading_weights": 20})
    assert verdict["stalls_by"] == "ceiling" and verdict["stalls_in_s"] == 10.0
    assert verdict["reason"].endswith("10 s left before its 20 s ceiling")


def test_an_absent_server_is_not_glued_to_a_phase():
    verdict, _ = classify(None, observation("launching", started=False, alive=False), 1000.0,
                          {}, {})
    assert verdict["headline"].startswith("absent: no record of this deployment starting")


# ---- reasons: whole, said once -------------------------------------------------------------

def test_wrapping_never_breaks_a_word_and_keeps_the_fix():
    text = TYPO.format(h="n1")
    lines = wrap(text, width=60)
    assert all(len(x) <= 60 or " " not in x.strip() for x in lines)
    assert " ".join(x.strip() for x in lines) == text
    assert shorten(text, 60).endswith(" ...") and len(shorten(text, 60)) <= 60
    assert shorten(text, 60)[:-4] == text[:len(shorten(text, 60)) - 4]  # cut between words


def test_the_same_refusal_on_four_hosts_is_one_reason_naming_them():
    groups = group_by_reason([(h, TYPO.format(h=h)) for h in ("n-10", "n-2", "n-3", "n-1")]
                             + [("n-5", "host n-5: sglang_server_tp=16: too big. Fix: 8")])
    assert groups[0] == (["n-1", "n-2", "n-3", "n-10"], TYPO.format(h="x")[len("host x: "):])
    assert groups[1] == (["n-5"], "sglang_server_tp=16: too big. Fix: 8")
    limit = group_by_reason([(h, f"{h}: absent: x. Fix: deploy it (deploy --limit {h})")
                             for h in ("a", "b")])
    assert limit == [(["a", "b"], "absent: x. Fix: deploy it (deploy --limit a,b)")]


def refused_summary(hosts):
    events = [ev("runner_on_failed", h, ROLE + "spec.yml", "assert", msg=TYPO.format(h=h))
              for h in hosts]
    outcomes = host_outcomes(events, {"failures": {h: 1 for h in hosts}})
    return build_summary("deploy", 2, outcomes, 0.0, 1.0, "/run")


def test_the_table_never_cuts_the_fix_and_says_a_shared_reason_once():
    table = host_table(refused_summary(["sim-node-1", "sim-node-2", "sim-node-3",
                                        "sim-node-4"]), width=100)
    lines = table.splitlines()
    assert all("LaunchSpec refused (below)" in x for x in lines[1:5])
    flat = " ".join(x.strip() for x in lines[5:])
    assert "sim-node-1, sim-node-2, sim-node-3, sim-node-4 (the same on 4 hosts):" in flat
    assert TYPO.format(h="x")[len("host x: "):] in flat, "the reason is whole"
    assert flat.count("Fix: 'flashinfer' is the closest") == 1
    assert all(len(x) <= 100 for x in lines[5:])
    # In a log (no width), each problem is one whole line.
    plain = host_table(refused_summary(["a", "b"])).splitlines()
    assert plain[-1] == "    " + TYPO.format(h="x")[len("host x: "):]


def test_a_long_failure_detail_is_cut_between_words_and_given_whole_below():
    reason = ("the new server cannot start here: log folder /var/log/sglang has 0 B free "
              "(64.0 MiB needed). Fix: free space there (or move sglang_server_root).")
    events = [ev("runner_on_failed", "a", ROLE + "service.yml", "sglang.fleet.sglang_service",
                 msg=f"a:Kimi-K2.5-30001: {reason}")]
    table = host_table(build_summary("deploy", 2, host_outcomes(events, {"failures": {"a": 1}}),
                                     0.0, 1.0, "/run"))
    row = table.splitlines()[1]
    assert row.rstrip().endswith("...") and "Fix" not in row
    cell = row.split("failed", 2)[-1].strip()[:-4]
    assert (f"a:Kimi-K2.5-30001: {reason}").startswith(cell), "cut between words"
    assert "Fix: free space there (or move sglang_server_root)." in " ".join(
        x.strip() for x in table.splitlines()[2:])


# ---- live progress -------------------------------------------------------------------------

def test_progress_says_a_refusal_once_for_every_host_it_refuses():
    out = io.StringIO()
    progress = Progress(out, tty=False, clock=Clock())
    hosts = ["sim-node-1", "sim-node-2", "sim-node-3", "sim-node-4"]
    for h in hosts:
        progress(ev("runner_on_start", h, ROLE + "spec.yml", "assert"))
    for h in hosts:
        progress(ev("runner_on_failed", h, ROLE + "spec.yml", "assert", msg=TYPO.format(h=h)))
    progress({"event": "playbook_on_stats", "event_data": {}})
    failed = [x for x in out.getvalue().splitlines() if x.startswith("FAILED")]
    assert failed == ["FAILED [sim-node-1, sim-node-2, sim-node-3, sim-node-4] LaunchSpec "
                      "refused (the same on 4 hosts): sglang_server_attention_backend; the "
                      "reasons, each with its fix, follow the table"]


def test_progress_prints_failures_whole():
    out = io.StringIO()
    progress = Progress(out, tty=False, clock=Clock())
    long = "a: stalled in capturing_cuda_graph: " + "word " * 80 + "Fix: the end"
    progress(ev("runner_on_failed", "a", ROLE + "gate.yml", "fail", "Fail", msg=long))
    assert out.getvalue().rstrip().endswith("Fix: the end")


def gate(host, verdict="progressing", phase="loading_weights", done=3, quiet=0.0, left=300.0):
    return ev("runner_retry", host, ROLE + "observe.yml", GATE_ACTION, verdict=verdict,
              phase=phase, progress_text=f"{phase} {done}/64 shards", quiet_s=quiet,
              stalls_in_s=left, stalls_by="window", window_s=300, ceiling_s=7200)


def test_plain_progress_shows_each_stage_and_phase_and_a_line_every_heartbeat():
    clock = Clock()
    out = io.StringIO()
    progress = Progress(out, tty=False, heartbeat_s=30, clock=clock)
    shown: list[tuple[float, str]] = []

    def collect():
        shown.extend((clock.now, x) for x in out.getvalue().splitlines()[len(shown):])

    def run(event=None, seconds=0.0):
        if event:
            progress(event)
            collect()
        for _ in range(int(seconds)):
            clock.now += 1
            progress.tick()
            collect()

    run(ev("runner_on_start", "a", ROLE + "service.yml", task="Start the server"))
    run(ev("runner_on_ok", "a", ROLE + "service.yml", task="Start the server"))
    run(ev("runner_on_start", "a", ROLE + "service.yml", task="Wait for the unit"), 65)
    run(ev("runner_on_ok", "a", ROLE + "service.yml", task="Wait for the unit"))
    run(ev("runner_on_start", "a", ROLE + "observe.yml", GATE_ACTION, task="Gate"))
    for done in range(4, 30, 2):  # progress every 2 s: one line for the phase, then beats
        run(gate("a", done=done), 2)
    run(gate("a", phase="capturing_cuda_graph", done=0))
    run(gate("a", phase="capturing_cuda_graph", done=0, quiet=0.0, left=300.0), 70)
    lines = [x for _, x in shown]
    assert lines[0] == "[a] deploy: Start the server"
    # A task that keeps the host quiet is named after 10 s, then shown every 30 s.
    assert lines[1:3] == ["[a] deploy: Wait for the unit (10 s in deploy, 10 s in this task)",
                          "[a] deploy: Wait for the unit (40 s in deploy, 40 s in this task)"]
    # The gate: a line when the phase changes, progress in between after 10 s, then only
    # at the heartbeat.
    loading = [x for x in lines if x.startswith("GATE [a] progressing: loading_weights")]
    assert loading[0].startswith("GATE [a] progressing: loading_weights 4/64 shards")
    assert loading[1].startswith("GATE [a] progressing: loading_weights 12/64 shards, last "
                                 "progress 2 s ago")
    assert len(loading) == 2
    # A stall: the countdown moves on between the gate's observations.
    capture = [x for x in lines if "capturing_cuda_graph" in x]
    assert [x.split("; ", 1)[1] for x in capture] == [
        "5 min 00 s left in its 300 s window", "4 min 50 s left in its 300 s window",
        "4 min 20 s left in its 300 s window", "3 min 50 s left in its 300 s window"]
    assert capture[1].endswith("last progress 10 s ago; 4 min 50 s left in its 300 s window")
    # Never more than 30 s without a line while the host is busy.
    times = [t for t, _ in shown]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) <= 30


def test_nothing_to_say_about_any_host_still_says_the_run_is_alive():
    clock = Clock()
    out = io.StringIO()
    progress = Progress(out, tty=False, heartbeat_s=30, clock=clock)
    for _ in range(61):
        clock.now += 1
        progress.tick()
    assert out.getvalue().splitlines() == ["... still running (30 s so far)",
                                           "... still running (1 min 00 s so far)"]


def test_the_heartbeat_runs_by_itself_in_a_run():
    out = io.StringIO()
    with Progress(out, tty=False, heartbeat_s=0.4) as progress:
        progress(ev("runner_on_start", "a", ROLE + "service.yml", task="Start the server"))
        deadline = time.monotonic() + 10
        while "in this task" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "[a] deploy: Start the server (0 s in deploy, 0 s in this task)" in out.getvalue()


# ---- watch: start to start -----------------------------------------------------------------

@pytest.mark.parametrize("takes,starts", [(3.0, [0, 5, 10, 15]), (10.8, [0, 10.8, 21.6, 32.4]),
                                          (5.0, [0, 5, 10, 15])])
def test_watch_observes_every_interval_start_to_start(takes, starts):
    clock = Clock()
    began = clock.now
    seen: list[float] = []

    def observe(number: int) -> None:
        seen.append(round(clock.now - began, 1))
        clock.now += takes

    def sleep(seconds: float) -> None:
        clock.now += seconds

    count = watch_loop(observe, 5.0, 4, None, lambda: False, clock=clock, sleep=sleep)
    assert count == 4 and seen == starts


def test_watch_stops_between_observations_and_after_its_duration():
    clock = Clock()
    seen: list[float] = []

    def observe(number: int) -> None:
        seen.append(clock.now)
        clock.now += 1

    def sleep(seconds: float) -> None:
        clock.now += seconds

    assert watch_loop(observe, 5.0, None, 12.0, lambda: False, clock=clock, sleep=sleep) == 3
    assert watch_loop(observe, 5.0, None, None, lambda: len(seen) >= 5, clock=clock,
                      sleep=sleep) == 2


# ---- charts --------------------------------------------------------------------------------

def entry(tok_s, spread, config):
    return {"config_hash": config, "simulated": True, "host": "sim-node-1",
            "hardware": {"model": "Kimi-K2.5", "tp": 8, "gpu_count": 8,
                         "gpu_model": "RTX PRO 6000 Blackwell", "nnodes": 1},
            "benchmark": {"input_len": 1024, "output_len": 256, "levels": [{
                "concurrency": 1, "ttft_s": {"median": 0.18}, "itl_s": {"p50": 0.016,
                                                                        "p99": 0.017},
                "output_tok_s": {"median": tok_s, "min": tok_s - spread,
                                 "max": tok_s + spread, "n": 3}}]}}


def test_a_chart_says_what_was_measured_and_keeps_values_clear_of_the_whiskers():
    import matplotlib.pyplot as plt

    rows = [config_row("baseline", {}, "ready", entry(63.8, 4.0, "aaaaaaaaaaaa"), 63.8,
                       host="sim-node-1"),
            config_row("flashinfer", {}, "stalled in capturing_cuda_graph; stopped", None,
                       63.8, host="sim-node-1", config_hash="bbbbbbbbbbbb"),
            config_row("tuned", {}, "ready", entry(90.3, 0.2, "cccccccccccc"), 63.8,
                       host="sim-node-1")]
    fig = draw_chart(rows, "Incident sweep", simulated=True, subject="sweep x.yml on sim-node-1")
    try:
        ax = fig.axes[0]
        title = ax.get_title()
        assert "Kimi-K2.5 TP=8 on 8x RTX PRO 6000 Blackwell" in title
        assert "sweep x.yml on sim-node-1" in title and "median of 3 runs" in title
        assert "concurrency 1, 1024 tokens in, 256 out" in title and "SIMULATED" in title
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks == ["baseline\nconfig aaaaaaaaaaaa", "flashinfer\nconfig bbbbbbbbbbbb",
                         "tuned\nconfig cccccccccccc"]
        labels = {t.get_text().split("\n")[0]: t.get_position()[1] for t in ax.texts}
        # Each value sits above the top of its whisker (the fastest run), not on it.
        assert labels["63.8 (59.8-67.8)"] > 67.8 and labels["90.3 (90.1-90.5)"] > 90.5
        assert any("stalled in" in t.get_text() and "not measured" in t.get_text()
                   for t in ax.texts)
    finally:
        plt.close(fig)


def test_the_bisect_example_and_its_documentation_name_the_same_host():
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    example = (repo / "examples/experiments/bisect-bad.yml").read_text()
    readme = (repo / "docs" / "benchmarks.md").read_text()
    in_example = re.findall(r"bisect-bad\.yml --limit (\S+)", example)
    in_readme = re.findall(r"bisect-bad\.yml --limit (\S+)", readme)
    assert in_example and in_readme and set(in_example) == set(in_readme)
    assert set(re.findall(r"^bisect on (\S+):", readme, re.M)) == set(in_example)


def test_each_step_of_the_deploy_stage_gets_a_line():
    out = io.StringIO()
    progress = Progress(out, tty=False, clock=Clock())
    for step in ("install", "install", "preflight", "configure", "service"):
        progress(ev("runner_on_ok", "a", ROLE + f"{step}.yml", task=f"a task of {step}"))
    progress(ev("runner_on_ok", "a", ROLE + "gate.yml", task="Gate"))
    progress(ev("runner_on_ok", "a", ROLE + "observe.yml", task="Observe"))
    assert out.getvalue().splitlines() == [
        "[a] deploy: a task of install", "[a] deploy: a task of preflight",
        "[a] deploy: a task of configure", "[a] deploy: a task of service", "[a] health: Gate"]


def test_a_lock_refusal_counts_against_the_deploy_stage():
    refused = ev("runner_on_failed", "a", ROLE + "lock.yml", action="sglang.fleet.sglang_lock",
                 task="Take the deployment's lock for this deploy",
                 msg="the deployment's lock is held by another run")
    outcome = host_outcomes([ev("runner_on_ok", "a", ROLE + "preflight.yml"), refused], None)["a"]
    assert outcome.stages == {"deploy": "the deployment's lock is held by another run"}


def test_every_task_file_of_the_server_role_belongs_to_a_stage():
    tasks = Path(__file__).resolve().parents[2] / "roles" / "sglang_server" / "tasks"
    unstaged = [f.name for f in sorted(tasks.glob("*.yml"))
                if stage_of({"task_path": f"{tasks}/{f.name}:3", "task_action": "x"}) is None]
    assert unstaged == []
