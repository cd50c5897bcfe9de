"""Hangs called by their stacks, for bench/gate_detection.py: injected hangs at random phases,
each judged by the gate with py-spy sampling every rank, and replays of slow, steady phases.

Two clocks, both said in the output:

- the simulated server runs its phases at --server-factor (0.01: a 412 s weight load takes
  4 s) to reach the phase where its hang strikes; once it hangs, nothing on its side moves,
  so its speed no longer matters;
- the gate runs the production defaults (10 s poll, a sample of each rank every 10 s at
  most, a 30 s stack window, the 1000B phase windows, a 25 s /health timeout, SGLang's own
  20 s health-check timeout) compressed by --gate-scale (0.1: a 10 s poll is 1 s). Figures are
  measured seconds / gate scale.

py-spy itself runs in real time (its cost is printed as measured); at a gate scale of 0.1 its
dumps take a few percent of a poll.

The replays run the server and the gate on one clock (--replay-scale) so that a slow step
looks as slow to the gate as it would in production: a 23-minute DeepGEMM warm-up (16
kernels, each an NVCC child of 86 s under an unchanging stack), a 3000 s weight load from
slow storage (47 s a shard, the read counters climbing) and, while serving, four prompts of
250000 tokens prefilled in chunks of 65536 (26 s a chunk at the simulated 2500 tok/s, a
Prefill batch line each; /health fails while a chunk outlasts its 20 s).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_fleet.node.common.vocab import default_windows
from sglang_fleet.node.health.classify import classify, stack_state
from sglang_fleet.node.health.observe import observe
from sglang_fleet.node.health.stacks import (
    SAMPLE_INTERVAL_S,
    STACK_WINDOW_S,
    find_py_spy,
)
from sglang_fleet.testfleet.local import start_sim

POLL_S = 10.0
HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT's default
SINGLE_THREAD_LOADER = ("--model-loader-extra-config", '{"enable_multithread_load": false}')
# Custom all-reduce crashes capture at TP=2 over PCIe on SM120 (the simulator knows it): off.
TRITON = ("--attention-backend", "triton", "--disable-custom-all-reduce")


@dataclass(frozen=True)
class HangKind:
    name: str
    phase: str  # where the verdict must say it is
    signature: str  # the class the verdict must name
    flags: tuple[str, ...]
    fault: str  # SGLANG_SIM_FAULT ("" for the seed's, which its configuration causes)
    # Settings the hang needs, each a folder of the trial's (jit_hang's DeepGEMM cache).
    folders: tuple[str, ...] = ()


HANG_KINDS = (
    HangKind("group barrier while launching", "launching", "nccl_collective", TRITON,
             "hang:launching"),
    HangKind("weight read, multi-thread loader", "loading_weights", "weight_io", TRITON,
             "hang:loading_weights"),
    HangKind("weight read, safetensors loader", "loading_weights", "weight_io",
             (*TRITON, *SINGLE_THREAD_LOADER), "hang:loading_weights"),
    HangKind("all_reduce sizing the KV cache", "allocating_kv_cache", "nccl_collective",
             TRITON, "hang:allocating_kv_cache"),
    HangKind("prefill graph capture", "capturing_cuda_graph", "cuda_graph_capture",
             (*TRITON, "--cuda-graph-backend-decode", "disabled"), "hang:capturing_cuda_graph"),
    HangKind("decode graph capture", "capturing_cuda_graph", "cuda_graph_capture", TRITON,
             "hang:capturing_cuda_graph"),
    HangKind("seed: flashinfer + MLA + SM120 busy-wait in decode capture",
             "capturing_cuda_graph", "cuda_graph_capture",
             ("--attention-backend", "flashinfer", "--disable-custom-all-reduce"), ""),
    HangKind("serving deadlock: TP0 in all_reduce, peers in recv_requests", "serving",
             "nccl_collective", TRITON, "hang:serving"),
    HangKind("detokenizer deadlocked in a batch's decode, schedulers serving", "serving",
             "detokenizer_deadlock", TRITON, "detokenizer_hang"),
    HangKind("DeepGEMM warm-up on a compile lock never released, no compiler",
             "capturing_cuda_graph", "jit_compilation", TRITON, "jit_hang",
             ("SGLANG_DG_CACHE_DIR",)),
)


class Costs:
    """py-spy's measured cost over every observation of a run, and the observations' own
    run times, shared by its threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples, self.cpu_s, self.wall_s, self.looks = 0, 0.0, 0.0, 0
        self.observations: list[float] = []

    def add(self, cost: dict | None, observing: float) -> None:
        with self.lock:
            self.observations.append(observing)
        if not cost or not cost["samples"]:
            return
        with self.lock:
            self.samples += cost["samples"]
            self.cpu_s += cost["cpu_s"]
            self.wall_s += cost["wall_s"]
            self.looks += 1


