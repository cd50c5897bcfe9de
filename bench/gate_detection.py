"""Hang detection time and false positives: the health gate beside fixed start-up budgets.

    .venv/bin/python bench/gate_detection.py [--hangs 200] [--parallel 2] [--no-windows]
        [--scale 0.01] [--slow-runs 2] [--only TEXT]

Two parts. HANGS BY THEIR STACKS (bench/stack_trials.py): --hangs hangs injected at random
phases (the seed's capture hang and a serving deadlock among them), each judged by the gate
with py-spy sampling every rank; it prints p50 and p99 of the time from the last progress to
`stalled`, whether each verdict names the right signature and its frame, replays of a
23-minute JIT warm-up, a 3000 s slow load and a long chunked prefill while serving (0 stalled
is the goal), and py-spy's measured
cost per sample and per rank per minute. THE WINDOWS (below; --no-windows skips it) judge
with stack sampling off: the phases' windows, the backstop for hangs whose stacks move.

Each case runs one simulated Kimi-K2.5 server (sglang-sim, which prints SGLang 0.5.23's own
start-up lines) on a timeline compressed by --scale (0.01: one real-world second takes 10 ms),
and judges it two ways at once:

- the gate: sglang_health's observation + classifier every poll, with the default windows for
  a 1000B model (scaled);
- fixed-budget probes, as the systems in the reference do it: poll /health, give up when the
  budget since start is spent (16 min: SGLang OME single node; 60 min: what operators raise
  it to for Kimi-K2; 2 h: NVIDIA Dynamo).

The cases, in the shapes 0.5.23 prints:

- hangs in weight loading under the default multi-thread loader bar (`Multi-thread loading
  shards`) and the single-threaded one (`Loading safetensors checkpoint shards`), in prefill
  graph capture (`Capturing prefill shape (num_tokens=...)`) and in decode graph capture
  (`Capturing batches (bs=...)`, the incident). Figure: time from the last progress to
  `stalled`; target: the phase's window plus one poll.
- fatal failures while processes live, with --dp-size 2, whose data-parallel controller
  neither handles SIGQUIT nor watches its schedulers: torch's NCCL watchdog aborts every
  scheduler in graph capture (fatal lines in the server log), or the kernel's OOM killer takes
  the TP0 schedulers (a line in the kernel log, nothing in the server's). The controller and
  the main process stay up. Figure: time from the fatal line to `crashed` and the polls it
  took; goal: the first poll after the line.
- slow loads: 3000 s of weight loading (ten times the loading window), progressing all the
  way, under each loader bar. Figure: false `stalled` verdicts (goal: none) and time to ready.

There is no piecewise-capture case: 0.5.23 offers no piecewise capture a user can select (the
real parser refuses its tc_piecewise backend), so the simulator prints none.

All figures are from simulated servers and are reported in real-world-equivalent seconds:
the server's side (its progress, its log, the poll interval) is on the compressed timeline and
counts measured seconds / scale; an observation's own run time (milliseconds; seconds when the
gate waits for a fatal line's exit status) is the gate's real work and counts as it is. Polls
run on a fixed cadence, so a slow observation on a loaded machine does not stretch the next.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from stack_trials import HANG_KINDS, Costs, report, run_hangs, run_replays

from sglang_fleet.node.common.vocab import default_windows
from sglang_fleet.node.health.classify import classify
from sglang_fleet.node.health.observe import FATAL_EXIT_GRACE_S, observe
from sglang_fleet.testfleet.local import SimProcess, start_sim

BUDGETS_S = {"16 min (OME)": 960, "60 min (raised)": 3600, "2 h (Dynamo)": 7200}
POLL_S = 10.0  # the gate's default poll interval, real-world seconds
LOOK_S = 0.005  # how often the bench's own stopwatch looks at the log between polls (fatal)
SINGLE_THREAD_LOADER = ("--model-loader-extra-config", '{"enable_multithread_load": false}')
TP8 = ("--tp-size", "8", "--attention-backend", "triton")
DP2 = ("--tp-size", "4", "--dp-size", "2", "--attention-backend", "triton")


@dataclass
class Case:
    name: str
    kind: str  # "hang", "fatal" or "slow"
    phase: str  # the phase the verdict must name
    flags: tuple[str, ...]
    fault: str = ""
    results: list[dict] = field(default_factory=list)


CASES = [
    Case("hang in weight loading, multi-thread loader bar (default)", "hang", "loading_weights",
         TP8, "hang:loading_weights"),
    Case("hang in weight loading, safetensors loader bar", "hang", "loading_weights",
         (*TP8, *SINGLE_THREAD_LOADER), "hang:loading_weights"),
    # The simulator's capture faults strike decode capture while it runs: prefill alone here.
    Case("hang in prefill graph capture (decode graphs off)", "hang", "capturing_cuda_graph",
         (*TP8, "--cuda-graph-backend-decode", "disabled"), "hang:capturing_cuda_graph"),
    Case("hang in decode graph capture (incident: flashinfer+MLA+SM120)", "hang",
         "capturing_cuda_graph", ("--tp-size", "8", "--attention-backend", "flashinfer")),
    # torch's NCCL watchdog runs at --dist-timeout as configured, never compressed: short
    # enough to fire before the capture window (compressed) calls the server stalled.
    Case("NCCL watchdog abort in capture, DP=2, main process alive", "fatal",
         "capturing_cuda_graph", (*DP2, "--dist-timeout", "3"),
         "nccl_timeout:capturing_cuda_graph"),
    Case("OOM killer takes TP0 in capture, DP=2, main process alive", "fatal",
         "capturing_cuda_graph", DP2, "killed:capturing_cuda_graph"),
    Case("slow load, multi-thread loader bar", "slow", "loading_weights", TP8),
    Case("slow load, safetensors loader bar", "slow", "loading_weights",
         (*TP8, *SINGLE_THREAD_LOADER)),
]


class LogWatch:
    """The bench's own stopwatch on the server's log: when it grew past a given size."""

    def __init__(self, path: Path):
        self.path = path
        self.size = 0
        self.last_look = time.time()
        self.growth: list[tuple[float, int]] = []  # (last look while shorter, new size)

    def look(self) -> None:
        now = time.time()
        try:
            size = os.stat(self.path).st_size
        except OSError:
            size = 0
        if size != self.size:
            self.growth.append((self.last_look, size))
            self.size = size
        self.last_look = now

    def written_after(self, end_offset: int) -> float | None:
        """The last time the log was seen shorter than end_offset bytes: what ends there was
        written after it."""
        return next((before for before, size in self.growth if size >= end_offset), None)


def line_end_offset(log_path: Path, line: str) -> int | None:
    text = log_path.read_bytes().decode(errors="replace")
    at = text.find(line)
    return None if at < 0 else len(text[:at + len(line)].encode())


def judge(sim: SimProcess, scale: float, started: float, stop_after: float,
          watch: LogWatch | None = None) -> dict:
    """Run the gate on one server, poll after poll, until it decides."""
    windows, ceilings = default_windows(1000)
    windows = {k: v * scale for k, v in windows.items()}
    ceilings = {k: v * scale for k, v in ceilings.items()}
    state_file = sim.log_path.parent / "state.json"
    state_file.write_text(json.dumps({"pid": sim.proc.pid, "started_at": started}))
    params = sim.gate_params(state_file)
    state, verdicts, polls = None, [], []  # polls: (start, seconds the observation took)
    seen: list[set[str]] = []  # per poll, the fatal lines its observation held
    next_poll = time.time()
    while True:
        if watch is not None:
            watch.look()
        now = time.time()
        obs = observe(params)
        polls.append((now, time.time() - now))
        if watch is not None:
            seen.append({f["line"] for f in obs["log"]["failures"] if f["fatal"]}
                        | {k["line"] for k in obs.get("oom_kills") or []})
        verdict, state = classify(state, obs, now, windows, ceilings)
        verdicts.append(verdict["verdict"])
        if verdict["verdict"] != "progressing" or now - started > stop_after:
            break
        next_poll = max(next_poll + POLL_S * scale, time.time())
        while (left := next_poll - time.time()) > 0:
            if watch is not None:
                watch.look()
            time.sleep(min(left, LOOK_S) if watch is not None else left)
    decided, observing = polls[-1]

    def after(t: float) -> float:
        """Real-world-equivalent seconds from t (wall clock) to the verdict; from inside the
        deciding observation (a line written while it ran), that observation's run time."""
        return max(decided - t, 0.0) / scale + observing

    evidence = verdict.get("evidence", {})
    result = {"verdict": verdict["verdict"], "phase": verdict["phase"],
              "decided_after_start": after(started),
              "decided_after_progress": after(verdict["last_progress_at"]),
              "observing": observing,
              "after_last_log_write": after(sim.log_path.stat().st_mtime),
              "window": windows.get(verdict["phase"], 0) / scale,
              "late_polls": sum(1 for (a, _), (b, _) in zip(polls, polls[1:], strict=False)
                                if b - a > POLL_S * scale * 1.5),
              "longest_observation": max(d for _, d in polls),
              "busy_wait": "busy_wait" in evidence,
              "processes_alive": evidence.get("processes_alive"),
              "stalled_ever": "stalled" in verdicts}
    fatal_line = evidence.get("fatal_line")
    if watch is not None and fatal_line:
        watch.look()
        end = line_end_offset(sim.log_path, fatal_line)
        if end is not None:  # a server log line: when the stopwatch saw the log grow past it
            written_after, source = watch.written_after(end), "server log"
        else:  # a kernel log line carries its own time
            written_after, source = evidence["failures"][0]["at"], "kernel log"
        if written_after is not None:
            result["after_fatal_line"] = after(written_after)
        # From the first poll whose observation held the line to the verdict's.
        result["polls_after_line"] = len(seen) - next(
            (i for i, lines in enumerate(seen) if fatal_line in lines), len(seen) - 1)
        result["fatal_line"], result["fatal_source"] = fatal_line, source
    return result


