"""Wall time of a first deploy and of a no-change re-run of the simulated fleet, by node count.

    .venv/bin/python bench/deploy_scaling.py --nodes 4 16

Each size gets its own inventory (the default fleet's settings, N nodes, free loopback ports)
under a temp folder; servers are stopped afterwards. Servers are simulated (sglang-sim, TP=8,
phase durations x --time-factor), so the figures measure the toolkit and Ansible, not SGLang.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from sglang_fleet.testfleet.local import REPO, free_port_block, run_playbook


def fleet_inventory(folder: Path, nodes: int) -> Path:
    inventory = folder / "inventory"
    shutil.copytree(REPO / "inventory" / "local" / "group_vars", inventory / "group_vars")
    hosts = {f"sim-node-{i + 1}": {"sglang_sim_node_index": i} for i in range(nodes)}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"sglang_servers": {"hosts": hosts}}}}))
    return inventory


def measure(nodes: int, time_factor: float, forks: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{nodes}-") as tmp:
        folder = Path(tmp)
        inventory = fleet_inventory(folder, nodes)
        extra = {"sglang_fleet_sim_root": str(folder / "nodes"),
                 "sglang_fleet_sim_base_port": free_port_block(nodes),
                 "sglang_server_sim_time_factor": time_factor}
        forks_arg = ("--forks", str(forks))
        try:
            t0 = time.monotonic()
            first = run_playbook("deploy.yml", inventory, extra, *forks_arg)
            t1 = time.monotonic()
            again = run_playbook("deploy.yml", inventory, extra, *forks_arg)
            t2 = time.monotonic()
        finally:
            run_playbook("playbooks/stop.yml", inventory, extra, *forks_arg)
        if first.rc or again.rc or again.changed_hosts():
            raise SystemExit(f"{nodes} nodes: deploy failed or re-run changed something:\n"
                             f"{(first.output if first.rc else again.output)[-2000:]}")
        return {"nodes": nodes, "first_deploy_s": t1 - t0, "rerun_s": t2 - t1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--time-factor", type=float, default=0.02)
    parser.add_argument("--forks", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    rows = [measure(n, args.time_factor, args.forks) for n in args.nodes]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    base = rows[0]
    print(f"simulated fleet (sglang-sim, TP=8 per node, time factor {args.time_factor}, "
          f"forks {args.forks})")
    print(f"{'nodes':>5}  {'first deploy s':>14}  {'no-change re-run s':>18}  "
          f"{'first x':>7}  {'re-run x':>8}")
    for row in rows:
        print(f"{row['nodes']:>5}  {row['first_deploy_s']:>14.1f}  {row['rerun_s']:>18.1f}  "
              f"{row['first_deploy_s'] / base['first_deploy_s']:>7.2f}  "
              f"{row['rerun_s'] / base['rerun_s']:>8.2f}")


if __name__ == "__main__":
    main()