def gate_loop(sim, scale: float, params: dict, until: set[str], stop_after: float,
              costs: Costs, armed=lambda: True) -> dict:
    """Observe and classify one server every poll (scaled) with stack sampling on, until a
    verdict in `until` once `armed()` says so, or `stop_after` wall seconds. Returns the
    deciding verdict and what the run saw."""
    windows, ceilings = default_windows(1000)
    windows = {k: v * scale for k, v in windows.items()}
    ceilings = {k: v * scale for k, v in ceilings.items()}
    started, state, seen = time.time(), None, []
    next_poll = started
    while True:
        began = time.time()
        obs = observe(params, stack_state=stack_state(state))
        costs.add(obs.get("stacks_cost"), time.time() - began)
        verdict, state = classify(state, obs, time.monotonic(), windows, ceilings,
                                  STACK_WINDOW_S * scale)
        seen.append(verdict["verdict"])
        if (verdict["verdict"] in until and armed()) or time.time() - started > stop_after:
            verdict["log_age_s"] = time.time() - sim.log_path.stat().st_mtime
            verdict["seen"] = seen
            verdict["sampling_error"] = obs.get("stacks_error")
            return verdict
        next_poll = max(next_poll + POLL_S * scale, time.time())
        time.sleep(max(0.0, next_poll - time.time()))


def one_hang(kind: HangKind, tp: int, folder: Path, server_factor: float, scale: float,
             costs: Costs) -> dict:
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": f"{HEALTH_CHECK_TIMEOUT_S * scale:g}"}
    env.update((name, str(folder / name.lower())) for name in kind.folders)
    sim = start_sim(folder, "--tp-size", str(tp), *kind.flags, time_factor=server_factor,
                    fault=kind.fault, env=env)
    try:
        state_file = folder / "state.json"
        state_file.write_text(json.dumps({"pid": sim.proc.pid, "started_at": time.time()}))
        verdict = gate_loop(sim, scale, sim.gate_params(state_file, stacks=True, scale=scale),
                            {"stalled", "crashed", "gpu_fault"}, 600 * scale + 120, costs)
    finally:
        sim.stop()
    stacks = verdict.get("evidence", {}).get("stacks") or {}
    return {"kind": kind, "tp": tp, "verdict": verdict["verdict"], "phase": verdict["phase"],
            "signature": verdict.get("signature"), "frame": stacks.get("frame"),
            "rank": stacks.get("rank"), "waiting": stacks.get("waiting") or [],
            "by_stacks": bool(stacks), "reason": verdict.get("reason", ""),
            "after_progress": verdict["quiet_s"] / scale,
            "after_log_write": verdict["log_age_s"] / scale,
            "sampling_error": verdict.get("sampling_error")}


