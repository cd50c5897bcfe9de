"""The run record of a plain `ansible-playbook` run, kept by the project's stdout callback:
each task result streamed to the run folder's events.jsonl (the shape of ansible-runner's
job events, so one builder reads both), and the page written at the recap. A run killed
before its recap leaves its events; `sglang-fleet report RUN` writes its page from them."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sglang_fleet.node.common.secrets import mask_secrets
from sglang_fleet.record.build import CALLBACK_EVENTS
from sglang_fleet.record.history import keep_count, prune_runs, write_meta, write_run_record
from sglang_fleet.runs.store import state_path

RUN_DIR_VAR = "SGLANG_FLEET_RUN_DIR"
# Bulky observation detail the record never reads (the process table, each GPU's use).
_DROPPED = ("processes", "gpus", "stdout_lines", "stderr_lines", "diff", "content")


def _trimmed(res: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in res.items() if k not in _DROPPED}
    if isinstance(out.get("results"), list):
        out["results"] = [_trimmed(r) if isinstance(r, dict) else r for r in out["results"]]
    return mask_secrets(out)


class RunRecorder:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.counter = 0
        self.events: list[dict[str, Any]] = []
        fd = os.open(run_dir / CALLBACK_EVENTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._meta: dict[str, Any] = {}

    @classmethod
    def start(cls, playbook: str, config_file: str | None) -> RunRecorder:
        """A new run folder: $SGLANG_FLEET_RUN_DIR, else runs/<time>-<playbook> in the
        controller's state (beside the ledger the playbooks use)."""
        given = os.environ.get(RUN_DIR_VAR)
        if given:
            folder = Path(given).resolve()
        else:
            project = Path(config_file).parent if config_file else Path.cwd()
            root = Path(state_path("runs", project))
            name = Path(playbook).stem
            folder = root / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{name}"
            prune_runs(root, keep_count())
            n = 1
            while folder.exists():  # two runs in one second
                n += 1
                folder = root / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{name}-{n}"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        recorder = cls(folder)
        recorder.meta(playbook=str(playbook), started=time.time())
        return recorder

    def meta(self, **values: Any) -> None:
        """The run's own facts (playbook, inventory, groups, the ledger it writes to)."""
        self._meta.update(values)
        write_meta(self.run_dir, self._meta)

    def _append(self, event: dict[str, Any]) -> None:
        self.counter += 1
        event = dict(event, counter=self.counter,
                     created=datetime.now(UTC).replace(tzinfo=None).isoformat())
        self.events.append(event)
        self._file.write(json.dumps(event, default=str) + "\n")
        self._file.flush()

    def result(self, kind: str, host: str, task: Any, res: dict[str, Any],
               ignore_errors: bool = False) -> None:
        """One task result, as ansible-runner's job event of that kind records it."""
        self._append({"event": kind, "event_data": {
            "host": host, "task": task.get_name(), "task_action": task.action,
            "task_path": task.get_path() or "", "ignore_errors": ignore_errors,
            "res": _trimmed(res)}})

    def finish(self, stats: Any) -> Path:
        """The recap, then the page."""
        self._append({"event": "playbook_on_stats", "event_data": {
            key: dict(getattr(stats, key, {}) or {}) for key in
            ("ok", "failures", "dark", "changed", "skipped", "rescued", "ignored",
             "processed")}})
        self._file.close()
        return write_run_record(self.run_dir, self.events)