def run_case(case: Case, scale: float, folder: Path, slow_load_s: float) -> dict:
    if case.kind == "slow":
        # A 1T model whose weights take slow_load_s real seconds: progressing all the way.
        factor, stop_after = scale * slow_load_s / 412.0, (slow_load_s + 600) * scale * 3
    else:
        factor, stop_after = scale, 7200 * scale * 2
    sim = start_sim(folder, *case.flags, time_factor=factor, fault=case.fault)
    started = time.time()
    try:
        result = judge(sim, scale, started, stop_after,
                       LogWatch(sim.log_path) if case.kind == "fatal" else None)
    finally:
        sim.stop()
    return {**result, "load_s": slow_load_s}


def budget_outcome(ready_after: float | None, budget: float) -> str:
    """What a /health probe with a fixed budget does: gives up on a server that never gets
    ready at the budget's end; kills a slow one that is not ready by then."""
    if ready_after is None:
        return f"at {budget:.0f} s"
    return "ready in time" if ready_after <= budget else f"KILLS it at {budget:.0f} s"


def row(case: Case) -> tuple[list[str], float | None, bool, list[str]]:
    """(verdict, phase, measured, target cells), the ready time, ok, and notes under the row."""
    r = case.results[0]
    if case.kind == "hang":
        target = r["window"] + POLL_S
        # The observation's own run time comes on top of the poll (it is the gate's work);
        # half a second covers the timer's wake-up jitter, scaled.
        ok = (r["verdict"] == "stalled" and r["phase"] == case.phase
              and r["decided_after_progress"] - r["observing"] <= target + 0.5)
        cells = [r["verdict"], r["phase"], f"{r['decided_after_progress']:.0f} s after progress",
                 f"{target:.0f} s"]
        notes = [f"decided {r['decided_after_start']:.0f} s after start, "
                 f"{r['after_last_log_write']:.0f} s after the log's last write"
                 + ("; busy-wait signature named" if r["busy_wait"] else "")]
        return cells, None, ok, notes
    if case.kind == "fatal":
        after, polls = r.get("after_fatal_line"), r.get("polls_after_line")
        ok = r["verdict"] == "crashed" and r["phase"] == case.phase and polls == 1
        # The line's time is bounded from below (the stopwatch's last look without it), so
        # the figure is an upper bound.
        measured = (f"<={after:.0f} s after line, {polls} poll" if after is not None
                    else f"{polls} poll (line not timed)")
        cells = [r["verdict"], r["phase"], measured, "1 poll"]
        waited = (f"; its observation took {r['observing']:.1f} s, waiting up to "
                  f"{FATAL_EXIT_GRACE_S:.0f} s for an exit status" if r["observing"] > 1 else "")
        notes = [f"decided {r['decided_after_start']:.0f} s after start with "
                 f"{r['processes_alive']} processes alive{waited}",
                 f"{r.get('fatal_source', '')}: {r.get('fatal_line', '')[:100]}"]
        return cells, None, ok, notes
    false_stalled = [x for x in case.results if x["stalled_ever"] or x["verdict"] != "ready"]
    ready_after = [x["decided_after_start"] for x in case.results if x["verdict"] == "ready"]
    ready = sum(ready_after) / len(ready_after) if ready_after else None
    cells = [f"ready {len(ready_after)}/{len(case.results)}", case.phase,
             f"{len(false_stalled)} false stalled", "0"]
    window = default_windows(1000)[0]["loading_weights"]
    notes = [f"{r['load_s']:.0f} s of weight loading ({r['load_s'] / window:.0f}x the "
             f"loading window); " + (f"ready {ready:.0f} s after start (mean of "
                                     f"{len(ready_after)})" if ready is not None
                                     else "never ready")]
    notes += [f"run {i + 1}: {x['verdict']} in {x['phase']}"
              for i, x in enumerate(case.results) if x in false_stalled]
    return cells, ready, not false_stalled, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hangs", type=int, default=200, help="hangs injected (0: none)")
    parser.add_argument("--parallel", type=int, default=1, help="hangs run side by side")
    parser.add_argument("--seed", type=int, default=44, help="the draw of kinds and TP sizes")
    parser.add_argument("--server-factor", type=float, default=0.01,
                        help="time factor of the hung servers' phases before the hang")
    parser.add_argument("--gate-scale", type=float, default=0.5,
                        help="compression of the gate's production timings in the hang trials")
    parser.add_argument("--replays", action=argparse.BooleanOptionalAction, default=True,
                        help="replay a 23-minute JIT warm-up, a 3000 s slow load and a long "
                             "chunked prefill while serving")
    parser.add_argument("--replay-scale", type=float, default=0.05)
    parser.add_argument("--windows", action=argparse.BooleanOptionalAction, default=True,
                        help="the window cases beside fixed budgets (stack sampling off)")
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--slow-runs", type=int, default=2, help="runs of each slow case")
    parser.add_argument("--slow-load-s", type=float, default=3000.0,
                        help="real-world seconds of weight loading in the slow cases")
    parser.add_argument("--only", default="",
                        help="run only the window cases, hang kinds and replays whose name "
                             "contains this text")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only in c.name] if args.windows else []
    if args.windows and not cases:
        parser.error(f"--only {args.only!r} matches no case; the cases are: "
                     + "; ".join(c.name for c in CASES))
    kinds = tuple(k for k in HANG_KINDS if args.only in k.name)
    if args.hangs and not kinds:
        parser.error(f"--only {args.only!r} matches no hang kind; the kinds are: "
                     + "; ".join(k.name for k in HANG_KINDS))
    ok = True
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        costs = Costs()
        # One after the other: on a shared machine, each slows the other's clock.
        hangs = run_hangs(args.hangs, args.parallel, Path(tmp) / "hangs", args.server_factor,
                          args.gate_scale, args.seed, costs, kinds) if args.hangs else []
        replays = run_replays(Path(tmp) / "replays", args.replay_scale, costs, args.only) \
            if args.replays else []
        if hangs or replays:
            ok = report(hangs, replays, costs, args.server_factor, args.gate_scale,
                        args.replay_scale)
        for i, case in enumerate(cases):
            for n in range(args.slow_runs if case.kind == "slow" else 1):
                case.results.append(run_case(case, args.scale, Path(tmp) / f"{i}-{n}",
                                             args.slow_load_s))
    if cases:
        print()
        ok = print_windows(cases, args.scale) and ok
    raise SystemExit(0 if ok else 1)


