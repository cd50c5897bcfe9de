#!/usr/bin/env python3
"""Weights staged once per fleet, measured: N simulated nodes on loopback (each a staging agent
with its own root folder and a per-node bandwidth cap, a token bucket on what it receives and on
what it sends), a synthetic checkpoint (safetensors shards, their index, config.json) made here,
and an origin that counts the bytes it serves. Prints, per N:

  origin bytes / model size               (target at most 1.05)
  fleet time / (model size / bandwidth)   (target at most 1.5, flat in N)

  .venv/bin/python bench/stage.py [--nodes 4 8 16] [--size-mb 48] [--mbps 8] [--piece-kb 128]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.node.staging import node
from sglang_fleet.staging.synthetic import make_checkpoint
from sglang_fleet.testfleet.staging import LoopbackFleet, Origin


def run_fleet(n: int, work: Path, manifest: dict, origin: Origin, options: dict,
              timeout: float, verbose: bool) -> tuple[float, float]:
    """Seconds until the last node published, and the origin's bytes served meanwhile."""
    fleet = LoopbackFleet(work / f"n{n}", manifest, origin.url, n, options)
    before = origin.served()
    start = time.monotonic()
    fleet.start()
    done = fleet.wait(timeout)
    elapsed = time.monotonic() - start
    unpublished = [nm for nm in fleet.names if not fleet.published(nm)]
    if unpublished:
        sys.exit(f"stage bench: {unpublished} did not publish in {timeout:.0f} s: "
                 f"{[fleet.status(nm) for nm in unpublished]}")
    for nm in fleet.names:
        problems = node.verify_published(fleet.places[nm], manifest)
        if problems:
            sys.exit(f"stage bench: {nm}'s copy disagrees with the manifest: {problems}")
    if verbose:
        print("   published at", " ".join(f"{done[nm]:.2f}" for nm in fleet.names))
    fleet.stop()
    return elapsed, origin.served() - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--size-mb", type=float, default=48.0)
    ap.add_argument("--mbps", type=float, default=8.0, help="per-node cap, MB/s each way")
    ap.add_argument("--piece-kb", type=int, default=128)
    ap.add_argument("--verbose", action="store_true", help="each node's publish time")
    args = ap.parse_args()
    rate = args.mbps * 1e6
    with tempfile.TemporaryDirectory(prefix="stage-bench-") as tmp:
        work = Path(tmp)
        folder = make_checkpoint(work / "origin" / "synthetic", int(args.size_mb * 1e6))
        manifest = mf.build(str(folder), "synthetic", "r1", piece_size=args.piece_kb * 1024)
        size = manifest["total_bytes"]
        ideal = size / rate
        origin = Origin(work, manifest, folder, rate)
        options = {"rate_in": rate, "rate_out": rate, "wait_s": 2.0, "stall_s": 10.0,
                   "give_up_s": 60.0, "linger_s": 5.0}
        print(f"simulated fleet on loopback: synthetic checkpoint {size / 1e6:.1f} MB in "
              f"{len(manifest['files'])} files, {args.piece_kb} KiB pieces, per-node cap "
              f"{args.mbps:g} MB/s each way (token bucket); size / bandwidth = {ideal:.2f} s")
        print(f"{'nodes':>5}  {'origin bytes/size':>17}  {'fleet time':>10}  "
              f"{'time/(size/bw)':>14}")
        for n in args.nodes:
            seconds, origin_bytes = run_fleet(n, work, manifest, origin, options,
                                              ideal * 10 + 60, args.verbose)
            print(f"{n:>5}  {origin_bytes / size:>17.3f}  {seconds:>9.2f}s  "
                  f"{seconds / ideal:>14.2f}", flush=True)
        origin.stop()


if __name__ == "__main__":
    main()