def run_hangs(n: int, parallel: int, folder: Path, server_factor: float, scale: float,
              seed: int, costs: Costs, kinds: tuple[HangKind, ...] = HANG_KINDS) -> list[dict]:
    """`n` hangs, kinds (of `kinds`) and TP sizes drawn at random (every kind at least once
    when n allows), `parallel` at a time."""
    rng = random.Random(seed)
    plan = list(kinds[:n]) + [rng.choice(kinds) for _ in range(n - len(kinds))]
    rng.shuffle(plan)
    trials = [(kind, rng.choice((2, 4))) for kind in plan]
    results: list[dict | None] = [None] * len(trials)
    lock = threading.Lock()
    queue = list(enumerate(trials))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                i, (kind, tp) = queue.pop(0)
            try:
                results[i] = one_hang(kind, tp, folder / f"hang-{i}", server_factor, scale,
                                      costs)
            except Exception as exc:  # noqa: BLE001 (one failed trial is reported, not fatal)
                results[i] = {"kind": kind, "tp": tp, "verdict": f"error: {exc}",
                              "phase": None, "signature": None, "frame": None,
                              "after_progress": None, "after_log_write": None,
                              "by_stacks": False, "reason": "", "waiting": [], "rank": None,
                              "sampling_error": None}

    threads = [threading.Thread(target=worker) for _ in range(max(1, parallel))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def one_replay(name: str, folder: Path, scale: float, server_factor: float, env: dict,
               costs: Costs) -> dict:
    sim = start_sim(folder, "--tp-size", "2", *TRITON, time_factor=server_factor, env=env)
    try:
        state_file = folder / "state.json"
        state_file.write_text(json.dumps({"pid": sim.proc.pid, "started_at": time.time()}))
        verdict = gate_loop(sim, scale, sim.gate_params(state_file, stacks=True, scale=scale),
                            {"ready", "stalled", "crashed", "gpu_fault", "unhealthy"},
                            7200 * scale, costs)
    finally:
        sim.stop()
    return {"name": name, "verdict": verdict["verdict"], "phase": verdict["phase"],
            "stalled": verdict["seen"].count("stalled"), "looks": len(verdict["seen"]),
            "reason": verdict.get("reason", "")}


# The long chunked prefill: prompts near the 262144-token context, one after another, in
# chunks of 65536 tokens at the profile's 2500 tok/s (SIMULATED): 26 s a chunk, longer than
# SGLang's 20 s health check, which waits for the chunk under way.
LONG_PROMPTS, LONG_PROMPT_TOKENS, PREFILL_CHUNK = 4, 250_000, 65536


def prefill_replay(folder: Path, scale: float, costs: Costs) -> dict:
    """A serving server prefilling long prompts chunk by chunk, judged all along; the
    server and the gate on one clock (`scale`)."""
    import requests  # the bench's client; the gate itself needs none

    sim = start_sim(folder, "--tp-size", "2", *TRITON, "--chunked-prefill-size",
                    str(PREFILL_CHUNK), time_factor=scale,
                    env={"SGLANG_HEALTH_CHECK_TIMEOUT": f"{HEALTH_CHECK_TIMEOUT_S * scale:g}"})

    def client() -> None:
        for n in range(LONG_PROMPTS):  # each its own tokens: no cache hit
            requests.post(f"{sim.url}/generate", timeout=600, json={
                "input_ids": [1000 + n] * LONG_PROMPT_TOKENS,
                "sampling_params": {"max_new_tokens": 1}})

    try:
        deadline = time.monotonic() + 120
        while "The server is fired up" not in sim.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        state_file = folder / "state.json"
        state_file.write_text(json.dumps({"pid": sim.proc.pid, "started_at": time.time()}))
        prompts = threading.Thread(target=client)
        prompts.start()
        verdict = gate_loop(sim, scale, sim.gate_params(state_file, stacks=True, scale=scale),
                            {"ready", "crashed", "gpu_fault"}, 3600 * scale + 60, costs,
                            armed=lambda: not prompts.is_alive())
        prompts.join()
        chunks = sim.log().count(f"#new-token: {PREFILL_CHUNK}, ")
    finally:
        sim.stop()
    return {"name": f"chunked prefill while serving, {chunks} chunks of 26 s",
            "verdict": verdict["verdict"],
            "phase": verdict["phase"], "stalled": verdict["seen"].count("stalled"),
            "looks": len(verdict["seen"]), "reason": verdict.get("reason", ""),
            "unhealthy": verdict["seen"].count("unhealthy")}


PREFILL_REPLAY = "long chunked prefill while serving"


def run_replays(folder: Path, scale: float, costs: Costs, only: str = "") -> list[dict]:
    """The slow, steady phases, side by side (those whose name holds `only`): a 23-minute
    JIT warm-up, a 3000 s load and a long chunked prefill while serving."""
    jobs = [(name, factor, env) for name, factor, env in (
        ("DeepGEMM JIT warm-up, 23 min (16 NVCC compiles of 86 s)", scale,
         {"SGLANG_SIM_JIT_WARMUP_S": "1380"}),
        ("weight load from slow storage, 3000 s (47 s a shard)", scale * 3000 / 412, {}),
        (PREFILL_REPLAY, scale, {})) if only in name]
    out: list[dict] = [{}] * len(jobs)

    def run(i: int) -> None:
        name, factor, env = jobs[i]
        if name == PREFILL_REPLAY:
            out[i] = prefill_replay(folder / "replay-prefill", scale, costs)
            return
        env = dict(env, SGLANG_HEALTH_CHECK_TIMEOUT=f"{HEALTH_CHECK_TIMEOUT_S * scale:g}")
        out[i] = one_replay(name, folder / f"replay-{i}", scale, factor, env, costs)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _report_hangs(hangs: list[dict], server_factor: float, scale: float) -> bool:
    ok = True
    print(f"HANGS BY THEIR STACKS: {len(hangs)} SIMULATED hangs (sglang-sim, its hung code in "
          f"functions filed as SGLang 0.5.23's, read by the real py-spy {_py_spy_version()})")
    print(f"  server phases at time factor {server_factor}; the gate at the production "
          f"defaults (poll {POLL_S:.0f} s, a sample per rank every {SAMPLE_INTERVAL_S:.0f} s, "
          f"stack window {STACK_WINDOW_S:.0f} s, 1000B phase windows, /health 25 s) "
          f"compressed by {scale}: figures are measured seconds / {scale}")
    print()
    widths = (62, 3, 9, 21, 20, 7, 7)
    print(" ".join(f"{h:<{w}}" for h, w in zip(
        ("kind", "n", "stalled", "phase", "signature", "p50 s", "max s"), widths, strict=True)))
    for kind in HANG_KINDS:
        rows = [h for h in hangs if h["kind"] == kind]
        if not rows:
            continue
        right = [h for h in rows if h["verdict"] == "stalled" and h["phase"] == kind.phase
                 and h["signature"] == kind.signature and h["frame"]]
        times = [h["after_progress"] for h in rows if h["after_progress"] is not None]
        print(" ".join(f"{c:<{w}}" for c, w in zip(
            (kind.name, str(len(rows)), f"{len(right)}/{len(rows)}", kind.phase,
             kind.signature, f"{statistics.median(times):.0f}" if times else "-",
             f"{max(times):.0f}" if times else "-"), widths, strict=True)))
        example = rows[0]
        print(f"{'':<4}e.g. TP={example['tp']}: {example['verdict']} in {example['phase']}: "
              f"{example['reason'][:300]}")
        for h in rows:
            if h not in right:
                ok = False
                print(f"{'':<4}MISS TP={h['tp']}: {h['verdict']} in {h['phase']}, signature "
                      f"{h['signature']}: {h['reason'][:200]}")
    times = [h["after_progress"] for h in hangs if h["after_progress"] is not None]
    writes = [h["after_log_write"] for h in hangs if h["after_log_write"] is not None]
    right = sum(1 for h in hangs if h["verdict"] == "stalled"
                and h["signature"] == h["kind"].signature and h["frame"])
    print()
    if times:
        p99 = percentile(times, 0.99)
        ok = ok and p99 <= 60 and right == len(hangs)
        print(f"last progress the gate saw -> stalled: p50 {percentile(times, 0.5):.0f} s, "
              f"p99 {p99:.0f} s, max {max(times):.0f} s (goal: p99 <= 60 s)  "
              f"{'ok' if p99 <= 60 else 'MISS'}")
        print(f"the server log's last write -> stalled: p50 {percentile(writes, 0.5):.0f} s, "
              f"p99 {percentile(writes, 0.99):.0f} s, max {max(writes):.0f} s")
        print(f"signature class and frame right: {right}/{len(hangs)}; decided by the stacks "
              f"(not a window): {sum(1 for h in hangs if h['by_stacks'])}/{len(hangs)}")
    return ok


def report(hangs: list[dict], replays: list[dict], costs: Costs, server_factor: float,
           scale: float, replay_scale: float) -> bool:
    """Print the figures; True when every goal is met."""
    ok = True
    if hangs:
        ok = _report_hangs(hangs, server_factor, scale)
    if replays:
        print()
        print(f"SLOW, STEADY PHASES (SIMULATED, server and gate on one clock, time factor "
              f"{replay_scale}; figures are real-world-equivalent):")
        for r in replays:
            good = r["stalled"] == 0 and r["verdict"] == "ready"
            ok = ok and good
            unhealthy = (f", /health failing in {r['unhealthy']} (a chunk outlasts its 20 s)"
                         if r.get("unhealthy") else "")
            print(f"  {r['name']:<58} {r['stalled']} stalled in {r['looks']} looks{unhealthy}; "
                  f"ended {r['verdict']} ({r['phase']})  "
                  f"{'ok' if good else 'MISS: ' + r['reason']}")
    if costs.samples:
        per_sample = costs.cpu_s / costs.samples
        print()
        print(f"py-spy cost (measured, --nonblocking, dumps of one look side by side): "
              f"{per_sample * 1000:.1f} ms CPU per sample over {costs.samples} samples; "
              f"{costs.wall_s / costs.looks * 1000:.0f} ms wall per look of "
              f"{costs.samples / costs.looks:.1f} ranks; at one sample per "
              f"{SAMPLE_INTERVAL_S:.0f} s: {per_sample * 60 / SAMPLE_INTERVAL_S * 1000:.0f} ms "
              f"CPU per rank per minute ({per_sample / SAMPLE_INTERVAL_S * 100:.2f}% of a core); "
              f"the ranks are never paused")
    if costs.observations:
        obs = sorted(costs.observations)
        print(f"observations took {percentile(obs, 0.5):.2f} s (median), "
              f"{percentile(obs, 0.99):.2f} s (p99) of real time, /health waits included; "
              f"load average {os.getloadavg()[0]:.0f} on {os.cpu_count()} cores at the end")
    return ok


def _py_spy_version() -> str:
    path = find_py_spy("", sys.executable)  # as the gate finds it: beside the server's Python
    if not path:
        return "(not found)"
    return subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
