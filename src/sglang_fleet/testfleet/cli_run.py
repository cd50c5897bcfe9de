"""A `sglang-fleet` command started in the background, as a job runner or a shell would, and
the processes of its run: ansible-playbook (a child of the CLI leading its own session) and
its workers (each calls setsid). Tests and the safety trials interrupt or kill the CLI
mid-run and then look at, or end, exactly those processes, never others of the machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sglang_fleet.node.process import procs
from sglang_fleet.testfleet import local

Identity = tuple[int, int]  # (pid, start time): a PID alone may be reused


class CliRun:
    """`sglang-fleet ARGS`, its output (stdout and stderr) in `output`."""

    def __init__(self, output: Path, *args: str) -> None:
        self.output = output
        self.sessions: set[int] = set()
        # local.REPO read now: the safety trials point it at the checkout they try.
        with open(output, "w") as out:
            self.proc = subprocess.Popen([str(local.BIN / "sglang-fleet"), *args],
                                         cwd=local.REPO, env=local.ansible_env(), stdout=out,
                                         stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.output.read_text()

    def track(self) -> set[int]:
        """Add the sessions the run has created by now; all of them."""
        table = {pid: info for pid in procs.all_pids() if (info := procs.process_info(pid))}
        for parents in ({self.proc.pid}, self.sessions):
            self.sessions |= {pid for pid, info in table.items()
                              if info["ppid"] in parents and info["sid"] == pid}
        return self.sessions

    def gating(self, host: str) -> bool:
        """The run has reached `host`'s gate, its workers' sessions tracked."""
        self.track()
        return f"GATE [{host}]" in self.text() and len(self.sessions) > 1

    def members(self) -> list[dict]:
        """The live processes of the run's sessions."""
        return [info for pid in procs.all_pids() if (info := procs.process_info(pid))
                and info["sid"] in self.sessions and info["state"] not in ("Z", "X")]

    def identities(self) -> set[Identity]:
        return {(p["pid"], p["start_ticks"]) for p in self.members()}

    def kill(self, only: set[Identity], signum: int) -> None:
        """Signal those of `only` that still run (the run's processes, should they outlive
        their CLI)."""
        procs.signal_pids([p["pid"] for p in self.members()
                           if (p["pid"], p["start_ticks"]) in only], signum)
