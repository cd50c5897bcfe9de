"""Deploy against Ansible's own floor, side by side in one run, on the local simulated fleet.

    .venv/bin/python bench/deploy_floor.py [--hosts 4 16 64] [--reruns 5] [--no-router]

Each fleet is the default one: its servers and, in front of them, the real router (sim-router,
the pinned sglang-router in a virtualenv built once, testfleet.router.router_venv). For each
fleet size: the first deploy (with a probe that polls every server's /health every
50 ms, and the time each host's ready line reaches the output), then no-change re-runs of
deploy.yml alternated with bench/floor.yml (two module runs and eight set_fact per host, router
included: the least a deploy that checks a node and asks its server can cost), medians of
each. Printed:
the re-run against the floor; the first deploy's overhead above the servers' own start (the
probe's first 200 after each server's recorded start), also as a multiple of the floor's time
(which scales with the machine's speed as the overhead does); how long after a server first
answered /health its ready line appeared; the controller's CPU per host (this process's
children: ansible-playbook, its forks and, with the local connection, the module runs; not the
simulated servers, which outlive the run); and the cost of each added host (the slope between
sizes) against the floor's. Servers are sglang-sim (TP=8
at 4 hosts as the default fleet, TP=1 for larger fleets so that 64 fit in memory), so the
figures measure the toolkit and Ansible, not SGLang.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import requests

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet, run_playbook
from sglang_fleet.testfleet.router import router_venv

FLOOR = REPO / "bench" / "floor.yml"
# The router's virtualenv, kept between runs (or $SGLANG_FLEET_TEST_ROUTER_VENV).
ROUTER_VENVS = Path(tempfile.gettempdir()) / "sglang-fleet-bench"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_playbook(playbook: str, inventory: Path, extra: dict) -> tuple[float, float, int,
                                                                         list[tuple[float, str]]]:
    """Wall seconds, CPU seconds of the run's process tree, rc, and each output line with the
    monotonic time it arrived."""
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, "-e",
           json.dumps(extra)]
    cpu0, t0 = children_cpu(), time.monotonic()
    lines = []
    proc = subprocess.Popen(cmd, cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic(), line.rstrip("\n")))
    rc = proc.wait()
    return time.monotonic() - t0, children_cpu() - cpu0, rc, lines


class HealthProbe:
    """Polls each server's /health every 50 ms, one thread per server (SGLang's /health takes
    a second, so one thread for all would see the last servers late); records the first 200
    per host."""

    def __init__(self, urls: dict[str, str]):
        self.urls = urls
        self.first_ok: dict[str, float] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._poll, args=(host, url), daemon=True)
                        for host, url in urls.items()]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _poll(self, host: str, url: str) -> None:
        session = requests.Session()
        while not self.stop.is_set():
            try:
                if session.get(url + "/health", timeout=5).status_code == 200:
                    self.first_ok[host] = time.monotonic()
                    return
            except requests.RequestException:
                pass
            self.stop.wait(0.05)


def started_at(fleet, host: str) -> float | None:
    """The server's recorded start, as a monotonic time."""
    state = fleet.host_root(host) / "run" / f"Kimi-K2.5-{fleet.port(host)}.pid"
    try:
        wall = json.loads(state.read_text())["started_at"]
    except (OSError, ValueError, KeyError):
        return None
    return time.monotonic() - (time.time() - wall)


