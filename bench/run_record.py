"""The run record at fleet scale: the page's size and the time from the run's end to the page.

    .venv/bin/python bench/run_record.py --nodes 64 --hangs 2
    .venv/bin/python bench/run_record.py --from .sglang-fleet/runs/20261206T072019Z-deploy

Deploys a simulated fleet of N one-GPU servers (sglang-sim, phase durations x --time-factor)
with `sglang-fleet deploy --recover`, `--hangs` of them made to hang while loading weights
(their recovery redeploys the same configuration, which hangs again: failed rows with their
evidence, the page's heaviest), then reads the run folder: the size of run.html and run.json,
and the time from the run's end (ansible-runner's `rc` file, written when ansible-playbook
exits) to run.html written. Then it rebuilds the record from the run's files --repeat times
(what `sglang-fleet report RUN --rebuild` does) and prints the median. With --from, only the
rebuilds, of an existing run. The servers are stopped afterwards by their deployment markers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_fleet.record.history import write_run_record
from sglang_fleet.testfleet.local import BIN, FAST_GATE, REPO, ansible_env, make_fleet

MB = 1024 * 1024


def deploy(folder: Path, nodes: int, hangs: int, time_factor: float) -> Path:
    fleet = make_fleet(folder, hosts=nodes, time_factor=time_factor, tp=1)
    for host in fleet.hosts[:hangs]:
        fleet.set_host_vars(host, {"sglang_server_sim_fault": "hang:loading_weights"})
    run_dir = folder / "run"
    env = dict(ansible_env(), SGLANG_FLEET_STATE_DIR=str(folder / "state"))
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [str(BIN / "sglang-fleet"), "deploy", "--recover", "-i", str(fleet.inventory),
             "--run-dir", str(run_dir), "-e", json.dumps(fleet.with_stores(**FAST_GATE))],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=3600)
    finally:
        fleet.kill_leftovers()
    print(f"deploy of {nodes} simulated servers ({hangs} hanging): exit {proc.returncode} in "
          f"{time.monotonic() - started:.0f} s")
    if not (run_dir / "run.html").exists():
        sys.exit(proc.stdout[-3000:])
    return run_dir


def after_the_run(run_dir: Path) -> None:
    page, data = run_dir / "run.html", run_dir / "run.json"
    ended = max(p.stat().st_mtime for p in run_dir.glob("runner/artifacts/*/rc"))
    record = json.loads(data.read_text())
    print(f"servers {record['fleet']['servers']}: {record['fleet']['line']}")
    print(f"run.html {page.stat().st_size / MB:.2f} MB, run.json {data.stat().st_size / MB:.2f} "
          f"MB (target: page at most 2 MB)")
    print(f"run end (ansible-playbook exited) to run.html written: "
          f"{page.stat().st_mtime - ended:.2f} s (target: at most 1 s)")


def rebuilds(run_dir: Path, repeat: int) -> None:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        write_run_record(run_dir)
        times.append(time.perf_counter() - start)
    print(f"rebuilt from the run's files {repeat} times: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}); page "
          f"{(run_dir / 'run.html').stat().st_size / MB:.2f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hangs", type=int, default=2)
    parser.add_argument("--time-factor", type=float, default=0.005)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--from", dest="run", help="an existing run folder: rebuild only")
    parser.add_argument("--keep", metavar="DIR", help="copy the run folder here afterwards")
    args = parser.parse_args()
    if args.run:
        rebuilds(Path(args.run), args.repeat)
        return
    with tempfile.TemporaryDirectory(prefix="bench-run-record-") as tmp:
        os.environ["SGLANG_FLEET_STATE_DIR"] = str(Path(tmp) / "state")
        run_dir = deploy(Path(tmp), args.nodes, args.hangs, args.time_factor)
        after_the_run(run_dir)
        rebuilds(run_dir, args.repeat)
        if args.keep:
            shutil.copytree(run_dir, args.keep, symlinks=True)


if __name__ == "__main__":
    main()
