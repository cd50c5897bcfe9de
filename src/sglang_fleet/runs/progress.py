"""Live progress from ansible-runner events: a board of one line per host on a terminal, plain
lines when the output is a file or a CI log.

Plain mode prints a line whenever a host changes stage (spec, deploy, health, benchmark,
recover), step of the deploy stage, gate phase or verdict; says what keeps a busy host quiet
(its task, its gate phase's countdown) once it has been quiet for a third of `heartbeat_s`
(10 s); and prints again at least every `heartbeat_s` seconds (30) while a host is busy, so
that a CI log never goes quiet for longer. A failure is printed whole; a LaunchSpec refused
for the same reason on several hosts is said once, naming them, its full text (with the fix)
following the final table.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from sglang_fleet.node.common.text import inert
from sglang_fleet.node.common.vocab import PROGRESSING, duration_text, verdict_phrase
from sglang_fleet.node.health.classify import progressing_reason
from sglang_fleet.runs.outcomes import REFUSED_RUN_TASK, failure_message, gate_result, stage_of
from sglang_fleet.runs.reasons import group_by_reason, hosts_text, without_host

HEARTBEAT_S = 30.0  # SGLANG_FLEET_PROGRESS_INTERVAL overrides it
_DEBUG = ("debug", "ansible.builtin.debug", "assert", "ansible.builtin.assert")
_VARIABLE = re.compile(r"^(?:host \S+: )?(sglang_server_\w+)=", re.M)


def _first_line(value: Any) -> str:
    text = str(value or "").strip()
    return text.splitlines()[0] if text else ""


def gate_text(res: dict[str, Any], later: float = 0.0) -> str:
    """A gate observation in words; a progressing one as it stands `later` seconds on."""
    verdict = res.get("verdict", "?")
    if verdict == PROGRESSING and "stalls_in_s" in res:
        return f"{verdict}: " + progressing_reason(
            res.get("progress_text") or res.get("phase") or "", res, later)
    if res.get("headline"):
        return str(res["headline"])
    detail = res.get("reason") if verdict not in ("ready", PROGRESSING) else None
    phrase = verdict_phrase(verdict, res.get("phase"))
    return f"{phrase}: {detail or res.get('progress_text') or res.get('phase') or ''}"


@dataclass
class HostLine:
    """What the display knows of one host."""

    key: tuple = ()  # stage, phase and verdict: a change of these is worth a line
    text: str = ""  # the last line shown, without its prefix and host
    prefix: str = ""
    shown_at: float = 0.0
    stage: str = ""
    step: str = ""  # the task file of the stage: its step
    task: str = ""
    task_since: float = 0.0
    named: bool = False  # the heartbeat said what keeps the host quiet since its last change
    task_stage: str = ""  # the stage of the task running now
    stage_since: float = 0.0
    gate: dict[str, Any] | None = None  # the last gate observation, while the gate waits
    gate_at: float = 0.0
    busy: bool = False  # a task of this host is running


class Progress:
    """An ansible-runner event_handler; returns True so runner still keeps every event.

    Use it as a context manager to get the heartbeat (a thread that calls `tick()` every
    second); `clock` and `heartbeat_s` are there for tests.
    """

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None,
                 heartbeat_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, indent: str = "",
                 final_only: bool = False):
        self.out = stream or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.heartbeat_s = heartbeat_s or float(
            os.environ.get("SGLANG_FLEET_PROGRESS_INTERVAL") or HEARTBEAT_S)
        self.clock = clock
        self.indent = indent
        # For a command that only observes (health): in plain mode, one line per host, its
        # last state, said when the run ends (a heartbeat still says that it runs).
        self.final_only = final_only and not self.tty
        self.hosts: dict[str, HostLine] = {}
        self.drawn = 0
        self.started = clock()
        self.last_output = self.started
        self.refusals: list[tuple[str, str, str]] = []  # (task uuid, host, message)
        self.play = ""  # a play that started, not said until one of its hosts has news
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # ---- lifetime --------------------------------------------------------------------

    def __enter__(self) -> Progress:
        self._ticker = threading.Thread(target=self._tick_loop, name="progress", daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker:
            self._ticker.join(timeout=5)
        with self.lock:
            self._flush_refusals()

    def _tick_loop(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat_s / 2)):
            self.tick()

    # ---- events ----------------------------------------------------------------------

    def __call__(self, event: dict[str, Any]) -> bool:
        try:
            with self.lock:
                self.handle(event)
        except Exception as exc:  # progress must never break a run
            self.emit(f"(progress display error: {exc})")
        return True

    def handle(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        data = event.get("event_data") or {}
        host = data.get("host")
        if self.refusals and data.get("task_uuid") != self.refusals[0][0]:
            self._flush_refusals()  # the refusing task is over: say each reason once
        if kind == "playbook_on_play_start" and not self.tty and not self.final_only:
            self.play = str(data.get("play", ""))  # said with its first host's line
        if kind == "playbook_on_stats":
            for line in self.hosts.values():
                line.busy = False
            if self.final_only:
                self._show_final()
        if not host:
            return
        stage = stage_of(data) or ""
        action = data.get("task_action")
        line = self.hosts.setdefault(host, HostLine(shown_at=self.clock()))
        if str(action).endswith("validate_argument_spec") and kind in ("runner_on_start",
                                                                         "runner_on_ok"):
            return  # a role checking its arguments: part of starting the role, not a stage
        # The deploy stage's steps (its task files) are its phases; other stages say theirs
        # (the gate's phases, the benchmark's figures) in their own lines.
        step = str(data.get("task_path") or "").rsplit("/", 1)[-1].split(":")[0] \
            if stage == "deploy" else ""
        if kind == "runner_on_start":
            line.busy, line.task, line.task_since = True, data.get("task") or "", self.clock()
            line.named = False
            if stage != line.task_stage:
                line.task_stage, line.stage_since = stage, self.clock()
            line.gate = None
            return
        if kind in ("runner_on_ok", "runner_on_failed", "runner_on_skipped",
                    "runner_on_unreachable"):
            line.busy = False
        self._result(kind, data, host, line, stage, step)

    def _result(self, kind: str, data: dict[str, Any], host: str, line: HostLine, stage: str,
                step: str) -> None:
        """What one task's result says about a host."""
        res = data.get("res") or {}
        # Modules by their short names: the playbooks call them as sglang.fleet.<module>.
        action = str(data.get("task_action")).rpartition(".")[2]
        if kind == "runner_retry" and action == "sglang_health":
            line.busy, line.gate, line.gate_at = True, res, self.clock()
            self.update(host, gate_text(res), "GATE",
                        key=("health", res.get("phase"), res.get("verdict")))
        elif kind == "runner_on_ok" and (verdict := gate_result(action, res)):
            self.update(host, gate_text(verdict), "HEALTH",
                        key=("health", verdict.get("phase"), verdict.get("verdict"), "final"))
        elif kind == "runner_on_failed" and data.get("task") == REFUSED_RUN_TASK:
            self._flush_refusals()
            self.emit(_first_line(res.get("msg")))
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            message = failure_message(res)
            if stage == "spec" and message:
                self.refusals.append((data.get("task_uuid") or "", host, message))
                return
            where = stage or f"task '{data.get('task')}'"
            self.update(host, f"{where}: {without_host(_first_line(message), host)}", "FAILED",
                        key=("failed", kind))
        elif kind == "runner_on_unreachable":
            self.update(host, f"unreachable: {_first_line(res.get('msg'))}", "UNREACHABLE",
                        key=("unreachable",))
        elif kind == "runner_on_ok" and action in _DEBUG and isinstance(res.get("msg"), str) \
                and res["msg"].startswith(host + ":"):
            self.update(host, res["msg"][len(host) + 1:].strip(), "", key=("said", res["msg"]))
        elif kind == "runner_on_ok" and stage and (line.stage, line.step) != (stage, step):
            # A new stage, or a new step of it (deploy: install, preflight, configure,
            # service, ...), announced by its first task that ran (skipped tasks say nothing).
            line.stage, line.step = stage, step
            self.update(host, f"{stage}: {data.get('task')}", "", key=(stage, step))

    def update(self, host: str, text: str, prefix: str, key: tuple) -> None:
        """Show a host's new state: at once when its stage, phase or verdict changed (`key`),
        else at the next heartbeat."""
        line = self.hosts.setdefault(host, HostLine())
        text = " ".join(text.split())
        changed = key != line.key
        line.key, line.prefix = key, prefix
        if text == line.text:
            return
        line.text = text
        if self.tty:
            self.redraw()
        elif changed and not self.final_only:
            line.named = False
            self._show(host, line)

    def _show_final(self) -> None:
        for host, line in sorted(self.hosts.items()):
            if line.text:
                self._show(host, line)

    def _show(self, host: str, line: HostLine, suffix: str = "") -> None:
        line.shown_at = self.clock()
        prefix = f"{line.prefix} " if line.prefix else ""
        self.emit(f"{prefix}[{host}] {line.text}{suffix}")

    # ---- the heartbeat ---------------------------------------------------------------

    def tick(self) -> None:
        """Called every second: in plain mode, a line for each busy host that has shown
        nothing for `heartbeat_s`, with its state as it stands now; on a terminal, the
        board redrawn with fresh times."""
        with self.lock:
            now = self.clock()
            if self.tty:
                if self.hosts:
                    for line in self.hosts.values():
                        if line.busy:
                            line.text = self._current(line, now)
                    self.redraw()
                return
            for host, line in sorted(self.hosts.items()):
                quiet = now - line.shown_at
                # What keeps a busy host quiet (a task, a gate phase) is said once after a
                # third of the heartbeat, then every heartbeat.
                early = not line.named and quiet >= self.heartbeat_s / 3
                if line.busy and (quiet >= self.heartbeat_s or early) and not self.final_only:
                    line.named = True
                    line.text = self._current(line, now)
                    line.prefix = "GATE" if line.gate is not None else ""
                    self._show(host, line)
            if now - self.last_output >= self.heartbeat_s:
                # Nothing to say about any host (between plays, waiting for a fork, ...).
                self.emit(f"... still running ({duration_text(now - self.started)} so far)")

    def _current(self, line: HostLine, now: float) -> str:
        if line.gate is not None:
            return gate_text(line.gate, later=now - line.gate_at)
        in_task = f"{duration_text(now - line.task_since)} in this task"
        if not line.task_stage:
            return f"{line.task} ({in_task})"
        return (f"{line.task_stage}: {line.task} ({duration_text(now - line.stage_since)} in "
                f"{line.task_stage}, {in_task})")

    # ---- refusals --------------------------------------------------------------------

    def _flush_refusals(self) -> None:
        refusals, self.refusals = self.refusals, []
        for hosts, reason in group_by_reason((h, m) for _, h, m in refusals):
            names = sorted(set(_VARIABLE.findall(reason))) or ["see below"]
            same = f" (the same on {len(hosts)} hosts)" if len(hosts) > 1 else ""
            text = (f"LaunchSpec refused{same}: {', '.join(names)}; the reasons, each with "
                    f"its fix, follow the table")
            if self.tty:
                for host in hosts:
                    self.update(host, text, "FAILED", key=("refused",))
            else:
                for host in hosts:
                    line = self.hosts.setdefault(host, HostLine())
                    line.key, line.text, line.prefix = ("refused",), text, "FAILED"
                    line.busy, line.shown_at = False, self.clock()
                self.emit(f"FAILED [{hosts_text(hosts)}] {text}")

    # ---- output ----------------------------------------------------------------------

    def redraw(self) -> None:
        width = max(60, shutil.get_terminal_size((120, 24)).columns - 2)
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F")
        for host, line in sorted(self.hosts.items()):
            if not line.text:
                continue
            prefix = f"{line.prefix} " if line.prefix else ""
            text = inert(f"{host:<16} {prefix}{line.text}", keep_newlines=False)
            self.out.write("\x1b[2K" + text[:width] + "\n")
        self.drawn = sum(1 for line in self.hosts.values() if line.text)
        self.last_output = self.clock()
        self.out.flush()

    def emit(self, line: str) -> None:
        if self.play and not line.startswith("... "):
            play, self.play = self.play, ""
            self.emit(f"PLAY {play}")
        self.last_output = self.clock()
        # Every byte from a node is shown as text: a log line's escape sequences never reach
        # the terminal.
        self.out.write(self.indent + inert(line) + "\n")
        self.out.flush()
