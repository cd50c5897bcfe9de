"""How long a bad inventory takes to be refused, and that no node is contacted meanwhile.

    .venv/bin/python bench/refusal_time.py [--hosts 4] [--runs 5]

A copy of the default simulated fleet (four nodes; with --router, the real router in front),
its last host given a layout its model cannot run (Kimi-K2.5 at TP 3). Times, side by side
in alternation, from the start of the command to its exit:

- `ansible-playbook deploy.yml` (the validation play refuses the run);
- `sglang-fleet check` (the same validation, alone);
- `sglang-fleet deploy` (through ansible-runner, with its summary and JUnit files).

Each run asserts the refusal and that the nodes' folder was never created. Prints each
command's median, min and max in seconds, and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(), capture_output=True, text=True,
                          timeout=300)
    return time.monotonic() - start, proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="refusal-") as tmp:
        fleet = make_fleet(Path(tmp), hosts=args.hosts)
        fleet.set_host_vars(fleet.hosts[-1], {"sglang_server_tp": 3})
        extra = json.dumps(fleet.extra)
        commands = {
            "ansible-playbook deploy.yml": [str(BIN / "ansible-playbook"), "-i",
                                            str(fleet.inventory), "deploy.yml", "-e", extra],
            "sglang-fleet check": [str(BIN / "sglang-fleet"), "check", "-i",
                                   str(fleet.inventory), "-e", extra],
            "sglang-fleet deploy": [str(BIN / "sglang-fleet"), "deploy", "-i",
                                    str(fleet.inventory), "-e", extra, "--run-dir",
                                    str(Path(tmp) / "runs")],
        }
        seconds: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, cmd in commands.items():
                took, proc = timed(cmd)
                assert proc.returncode == 2, (name, proc.stdout[-2000:], proc.stderr[-2000:])
                assert "TP 3 does not divide" in proc.stdout, (name, proc.stdout[-2000:])
                assert not fleet.root.exists(), f"{name} touched a node"
                seconds[name].append(took)
    print(f"refusal of a bad inventory ({args.hosts} simulated hosts, the last one refused), "
          f"{args.runs} alternated runs each; no node contacted in any")
    print(f"{'command':32} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, values in seconds.items():
        print(f"{name:32} {statistics.median(values):9.2f} {min(values):7.2f} "
              f"{max(values):7.2f}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