def print_windows(cases: list[Case], s: float) -> bool:
    print(f"THE WINDOWS (stack sampling off): SIMULATED servers (sglang-sim printing SGLang "
          f"0.5.23's lines, Kimi-K2.5 profile), timeline scale {s}; figures in "
          f"real-world-equivalent seconds; gate poll {POLL_S:.0f} s")
    print()
    widths = (62, 8, 10, 21, 31, 7, 4)
    head = ["case", "goal", "verdict", "phase", "measured", "target", ""]
    print(" ".join(f"{h:<{w}}" for h, w in zip(head, widths, strict=True))
          + "".join(f" {k:>17}" for k in BUDGETS_S))
    all_ok = True
    for case in cases:
        cells, ready, ok, notes = row(case)
        all_ok = all_ok and ok
        goal = {"hang": "stalled", "fatal": "crashed", "slow": "ready"}[case.kind]
        line = [case.name, goal, *cells, "ok" if ok else "MISS"]
        print(" ".join(f"{c:<{w}}" for c, w in zip(line, widths, strict=True))
              + "".join(f" {budget_outcome(ready, b):>17}"
                        for b in BUDGETS_S.values()))
        for note in notes:
            print(f"{'':<{widths[0]}}   {note}")
    results = [r for c in cases for r in c.results]
    print()
    print(f"Budget columns: when a fixed-budget /health probe gives up on a server that never "
          f"gets ready, or what it does to the slow load. Gate observations took up to "
          f"{max(r['longest_observation'] for r in results):.2f} s; polls late by half a poll "
          f"or more: {sum(r['late_polls'] for r in results)}.")
    return all_ok


if __name__ == "__main__":
    main()
