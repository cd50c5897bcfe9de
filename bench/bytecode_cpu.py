"""What the package's bytecode saves where PYTHONDONTWRITEBYTECODE is set: each command run
side by side, A (a copy of the package without bytecode, first on PYTHONPATH, so that every
process compiles it from source) against B (this checkout, compiled by ./bootstrap), in
alternating pairs; prints each command's median CPU seconds (user + system of the command and
every child it waited for) and the median of the pairs' A/B ratios.

    .venv/bin/python bench/bytecode_cpu.py --pairs 10

Run it on a quiet machine; the state folder is a temporary one, so no run record lands in the
repository's `.sglang-fleet/`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def commands(play: Path) -> dict[str, list[str]]:
    return {
        "a one-task playbook": [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                                str(play)],
        "sglang-fleet --help": [str(BIN / "sglang-fleet"), "--help"],
        "import the simulator": [sys.executable, "-c", "import sglang_fleet.sim.launch_server"],
    }


def cpu_of(cmd: list[str], env: dict[str, str]) -> float:
    """User + system seconds of `cmd` and the children it waited for."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return usage.ru_utime + usage.ru_stime


def uncompiled_copy(root: Path) -> Path:
    """The package copied under `root` (its node link followed), with no bytecode."""
    shutil.copytree(REPO / "src" / "sglang_fleet", root / "sglang_fleet", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bytecode-cpu-") as tmp:
        root = Path(tmp)
        play = root / "one-task.yml"
        play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - ansible.builtin.debug:\n        msg: hi\n")
        compiled = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                        SGLANG_FLEET_STATE_DIR=str(root / "state"))
        source = dict(compiled, PYTHONPATH=str(uncompiled_copy(root / "copy")))
        print(f"{'command':24} {'A: CPU s':>9} {'B: CPU s':>9} {'A/B':>6}  ({ns.pairs} pairs,"
              " medians)")
        for name, cmd in commands(play).items():
            a, b = [], []
            for _ in range(ns.pairs):
                a.append(cpu_of(cmd, source))
                b.append(cpu_of(cmd, compiled))
            ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
            print(f"{name:24} {statistics.median(a):9.3f} {statistics.median(b):9.3f}"
                  f" {ratio:6.2f}")


if __name__ == "__main__":
    main()
