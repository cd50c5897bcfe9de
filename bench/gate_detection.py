"""Hang detection time and false positives: the health gate beside fixed start-up budgets.

    .venv/bin/python bench/gate_detection.py [--scale 0.01] [--slow-runs 3]

Each case runs one simulated Kimi-K2.5 TP=8 server (sglang-sim) on a timeline compressed by
--scale (0.01: one real-world second takes 10 ms), and judges it two ways at once:

- the gate: sglang_health's observation + classifier every poll, with the default windows for
  a 1000B model (scaled), reporting the time from the server's last progress to "stalled";
- fixed-budget probes, as the systems in the reference do it: poll /health, give up when the
  budget since start is spent (16 min: SGLang OME single node; 60 min: what operators raise
  it to for Kimi-K2; 2 h: NVIDIA Dynamo).

All figures are from simulated servers and are reported in real-world-equivalent seconds
(measured seconds / scale).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sglang_fleet.testfleet.local import start_sim
from sglang_fleet_node.sglang_fleet_classify import classify
from sglang_fleet_node.sglang_fleet_observe import observe
from sglang_fleet_node.sglang_fleet_vocab import default_windows

BUDGETS_S = {"16 min (OME)": 960, "60 min (raised)": 3600, "2 h (Dynamo)": 7200}
POLL_S = 10.0  # the gate's default poll interval, real-world seconds


def judge(sim, scale: float, started: float, stop_after: float) -> dict:
    """Run the gate and the budget probes on one server until the gate decides."""
    windows, ceilings = default_windows(1000)
    windows = {k: v * scale for k, v in windows.items()}
    ceilings = {k: v * scale for k, v in ceilings.items()}
    state_file = sim.log_path.parent / "state.json"
    state_file.write_text(json.dumps({"pid": sim.proc.pid, "started_at": started}))
    params = {"marker": sim.marker, "state_file": str(state_file), "manager": "supervisor",
              "unit_name": None, "log_file": str(sim.log_path), "serves_http": True,
              "host": "127.0.0.1", "port": sim.port, "health_timeout": 2.0,
              "gpu_backend": "simulated", "sim_dir": str(sim.gpu_dir), "gpu_timeout": 5.0,
              "kernel_log": "none"}
    state, verdicts = None, []
    while True:
        now = time.time()
        verdict, state = classify(state, observe(params), now, windows, ceilings)
        verdicts.append(verdict["verdict"])
        if verdict["verdict"] != "progressing" or now - started > stop_after:
            break
        time.sleep(POLL_S * scale)
    decided = time.time()
    return {"verdict": verdict["verdict"], "phase": verdict["phase"],
            "decided_after_start": (decided - started) / scale,
            "decided_after_progress": (decided - verdict["last_progress_at"]) / scale,
            "window": windows.get(verdict["phase"], 0) / scale,
            "busy_wait": "busy_wait" in verdict.get("evidence", {}),
            "stalled_ever": "stalled" in verdicts}


def budget_outcome(decided_ready_after: float | None, budget: float) -> str:
    if decided_ready_after is None:
        return f"gives up at {budget:.0f} s"
    return "ready in time" if decided_ready_after <= budget else f"KILLS it at {budget:.0f} s"


def hang_case(name: str, scale: float, folder: Path, *flags: str, fault: str = "") -> dict:
    sim = start_sim(folder, "--tp-size", "8", *flags, time_factor=scale, fault=fault)
    started = time.time()
    try:
        result = judge(sim, scale, started, stop_after=7200 * scale * 2)
    finally:
        sim.stop()
    result["case"] = name
    return result


def slow_case(scale: float, folder: Path, load_s: float) -> dict:
    # A 1T model whose weights take load_s real seconds: still progressing all the way.
    factor = scale * load_s / 412.0
    sim = start_sim(folder, "--tp-size", "8", "--attention-backend", "triton",
                    time_factor=factor)
    started = time.time()
    try:
        result = judge(sim, scale, started, stop_after=(load_s + 600) * scale * 3)
    finally:
        sim.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--slow-runs", type=int, default=3)
    parser.add_argument("--slow-load-s", type=float, default=3000.0,
                        help="real-world seconds of weight loading in the slow case")
    args = parser.parse_args()
    s = args.scale
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        root = Path(tmp)
        hangs = [
            hang_case("hang in CUDA graph capture (incident: flashinfer+MLA+SM120)", s,
                      root / "a", "--attention-backend", "flashinfer"),
            hang_case("hang in weight loading", s, root / "b", "--attention-backend", "triton",
                      fault="hang:loading_weights"),
        ]
        slow = [slow_case(s, root / f"slow{i}", args.slow_load_s)
                for i in range(args.slow_runs)]

    print(f"SIMULATED servers (sglang-sim, Kimi-K2.5 TP=8 profile), timeline scale {s}; "
          f"figures in real-world-equivalent seconds; gate poll {POLL_S:.0f} s")
    print()
    print("Hangs: time from the server's last progress to the gate's verdict")
    head = f"{'case':<58} {'verdict':<8} {'phase':<21} {'after hang':>10} {'target':>8}"
    print(head + "".join(f" {k:>18}" for k in BUDGETS_S))
    for r in hangs:
        target = r["window"] + POLL_S
        ok = "ok" if r["decided_after_progress"] <= target * 1.05 else "MISS"
        row = (f"{r['case']:<58} {r['verdict']:<8} {r['phase']:<21} "
               f"{r['decided_after_progress']:>9.0f}s {target:>6.0f}s {ok}")
        row += "".join(f" {'at ' + str(b) + ' s after start':>18}" for b in BUDGETS_S.values())
        print(row)
        print(f"{'':<58} gate decided {r['decided_after_start']:.0f} s after start"
              f"{'; busy-wait signature named' if r['busy_wait'] else ''}")
    print()
    print(f"Slow load ({args.slow_load_s:.0f} s of weight loading, progressing all the way), "
          f"{len(slow)} runs")
    false_pos = sum(1 for r in slow if r["stalled_ever"] or r["verdict"] != "ready")
    ready_after = [r["decided_after_start"] for r in slow if r["verdict"] == "ready"]
    mean_ready = sum(ready_after) / len(ready_after) if ready_after else None
    print(f"  gate: {len(slow) - false_pos}/{len(slow)} ready, false 'stalled' verdicts: "
          f"{false_pos}; ready after {mean_ready:.0f} s (mean)" if mean_ready else
          f"  gate: false 'stalled' verdicts: {false_pos}")
    for name, budget in BUDGETS_S.items():
        print(f"  fixed budget {name:<16}: {budget_outcome(mean_ready, budget)}")


if __name__ == "__main__":
    main()
