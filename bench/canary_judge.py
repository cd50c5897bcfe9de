"""Canary judgement under a steady client stream: each injected regression detected and rolled
back by itself with no failed client request, and A/A rollouts that are never rolled back.

    .venv/bin/python bench/canary_judge.py [--window 30] [--aa 20] [--clients 6]
                                           [--regressions decode,ttft,itl,errors,aborts,outputs]
                                           [--across 0.5.4.post3] [--json PATH]

One simulated fleet (three sglang-sim nodes, Kimi-K2.5 TP=8 profile, time factor 0.005 for
loading; decode, first-token and inter-token times are the profile's, in real seconds) behind
the real router (the pinned sglang-router wheel). Clients stream /generate through the router
all through every deploy (bench/zero_drop.py's load). Each case deploys a canary (sim-node-1)
with `sglang_server_sim_regress` set, `sglang-fleet deploy --canary`-style:

  regressions: +5% errors, +5% aborts, +30% TTFT, +30% inter-token latency tail, -20%
  tokens/s, changed greedy outputs; each must fail on its own signal and roll back;
  A/A: a new configuration that serves exactly like the baseline (`decode=1`, then `ttft=1`,
  alternating so that each run changes the configuration); each must pass, and the rollout
  goes on to the other servers;
  across releases (last, `--across RELEASE`, empty for none): the canary on another SGLang
  release, whose greedy outputs are then compared by log-probability distance. With
  `outputs=changed` it must fail on greedy outputs and roll back; with `outputs=near` (a near
  tie flipped at every eighth token, 0.2 nat apart: SIMULATED logprobs) it must pass, and the
  rollout takes the whole fleet to that release.

Printed per case: the verdict, the deciding signal with both values, the window, whether it
was rolled back, failed client requests during the deploy (those the regression itself failed,
its injected 500s and aborts on the canary, counted apart: they are what the judge must see),
and the deploy's wall time. The servers are simulated; the router, the traffic, the window and
every time are real, on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sglang_fleet.bench.loadgen import Load
from sglang_fleet.runs.store import STATE_DIR_VAR
from sglang_fleet.testfleet.local import make_fleet
from sglang_fleet.testfleet.router import router_venv

REGRESSIONS = {
    "decode": ("decode=0.8", "generation tokens/s"),
    "ttft": ("ttft=1.3", "p99 time to first token"),
    "itl": ("itl=1.3", "p99 inter-token latency"),
    "errors": ("errors=0.05", "error rate"),
    "aborts": ("aborts=0.05", "abort rate"),
    "outputs": ("outputs=changed", "greedy outputs"),
}
NO_OPS = ("decode=1", "ttft=1")
CANARY = "sim-node-1"


def judgement(output: str) -> str:
    """The canary's judgement line, up to its window's traffic."""
    text = " ".join(output.split())
    found = re.search(rf"{CANARY}: canary ((?:failed|passed|inconclusive).*?live traffic "
                      r"\(canary \d+ requests, baseline \d+\))", text)
    return found.group(1) if found else "(no judgement line)"


def one_case(fleet, regress: str, window: float, clients: int,
             release: str | None = None) -> dict[str, Any]:
    load = Load(url=fleet.router_url, clients=clients, max_new_tokens=32, duration=3600).start()
    started = time.monotonic()
    other = {"sglang_server_version": release} if release else {}
    try:
        run = fleet.deploy(extra=fleet.with_stores(
            sglang_fleet_canary=CANARY, sglang_bench_canary_window=window,
            sglang_server_sim_regress=regress, **other))
    finally:
        load.stop()
        records = load.wait()
    failed = [r for r in records if not r.completed]
    # What the canary's regression itself did to the requests it served (its 500s and
    # aborts) is what the judge must see; any other failure is the rollout's.
    injected = [r for r in failed if "SGLANG_SIM_REGRESS" in f"{r.error} {r.abort}"
                or r.abort == "None: Aborted"]
    text = " ".join(run.output.split())
    return {"regress": regress, "rc": run.rc, "judgement": judgement(run.output),
            "rolled_back": f"{CANARY}: rolled back:" in text,
            "requests": len(records), "injected": len(injected),
            "failed": len(failed) - len(injected),
            "failures": [f"{r.rid}: {r.error or r.abort}" for r in failed
                         if r not in injected][:5],
            "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--aa", type=int, default=20)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--regressions", default=",".join(REGRESSIONS))
    parser.add_argument("--across", default="0.5.4.post3",
                        help="the other SGLang release of the last two cases; empty for none")
    parser.add_argument("--json")
    args = parser.parse_args()
    # A SIGTERM ends the run as Ctrl-C does: the fleet is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="canary-bench-"))
    # The runs' records and ledger in the bench's folder, not the operator's stores.
    os.environ[STATE_DIR_VAR] = str(tmp / "state")
    fleet = make_fleet(tmp, hosts=3, time_factor=0.005, router=router_venv(tmp))
    results: list[dict[str, Any]] = []
    try:
        first = fleet.deploy(extra=fleet.with_stores())
        if first.rc:
            print(first.output[-3000:])
            return 1
        cases = [(name, *REGRESSIONS[name], None) for name in args.regressions.split(",")
                 if name]
        cases += [(f"A/A {i + 1}", NO_OPS[i % 2], "passed", None) for i in range(args.aa)]
        if args.across:  # the changed outputs first: the near ties pass and move the fleet
            cases += [("across", "outputs=changed", "greedy outputs", args.across),
                      ("across", "outputs=near", "passed", args.across)]
        for name, regress, expected, release in cases:
            r = one_case(fleet, regress, args.window, args.clients, release)
            r.update(case=name, expected=expected,
                     right=(r["judgement"].startswith(f"failed on {expected}") and r["rolled_back"])
                     if expected != "passed" else (r["rc"] == 0 and not r["rolled_back"]))
            results.append(r)
            print(f"{name:8} {regress:16} {'OK ' if r['right'] else 'BAD'} "
                  f"failed requests {r['failed']}/{r['requests']} (+{r['injected']} by the "
                  f"regression itself), {r['seconds']:.0f} s: "
                  f"{r['judgement'][:220]}", flush=True)
    finally:
        fleet.stop()
        fleet.kill_leftovers()
    regress = [r for r in results if r["expected"] != "passed"]
    aa = [r for r in results if r["expected"] == "passed"]
    print(f"\nregressions detected on their own signal and rolled back: "
          f"{sum(r['right'] for r in regress)}/{len(regress)}; rollouts that must pass (A/A, "
          f"and across releases with near ties) rolled back: "
          f"{sum(r['rolled_back'] for r in aa)}/{len(aa)} (passed {sum(r['right'] for r in aa)}); "
          f"failed client requests in all: {sum(r['failed'] for r in results)} of "
          f"{sum(r['requests'] for r in results)}; window {args.window:g} s (real seconds)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["right"] and not r["failed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
