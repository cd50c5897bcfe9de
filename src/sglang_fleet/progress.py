"""Live progress from ansible-runner events: a board of one line per host on a terminal, plain
lines (one per change) when the output is a file or a CI log."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from sglang_fleet.outcomes import stage_of


def _first_line(value: Any) -> str:
    text = str(value or "").strip()
    return text.splitlines()[0][:160] if text else ""


class Progress:
    """An ansible-runner event_handler; returns True so runner still keeps every event."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None):
        self.out = stream or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.status: dict[str, str] = {}
        self.stage: dict[str, str] = {}
        self.drawn = 0

    def __call__(self, event: dict[str, Any]) -> bool:
        try:
            self.handle(event)
        except Exception as exc:  # progress must never break a run
            self.emit(f"(progress display error: {exc})")
        return True

    def handle(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        data = event.get("event_data") or {}
        host = data.get("host")
        res = data.get("res") or {}
        if kind == "playbook_on_play_start" and not self.tty:
            self.emit(f"PLAY {data.get('play', '')}")
        if not host:
            return
        stage = stage_of(data) or ""
        if kind == "runner_retry" and data.get("task_action") == "sglang_health":
            self.update(host, f"{res.get('verdict', '?')}: {res.get('progress_text', '')}",
                        prefix="GATE")
        elif kind == "runner_on_ok" and data.get("task_action") == "sglang_health":
            v = res.get("verdict", "?")
            detail = res.get("progress_text") if v in ("ready", "progressing") else \
                f"{res.get('phase')}: {res.get('reason')}"
            self.update(host, f"{v}: {detail}", prefix="HEALTH")
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            self.update(host, f"failed in {stage or 'task'} '{data.get('task')}': "
                              f"{_first_line(res.get('msg'))}", prefix="FAILED")
        elif kind == "runner_on_unreachable":
            self.update(host, f"unreachable: {_first_line(res.get('msg'))}", prefix="UNREACHABLE")
        elif kind == "runner_on_ok" and data.get("task_action") in (
                "debug", "ansible.builtin.debug") and isinstance(res.get("msg"), str) \
                and res["msg"].startswith(host + ":"):
            self.update(host, res["msg"][len(host) + 1:].strip(), prefix="")
        elif kind == "runner_on_ok" and stage and self.stage.get(host) != stage:
            # A new stage, announced by its first task that ran (skipped tasks say nothing).
            self.stage[host] = stage
            self.update(host, f"{stage}: {data.get('task')}", prefix="")

    def update(self, host: str, text: str, prefix: str) -> None:
        line = " ".join(text.split())
        if self.status.get(host) == line:
            return
        self.status[host] = line
        if self.tty:
            self.redraw()
        else:
            self.emit(f"{prefix + ' ' if prefix else ''}[{host}] {line}")

    def redraw(self) -> None:
        width = 118
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F")
        for host, line in sorted(self.status.items()):
            self.out.write("\x1b[2K" + f"{host:<16} {line}"[:width] + "\n")
        self.drawn = len(self.status)
        self.out.flush()

    def emit(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()
