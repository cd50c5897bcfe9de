"""An upgrade from SGLang 0.5.4.post3 to 0.5.23 rolled back on pip release environments: what
the rollback installs, and how long it takes per server beside that server's start-up.

    .venv/bin/python bench/rollback_time.py [--hosts 2] [--time-factor 0.01] [--keep DIR]

A simulated fleet (`--hosts` sglang-sim nodes, Kimi-K2.5 TP=8 profile) on pip release
environments (sglang_server_sim_pip): real venvs, made by a real pip from a local wheelhouse of
tiny wheels built here (sglang_fleet.testfleet.wheels; `--no-index`, nothing downloaded), one
per release under each node's <root>/envs. Three real ansible-playbook runs through the CLI:

  1. deploy 0.5.4.post3 (its environment installed, the servers gated ready);
  2. deploy 0.5.23, the upgrade (a second environment installed beside the first);
  3. `sglang-fleet rollback`: every server back to 0.5.4.post3.

For each server it prints the rollback's seconds (from the start of the rollback run to the
server's ready verdict: the drain, the evidence, the stop, the restart and the gate) beside
its start-up seconds in that run (its launch files written and the service started, to its
ready verdict), the upgrade's install
seconds (the pip task, which the rollback does not run), and the pip tasks the rollback ran.

Servers and GPUs are simulated, and the simulated phases are scaled by --time-factor: a
start-up here is seconds where a real Kimi-K2.5 load takes minutes. The run times, the pip
installs and the files are real, on this machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sglang_fleet.testfleet.local import FAST_GATE, make_fleet, sglang_fleet
from sglang_fleet.testfleet.wheels import sim_pip_settings, sim_wheelhouse

OLD, NEW = "0.5.4.post3", "0.5.23"
PIP_TASK = "Install the pinned SGLang and py-spy into the release's environment"


def run(name: str, work: Path, common: tuple[str, ...], *args: str) -> dict[str, Any]:
    """One CLI run; its run record, and its runner events."""
    proc = sglang_fleet(*args, *common, "--run-dir", str(work / name))
    if proc.returncode != 0:
        sys.exit(f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    record = json.loads((work / name / "run.json").read_text())
    events = [json.loads(p.read_text()) for p in
              (work / name / "runner").glob("artifacts/*/job_events/*.json")]
    return {"record": record, "events": events}


def pip_seconds(events: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds of each host's pip task that ran (ok or changed)."""
    return {e["event_data"]["host"]: float(e["event_data"].get("duration") or 0.0)
            for e in events if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == PIP_TASK}


def per_server(record: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """host -> (seconds from the run's start to its last ready verdict, its (re)start to that
    verdict)."""
    started = record["run"]["started"]
    out = {}
    for server in record["servers"]:
        at = {t["phase"]: t["at"] for t in server["timeline"]}
        if "ready" not in at:
            sys.exit(f"{server['host']} did not reach ready: {server.get('reason')}")
        # Its (re)start: the service's start where the timeline records it, else the launch
        # files written just before it (the recovery's restart records only those).
        launched = max(at.get("launching", 0.0), at.get("files_written", 0.0)) or at["ready"]
        out[server["host"]] = (at["ready"] - started, at["ready"] - launched)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--time-factor", type=float, default=0.01,
                        help="scale of the simulated start-up phases (default 0.01)")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="rollback-time-"))
    work.mkdir(parents=True, exist_ok=True)
    fleet = make_fleet(work / "fleet", hosts=args.hosts, time_factor=args.time_factor)
    wheels = sim_wheelhouse(work / "wheelhouse")
    try:
        common = ("-i", str(fleet.inventory), "-e", json.dumps(fleet.with_stores(**FAST_GATE)))
        old = ("-e", json.dumps(sim_pip_settings(wheels, OLD)))
        new = ("-e", json.dumps(sim_pip_settings(wheels, NEW)))
        t0 = time.monotonic()
        first = run("deploy-old", work, common, "deploy", *old)
        upgrade = run("upgrade", work, common, "deploy", *new)
        back = run("rollback", work, common, "rollback", *new)
        total = time.monotonic() - t0
    finally:
        fleet.stop()
        fleet.kill_leftovers()
    installed = pip_seconds(upgrade["events"])
    rolled = per_server(back["record"])
    upgraded = per_server(upgrade["record"])
    pip_in_rollback = pip_seconds(back["events"])
    print(f"{args.hosts} simulated servers (time factor {args.time_factor}), pip release "
          f"environments; {OLD} -> {NEW} -> rollback to {OLD}; three CLI runs in {total:.0f} s")
    run_s = first["record"]["run"]["finished"] - first["record"]["run"]["started"]
    print(f"first deploy ({OLD}, its environment installed): {run_s:.1f} s")
    print(f"{'server':<12} {'upgrade: pip':>13} {'upgrade: to ready':>18} "
          f"{'rollback: to ready':>19} {'its start-up':>13} {'pip in rollback':>16}")
    for host in sorted(rolled):
        print(f"{host:<12} {installed.get(host, 0.0):>11.1f} s {upgraded[host][0]:>16.1f} s "
              f"{rolled[host][0]:>17.1f} s {rolled[host][1]:>11.1f} s "
              f"{len([h for h in pip_in_rollback if h == host]):>16}")
    envs = {host: sorted(p.name for p in (fleet.host_root(host) / "envs").iterdir())
            for host in fleet.hosts}
    print("environments kept per node:", json.dumps(envs))
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
