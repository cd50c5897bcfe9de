"""How long a bad inventory takes to be refused, and that no node is contacted meanwhile; how
long the pinned release's own check takes, and the first build of a release's environment.

    .venv/bin/python bench/refusal_time.py [--hosts 4] [--runs 5] [--build 0.5.22]

A copy of the default simulated fleet (four nodes; with --router, the real router in front),
its last host given a layout its model cannot run (Kimi-K2.5 at TP 3). Times, side by side
in alternation, from the start of the command to its exit:

- `ansible-playbook deploy.yml` (the validation play refuses the run);
- `sglang-fleet check` (the same validation, alone);
- `sglang-fleet deploy` (through ansible-runner, with its summary and JUnit files).

Each run asserts the refusal and that the nodes' folder was never created. Then, on the same
fleet made valid, `sglang-fleet check` with its release's environment cached on the controller:
with each host's verdict cached (the inventory checked before), and with none (a changed
inventory: one run of the release's resolution pipeline for all hosts). Last, unless
--build '' is given, the first build of a release's environment (`sglang-fleet release add
VERSION --wheelhouse`, its wheel downloaded beforehand, untimed) into a private cache that
shares the CPU torch environment. Prints each command's median, min and max in seconds, and
the machine's load average.
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

from sglang_fleet.known import release_cache
from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet


def timed(cmd: list[str], env: dict[str, str] | None = None
          ) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env={**ansible_env(), **(env or {})},
                          capture_output=True, text=True, timeout=1800)
    return time.monotonic() - start, proc


def private_cache(tmp: Path, name: str) -> Path:
    """A cache of its own that shares the controller's CPU torch environment and built
    releases (links), so that verdicts and new releases land only here."""
    shared = release_cache.root()
    cache = tmp / name
    cache.mkdir()
    for entry in shared.iterdir():
        if entry.name == "venv" or (entry.name.startswith("sglang-") and
                                    (entry / ".ready").exists()):
            (cache / entry.name).symlink_to(entry)
    return cache


def report(title: str, seconds: dict[str, list[float]]) -> None:
    print(title)
    print(f"{'command':44} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, values in seconds.items():
        print(f"{name:44} {statistics.median(values):9.2f} {min(values):7.2f} "
              f"{max(values):7.2f}")


def release_check_times(tmp: Path, fleet, runs: int) -> dict[str, list[float]]:
    """`sglang-fleet check` of a valid fleet, the release's environment built: with every
    verdict cached, and with none (a new verdicts folder each run)."""
    fleet.set_host_vars(fleet.hosts[-1], {})
    cache = private_cache(tmp, "check-cache")
    env = {"SGLANG_FLEET_REF_DIR": str(cache)}
    cmd = [str(BIN / "sglang-fleet"), "check", "-i", str(fleet.inventory), "-e",
           json.dumps(fleet.extra), "--run-dir", str(tmp / "check-runs")]
    seconds: dict[str, list[float]] = {"check, verdicts cached": [],
                                       "check, one run of the release (no verdict)": []}
    for _ in range(runs):
        shutil.rmtree(cache / "verdicts", ignore_errors=True)
        for name in ("check, one run of the release (no verdict)", "check, verdicts cached"):
            took, proc = timed(cmd, env)
            assert proc.returncode == 0, (name, proc.stdout[-2000:], proc.stderr[-2000:])
            assert not fleet.root.exists(), f"{name} touched a node"
            seconds[name].append(took)
    return seconds


def first_build_time(tmp: Path, version: str) -> float:
    """`sglang-fleet release add VERSION --wheelhouse` into a private cache: the release's
    package installed, the modules its parser and checks import found, its catalogue dumped."""
    cache = private_cache(tmp, "build-cache")
    shutil.rmtree(cache / f"sglang-{version}", ignore_errors=True)
    (cache / f"sglang-{version}").unlink(missing_ok=True)
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                    str(wheels), f"sglang=={version}"], check=True)
    took, proc = timed([str(BIN / "sglang-fleet"), "release", "add", version, "--wheelhouse",
                        str(wheels)], {"SGLANG_FLEET_REF_DIR": str(cache)})
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only-build", action="store_true",
                        help="time the first build of --build alone")
    parser.add_argument("--build", default="0.5.22", metavar="VERSION",
                        help="the release whose first build is timed ('' skips it)")
    args = parser.parse_args()
    if args.only_build:
        with tempfile.TemporaryDirectory(prefix="refusal-") as tmp:
            took = first_build_time(Path(tmp), args.build)
        print(f"first build of SGLang {args.build}'s environment and catalogue (release add "
              f"--wheelhouse; CPU torch already on the controller): {took:.1f} s")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return
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
        report(f"refusal of a bad inventory ({args.hosts} simulated hosts, the last one "
               f"refused), {args.runs} alternated runs each; no node contacted in any", seconds)
        checks = release_check_times(Path(tmp), fleet, args.runs)
        report(f"\nsglang-fleet check of the valid fleet, its release's environment cached "
               f"({args.hosts} hosts), {args.runs} alternated runs each", checks)
        if args.build:
            took = first_build_time(Path(tmp), args.build)
            print(f"\nfirst build of SGLang {args.build}'s environment and catalogue (release "
                  f"add --wheelhouse; CPU torch already on the controller): {took:.1f} s")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
