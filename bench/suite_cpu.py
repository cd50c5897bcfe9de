"""Where a test run's CPU goes: the command (pytest, by default a few test files) runs under
this script as Linux's child subreaper, so the simulated servers, which leave their starter's
process tree, are reaped here with their CPU; each reaped process is named by what /proc
showed while it lived (read every 50 ms).

    .venv/bin/python bench/suite_cpu.py -- \
        .venv/bin/pytest -o addopts= -q tests/integration/test_gate.py

It prints CPU seconds (user + system) for:
- the command's own tree: pytest, every ansible-playbook and ansible-runner, every module run
  on a simulated node (they are their children and are reaped inside it);
- the simulated servers by process: the main process (`sglang_fleet.sim.launch_server`), the
  schedulers and the detokenizer (each a fresh interpreter), their launch shells;
- the routers (sglang-router), and anything else that outlived its parent.

Processes from elsewhere on the machine are never counted: only descendants are reaped here.
Linux only (prctl PR_SET_CHILD_SUBREAPER).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05


def role(cmdline: str) -> str:
    """What a process was, from its command line (its title once SGLang's simulator set it)."""
    first = cmdline.split(" ", 1)[0]
    for marker, name in (("sglang::scheduler", "simulated server: scheduler"),
                         ("sglang_fleet.sim.engine.scheduler", "simulated server: scheduler"),
                         ("sglang::detokenizer", "simulated server: detokenizer"),
                         ("sglang_fleet.sim.engine.detokenizer", "simulated server: detokenizer"),
                         ("sglang::data_parallel", "simulated server: DP controller"),
                         ("sglang_fleet.sim.engine.controller", "simulated server: DP controller"),
                         ("sglang_fleet.sim.launch_server", "simulated server: main process"),
                         ("resource_tracker", "simulated server: resource tracker"),
                         ("sglang_router", "router (sglang-router)"),
                         ("sgl-router", "router (sglang-router)"),
                         (".launch.sh", "simulated server: launch shell"),
                         ("ansible", "ansible (outlived its run)")):
        if marker in cmdline:
            return name
    return f"other: {os.path.basename(first)[:40] or '?'}"


class Names:
    """Each descendant's command line, as last seen while it lived."""

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}
        self.stop = threading.Event()

    def watch(self) -> None:
        while not self.stop.is_set():
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    self._read(int(entry))
            self.stop.wait(POLL_S)

    def _read(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return
        if text:  # a title set later (setproctitle) replaces the interpreter's line
            self.seen[pid] = text


def run(command: list[str]) -> tuple[int, float, collections.Counter]:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"suite_cpu: prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}")
    names = Names()
    threading.Thread(target=names.watch, daemon=True).start()
    began = time.monotonic()
    main = os.fork()
    if main == 0:
        os.execvp(command[0], command)
    cpu: collections.Counter = collections.Counter()
    status = 0
    while True:
        try:
            pid, wait_status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        seconds = usage.ru_utime + usage.ru_stime
        if pid == main:
            cpu["the command's tree: pytest, ansible-playbook, module runs"] += seconds
            status = os.waitstatus_to_exitcode(wait_status)
        else:
            cpu[role(names.seen.get(pid, ""))] += seconds
    names.stop.set()
    return status, time.monotonic() - began, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command after --, e.g. -- .venv/bin/pytest -o addopts= tests/...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    status, wall, cpu = run(command)
    total = sum(cpu.values())
    print(f"\nsuite_cpu: {' '.join(command)}")
    print(f"exit {status}, {wall:.1f} s wall, {total:.1f} CPU s "
          f"(load average now {os.getloadavg()[0]:.1f})")
    for name, seconds in cpu.most_common():
        print(f"  {seconds:8.1f} s  {100 * seconds / total if total else 0:5.1f}%  {name}")
    sys.exit(status)


if __name__ == "__main__":
    main()
