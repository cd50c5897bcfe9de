"""Where a command's CPU goes, by kind of process, from the kernel's own process accounting:
every process that ends while the command runs is recorded with its CPU, parent and name
(`accton`, Debian's `acct` package; root only). Unlike bench/suite_cpu.py it tells
ansible-playbook's own process from the workers it forks for each task and host, and the
module runs from the simulated servers, and it misses nothing that exits, however short.

    sudo apt-get install acct
    .venv/bin/python bench/acct_cpu.py -- \
        .venv/bin/pytest -o addopts= -q -p no:cacheprovider -n 2 tests/integration/test_recover.py

Processes from elsewhere on the machine that end meanwhile are counted too: run it on a quiet
machine. The kernel records CPU in ticks (10 ms), so a process shorter than that counts 0; the
count column shows how many there were. A process still running when the command ends (a
server a test left) is not counted.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = 100  # dump-acct prints AHZ ticks


@dataclass(frozen=True)
class Ended:
    name: str
    cpu_s: float
    elapsed_s: float
    pid: int
    ppid: int
    forked: bool  # forked and never exec'd: an ansible-playbook worker


def read_accounting(path: Path) -> list[Ended]:
    """dump-acct's lines: name|v3|utime|stime|etime|uid|gid|mem|io|pid|ppid|flags|..."""
    out = subprocess.run(["dump-acct", str(path)], capture_output=True, text=True,
                         check=True).stdout
    ended = []
    for line in out.splitlines():
        f = [part.strip() for part in line.split("|")]
        ended.append(Ended(f[0], (float(f[2]) + float(f[3])) / TICKS_PER_S,
                           float(f[4]) / TICKS_PER_S, int(f[9]), int(f[10]), "F" in f[11]))
    return ended


def kind(process: Ended, by_pid: dict[int, Ended]) -> str:
    name = process.name
    if name.startswith("ansible-playboo"):
        return "ansible-playbook: a forked worker" if process.forked else \
            "ansible-playbook: its own process"
    if name.startswith("sglang::"):
        return f"simulated server: {name.removeprefix('sglang::')[:9]}"
    if name.startswith("python"):
        parent = by_pid.get(process.ppid)
        grandparent = by_pid.get(parent.ppid) if parent else None
        if parent and parent.name.startswith("ansible-playboo"):
            return "python under a worker (the release check's reference SGLang)"
        if parent and parent.name == "sh" and process.elapsed_s < 30 and (
                grandparent is None or grandparent.name == "sh"):
            return "python: a module run (or a short-lived server)"
        return "python: other (a server's main process, clients)"
    return f"other: {name}"


def summary(ended: list[Ended]) -> list[tuple[str, float, int]]:
    by_pid = {p.pid: p for p in ended}
    seconds: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for process in ended:
        name = kind(process, by_pid)
        seconds[name] += process.cpu_s
        count[name] += 1
    return [(name, s, count[name]) for name, s in seconds.most_common()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    command = [c for c in parser.parse_args().command if c != "--"]
    if not command:
        parser.error("give a command after --")
    with tempfile.TemporaryDirectory() as folder:
        record = Path(folder) / "acct"
        record.touch()
        subprocess.run(["accton", str(record)], check=True, capture_output=True)
        began = time.monotonic()
        try:
            status = subprocess.run(command).returncode
        finally:
            wall = time.monotonic() - began
            subprocess.run(["accton", "off"], check=True, capture_output=True)
        rows = summary(read_accounting(record))
    total = sum(s for _, s, _ in rows)
    print(f"\nacct_cpu: {' '.join(command)}")
    print(f"exit {status}, {wall:.1f} s wall, {total:.1f} CPU s in processes that ended")
    for name, s, n in rows:
        if s or n > 100:
            print(f"  {s:8.1f} s  {100 * s / total if total else 0:5.1f}%  {n:6d}  {name}")
    sys.exit(status)


if __name__ == "__main__":
    main()