def measure(hosts: int, reruns: int, time_factor: float, gate_interval: int | None,
            router: Path | None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"deploy-floor-{hosts}-") as tmp:
        fleet = make_fleet(Path(tmp), hosts=hosts, time_factor=time_factor,
                           tp=None if hosts <= 4 else 1, gate_poll_interval=gate_interval,
                           router=router)
        # Every host of the run has its recap line: the servers and the router.
        recaps = hosts + (1 if router else 0)
        extra = fleet.extra
        try:
            probe = HealthProbe({h: fleet.url(h) for h in fleet.hosts})
            probe.start()
            wall, cpu, rc, lines = timed_playbook("deploy.yml", fleet.inventory, extra)
            probe.stop.set()
            if rc:
                raise SystemExit(f"{hosts} hosts: first deploy failed:\n"
                                 + "\n".join(x for _, x in lines[-40:]))
            ready_line = {}  # the gate's verdict line, printed as each host's arrives
            for at, text in lines:
                for host in fleet.hosts:
                    if text.startswith(f"GATE [{host}]: ready"):
                        ready_line.setdefault(host, at)
            own_start = [probe.first_ok[h] - started_at(fleet, h) for h in fleet.hosts
                         if h in probe.first_ok and started_at(fleet, h)]
            lag = [ready_line[h] - probe.first_ok[h] for h in fleet.hosts
                   if h in ready_line and h in probe.first_ok]
            floor_runs, rerun_runs = [], []
            for _ in range(reruns):
                f_wall, f_cpu, f_rc, _ = timed_playbook(str(FLOOR), fleet.inventory, extra)
                r_wall, r_cpu, r_rc, r_lines = timed_playbook("deploy.yml", fleet.inventory,
                                                              extra)
                recap = [x for _, x in r_lines if " ok=" in x and "changed=" in x]
                if f_rc or r_rc or len(recap) < recaps or any("changed=0 " not in x
                                                             for x in recap):
                    raise SystemExit(f"{hosts} hosts: a re-run changed something or failed "
                                     f"(rc {r_rc}, floor rc {f_rc}): {recap}")
                floor_runs.append((f_wall, f_cpu))
                rerun_runs.append((r_wall, r_cpu))
        finally:
            run_playbook("playbooks/stop.yml", fleet.inventory, extra)
            fleet.kill_leftovers()
    return {
        "hosts": hosts,
        "router": router is not None,
        "floor_s": statistics.median(w for w, _ in floor_runs),
        "rerun_s": statistics.median(w for w, _ in rerun_runs),
        "floor_cpu_s": statistics.median(c for _, c in floor_runs),
        "rerun_cpu_s": statistics.median(c for _, c in rerun_runs),
        "first_deploy_s": wall,
        "servers_own_start_s": max(own_start) if own_start else float("nan"),
        "verdict_lag_s": lag,
        "first_cpu_s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--reruns", type=int, default=5)
    parser.add_argument("--time-factor", type=float, default=0.02)
    # The role's default (10 s) unless given: each gate call waits on the node up to this
    # long, and returns at once on a verdict or a phase change. 1 is its busiest setting: a
    # new module run every second per host.
    parser.add_argument("--gate-interval", type=int, default=None,
                        help="sglang_server_gate_poll_interval (default: the role's, 10 s)")
    parser.add_argument("--no-router", action="store_true",
                        help="the servers alone (the default fleet has the router too)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    router = None if args.no_router else router_venv(ROUTER_VENVS)
    rows = []
    for hosts in args.hosts:
        rows.append(measure(hosts, args.reruns if hosts <= 16 else max(2, args.reruns // 2),
                            args.time_factor, args.gate_interval, router))
        if args.json:
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        return
    print(f"simulated fleet{'' if router else ' without its router'}, local connection "
          f"(sglang-sim, time factor {args.time_factor}, "
          f"gate interval {args.gate_interval or 'the default 10'} s); "
          f"medians of {args.reruns} alternated runs")
    print(f"{'hosts':>5} {'floor s':>8} {'re-run s':>9} {'ratio':>6} {'first s':>8} "
          f"{'own start s':>11} {'overhead s':>10} {'x floor':>7} {'verdict lag s (max)':>19} "
          f"{'CPU s/host re-run':>17} {'floor':>6} {'first':>6}")
    for r in rows:
        lag = max(r["verdict_lag_s"]) if r["verdict_lag_s"] else float("nan")
        overhead = r["first_deploy_s"] - r["servers_own_start_s"]
        print(f"{r['hosts']:>5} {r['floor_s']:>8.2f} {r['rerun_s']:>9.2f} "
              f"{r['rerun_s'] / r['floor_s']:>6.2f} {r['first_deploy_s']:>8.2f} "
              f"{r['servers_own_start_s']:>11.2f} {overhead:>10.2f} "
              f"{overhead / r['floor_s']:>7.2f} {lag:>19.2f} "
              f"{r['rerun_cpu_s'] / r['hosts']:>17.2f} {r['floor_cpu_s'] / r['hosts']:>6.2f} "
              f"{r['first_cpu_s'] / r['hosts']:>6.2f}")
    for a, b in zip(rows, rows[1:], strict=False):
        added = b["hosts"] - a["hosts"]
        deploy = (b["rerun_s"] - a["rerun_s"]) / added
        floor = (b["floor_s"] - a["floor_s"]) / added
        print(f"each added host {a['hosts']}->{b['hosts']}: re-run +{deploy:.3f} s, floor "
              f"+{floor:.3f} s ({deploy / floor if floor > 0 else float('nan'):.2f}x)")


if __name__ == "__main__":
    main()
