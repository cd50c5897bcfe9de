"""What the sglang-fleet CLI costs over a plain `ansible-playbook deploy.yml`, side by side.

    .venv/bin/python bench/cli_overhead.py [--nodes 4] [--runs 3]

On one simulated fleet (sglang-sim, loopback ports, a temporary folder), alternating the two:

- first deploy: stop the fleet, then deploy it from nothing (processes start, gate waits);
- no-change re-run: deploy again with nothing changed (every task runs, nothing restarts).

`sglang-fleet deploy` runs the same playbook through ansible-runner's Python API, with the live
progress handler, the kept artifacts (every event as a JSON file), the JSON summary and the
JUnit file. Wall-clock seconds on this machine; the servers are simulated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet, run_playbook


def timed(cmd: list[str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, choices=range(1, 5))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sglang-fleet-cli-") as tmp:
        fleet = make_fleet(Path(tmp), hosts=args.nodes, time_factor=0.005)
        extra = json.dumps(fleet.with_stores())
        plain = [str(BIN / "ansible-playbook"), "-i", str(fleet.inventory), "deploy.yml",
                 "-e", extra]

        def cli(n: int, kind: str) -> list[str]:
            return [str(BIN / "sglang-fleet"), "deploy", "-i", str(fleet.inventory), "-e", extra,
                    "--run-dir", f"{tmp}/cli-{kind}-{n}"]

        times: dict[str, list[float]] = {k: [] for k in
                                         ("plain first", "cli first", "plain rerun", "cli rerun")}
        try:
            for n in range(args.runs):
                fleet.stop()
                times["plain first"].append(timed(plain))
                times["plain rerun"].append(timed(plain))
                times["cli rerun"].append(timed(cli(n, "rerun")))
                fleet.stop()
                times["cli first"].append(timed(cli(n, "first")))
        finally:
            run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
            fleet.kill_leftovers()
    print(f"simulated fleet: {args.nodes} nodes (sglang-sim, TP=8 each, time factor 0.005), "
          f"{args.runs} runs each, alternating")
    print(f"{'deploy':<18} {'ansible-playbook s':>19} {'sglang-fleet s':>15} {'overhead s':>11} "
          f"{'ratio':>6}")
    for kind in ("first", "rerun"):
        a = statistics.median(times[f"plain {kind}"])
        b = statistics.median(times[f"cli {kind}"])
        label = "first deploy" if kind == "first" else "no-change re-run"
        print(f"{label:<18} {a:>19.2f} {b:>15.2f} {b - a:>+11.2f} {b / a:>6.2f}")
    print("medians; spread: " + ", ".join(
        f"{k} {min(v):.2f}-{max(v):.2f}" for k, v in times.items()))


if __name__ == "__main__":
    main()
