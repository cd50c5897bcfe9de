"""Deploy + gate, then health, of 8, 32 and 64 simulated nodes over real SSH, with Ansible's
default settings and with the tuned ones, side by side.

    .venv/bin/python bench/ssh_scaling.py [--nodes 8 32 64]

Each node is its own sshd on its own loopback address with a non-root login user and sudo
(sglang_fleet.testfleet.ssh; needs root, openssh-server and sudo). Servers are sglang-sim at TP=1
(three processes per node, so that 64 nodes fit a 2-core, 24 GiB machine), time factor
0.005: the gate waits about 2.5 s of simulated loading per node, and the rest is Ansible.

default: Ansible's own defaults: forks 5, no pipelining (SSH connections reused for 60 s).
tuned:   forks = nodes (up to 64), pipelining, connections kept 300 s. Neither gathers facts:
         the playbooks never do.

It also prints the controller's own CPU seconds per node (ansible-playbook, its forks, their ssh
clients), which is what a real controller pays: on a real fleet the module runs, here on the
same two cores, happen on the nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env
from sglang_fleet.testfleet.ssh import make_ssh_fleet, unavailable

SETTINGS = {
    # Ansible's own defaults (its default ssh_args already reuse connections, 60 s).
    "default": {"ANSIBLE_FORKS": "5", "ANSIBLE_PIPELINING": "False"},
    # forks = nodes (set below), pipelining (sudo without requiretty), longer ControlPersist.
    "tuned": {"ANSIBLE_PIPELINING": "True",
              "ANSIBLE_SSH_ARGS": "-C -o ControlMaster=auto -o ControlPersist=300s"},
}


def timed(playbook: str, inventory: Path, extra: dict, env: dict) -> tuple[float, float]:
    """Wall seconds, and the controller's CPU seconds: ansible-playbook, its forks and their
    ssh clients (the module runs on a node are children of that node's sshd, not counted)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), playbook,
                           "-e", json.dumps(extra)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{playbook} failed:\n{proc.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 32, 64])
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        raise SystemExit(f"ssh_scaling: {reason}")
    rows = []
    for n in args.nodes:
        with tempfile.TemporaryDirectory(prefix=f"sglang-fleet-ssh{n}-") as tmp:
            fleet = make_ssh_fleet(Path(tmp), hosts=n, tp=1, time_factor=0.005)
            extra = dict(fleet.with_stores(), sglang_server_gate_stall_windows={
                "launching": 60, "loading_weights": 30})
            try:
                row = {"nodes": n}
                for name, overrides in SETTINGS.items():
                    env = dict(ansible_env(), **overrides)
                    if name == "tuned":
                        env["ANSIBLE_FORKS"] = str(min(n, 64))
                    row[f"{name} deploy"], row[f"{name} cpu"] = timed(
                        "deploy.yml", fleet.inventory, extra, env)
                    row[f"{name} health"] = timed("playbooks/health.yml", fleet.inventory,
                                                  extra, env)[0]
                    timed("playbooks/stop.yml", fleet.inventory, extra, env)
                rows.append(row)
                print(f"{n} nodes done: {row}", file=sys.stderr, flush=True)
            finally:
                fleet.stop()
                fleet.close()
                fleet.kill_leftovers()
    print(f"simulated nodes over SSH (sshd per node, sudo, sglang-sim TP=1, time factor 0.005); "
          f"{os.cpu_count()} CPUs")
    print(f"{'nodes':>5} {'deploy+gate default s':>22} {'tuned s':>8} {'speed-up':>9} "
          f"{'health default s':>17} {'tuned s':>8} {'controller CPU s/node default':>30} "
          f"{'tuned':>6}")
    for r in rows:
        n = r["nodes"]
        print(f"{n:>5} {r['default deploy']:>22.1f} {r['tuned deploy']:>8.1f} "
              f"{r['default deploy'] / r['tuned deploy']:>8.1f}x {r['default health']:>17.1f} "
              f"{r['tuned health']:>8.1f} {r['default cpu'] / n:>30.2f} "
              f"{r['tuned cpu'] / n:>6.2f}")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        growth = b["nodes"] / a["nodes"]
        slow = b["default deploy"] / a["default deploy"]
        fast = b["tuned deploy"] / a["tuned deploy"]
        print(f"{growth:.0f}x the nodes: default deploy {slow:.1f}x the time, tuned {fast:.1f}x")


if __name__ == "__main__":
    main()
