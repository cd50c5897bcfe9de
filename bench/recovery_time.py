"""Time from the kill decision to verified-free GPUs, precise stop vs the incident's sequence.

    .venv/bin/python bench/recovery_time.py [--runs 3]

Each run starts a simulated Kimi-K2.5 TP=8 server (sglang-sim) hung in CUDA graph capture
(flashinfer + MLA + SM120), then frees it two ways, one after the other on fresh servers:

- sglang-fleet: SIGKILL every member of the deployment (it is judged hung), then poll the GPU
  layer until none of them is on a GPU and memory is back to the pre-start baseline;
- the incident's sequence: `kill -9 PID; sleep 2; pkill -9 -f sglang; sleep 2; pkill -9
  python3; sleep 3; fuser -k /dev/nvidia*; sleep 2; nvidia-smi`. Its kills are replayed on the
  deployment's members only (this benchmark never kills by name); its fixed sleeps are kept,
  and its single nvidia-smi look at the end is one GPU snapshot.

Servers and GPUs are simulated; the times are real wall-clock seconds on this machine.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path

from sglang_fleet.node.gpu.gpu import gpu_snapshot
from sglang_fleet.node.process import procs
from sglang_fleet.node.process.stop import kill_members, verify_released
from sglang_fleet.testfleet.local import start_sim, wait_for


def hung_server(folder: Path):
    sim = start_sim(folder, "--tp-size", "8", "--attention-backend", "flashinfer",
                    time_factor=0.002)
    wait_for(lambda: "Capture target decode CUDA graph begin" in sim.log(), timeout=60)
    wait_for(lambda: len(procs.deployment_processes(sim.marker)) == 10, timeout=30)
    return sim


def precise(sim) -> tuple[float, bool]:
    start = time.monotonic()
    report = kill_members(sim.marker, sim.proc.pid, None, hung=True, term_timeout=0)
    released, _, _ = verify_released("simulated", str(sim.gpu_dir),
                                     {t["pid"] for t in report["targets"]}, {}, timeout=30)
    return time.monotonic() - start, released


def incident_sequence(sim) -> tuple[float, bool]:
    def kill9_members():
        procs.signal_pids([p["pid"] for p in procs.deployment_processes(sim.marker)],
                          signal.SIGKILL)

    start = time.monotonic()
    procs.signal_pids([sim.proc.pid], signal.SIGKILL)  # kill -9 PID
    time.sleep(2)
    kill9_members()  # pkill -9 -f sglang (replayed on members only)
    time.sleep(2)
    kill9_members()  # pkill -9 python3 (replayed on members only)
    time.sleep(3)
    kill9_members()  # fuser -k /dev/nvidia* (replayed on members only)
    time.sleep(2)
    snap = gpu_snapshot("simulated", str(sim.gpu_dir))  # nvidia-smi, looked at once
    return time.monotonic() - start, all(d["memory_used"] == 0 for d in snap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = {"sglang-fleet precise stop": [], "incident sequence (9 s of sleeps)": []}
    verified = {k: 0 for k in rows}
    with tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp:
        for i in range(args.runs):
            for name, method in (("sglang-fleet precise stop", precise),
                                 ("incident sequence (9 s of sleeps)", incident_sequence)):
                sim = hung_server(Path(tmp) / f"{i}-{len(rows[name])}-{name[:8].strip()}")
                try:
                    seconds, free = method(sim)
                finally:
                    sim.stop()
                rows[name].append(seconds)
                verified[name] += free
    print(f"SIMULATED Kimi-K2.5 TP=8 server hung in CUDA graph capture, {args.runs} runs each")
    print(f"{'method':<36} {'median s':>9} {'min s':>7} {'max s':>7}  GPUs verified free")
    for name, times in rows.items():
        how = "polled until free" if name.startswith("sglang") else "one look at the end"
        print(f"{name:<36} {statistics.median(times):>9.2f} {min(times):>7.2f} "
              f"{max(times):>7.2f}  {verified[name]}/{args.runs} ({how})")
    ratio = statistics.median(rows["incident sequence (9 s of sleeps)"]) / max(
        statistics.median(rows["sglang-fleet precise stop"]), 1e-6)
    print(f"precise stop is {ratio:.0f}x faster to verified-free GPUs, touching only the "
          f"deployment's processes")


if __name__ == "__main__":
    main()
