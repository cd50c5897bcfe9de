"""Writing a run's record (run.json and run.html) into its folder, and the history of runs:
the list with their results, and pruning by a keep count that never removes the last good
run of a deployment."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from sglang_fleet.record.build import (
    RECORD_HTML,
    RECORD_JSON,
    RUN_META,
    build_record,
    read_events,
    read_json,
)
from sglang_fleet.record.page import render_page
from sglang_fleet.runs.runner import project_dir
from sglang_fleet.runs.store import read_jsonl, state_path

KEEP_RUNS_VAR = "SGLANG_FLEET_KEEP_RUNS"
DEFAULT_KEEP_RUNS = 100


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_meta(run_dir: Path, values: dict[str, Any]) -> None:
    """The run's own facts that its events lack (playbook, inventory groups, the ledger it
    writes to), kept beside them from its start: a killed run's page still has them."""
    _write_atomic(run_dir / RUN_META, json.dumps(values, default=str))


def ledger_path(run_dir: Path) -> str:
    """The ledger the run wrote to: its extra variables' sglang_fleet_ledger (runner's or the
    callback's record of them), else the controller's."""
    for source in (run_dir / "runner" / "env" / "extravars", run_dir / RUN_META):
        given = (read_json(source) or {}).get("sglang_fleet_ledger")
        if isinstance(given, str) and given:
            return given
    return state_path("ledger.jsonl", project_dir())


def write_run_record(run_dir: Path, events: list[dict[str, Any]] | None = None,
                     summary: dict[str, Any] | None = None,
                     groups: dict[str, list[str]] | None = None) -> Path:
    """Build the record from what the run left (or was given), write run.json and run.html
    (0600, each replaced whole), and return the page's path."""
    run_dir = Path(run_dir)
    if events is None:
        events = read_events(run_dir)
    if summary is None:
        summary = read_json(run_dir / "summary.json")
    meta = read_json(run_dir / RUN_META) or {}
    if summary is not None and meta.get("playbook"):
        summary.setdefault("playbook", meta["playbook"])
    record = build_record(run_dir, events, summary, read_jsonl(ledger_path(run_dir)),
                          groups if groups is not None else meta.get("groups"))
    if meta.get("playbook"):
        record["run"]["playbook"] = meta["playbook"]
        record["run"]["inventory"] = record["run"]["inventory"] or meta.get("inventory")
    _write_atomic(run_dir / RECORD_JSON, json.dumps(record, indent=1, default=str) + "\n")
    # What pruning reads of each run, small: the deployments it left ready.
    write_meta(run_dir, dict(meta, good=sorted(_good_of(record))))
    page = run_dir / RECORD_HTML
    _write_atomic(page, render_page(record))
    return page


def runs_root() -> Path:
    return Path(state_path("runs", project_dir()))


def run_folders(root: Path) -> list[Path]:
    """The run folders under `root`, oldest first (by their names' time stamps)."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                   and ((p / "summary.json").exists() or (p / RECORD_JSON).exists()
                        or (p / "runner").is_dir() or (p / RUN_META).exists())),
                  key=lambda p: p.name)


def run_line(folder: Path) -> str:
    """One run in the list: its id, command, result and fleet line."""
    record = read_json(folder / RECORD_JSON)
    if record:
        run = record["run"]
        return f"{folder.name}  {run['command']:<16} {run['result']:<14} {record['fleet']['line']}"
    summary = read_json(folder / "summary.json") or {}
    return (f"{folder.name}  {summary.get('command', '?'):<16} "
            f"{summary.get('result', 'no record'):<14} (no page yet: sglang-fleet report "
            f"{folder.name})")


def _good_of(record: dict[str, Any]) -> set[tuple[str, str]]:
    return {(s["host"], s.get("deployment") or "") for s in record.get("servers", [])
            if s.get("verdict") == "ready" and s.get("status") == "ok"}


def good_deployments(folder: Path) -> set[tuple[str, str]]:
    """(host, deployment) of each server the run left ready: from its run-meta.json, else
    its record."""
    meta = read_json(folder / RUN_META) or {}
    if isinstance(meta.get("good"), list):
        return {(str(h), str(d)) for h, d in meta["good"]}
    return _good_of(read_json(folder / RECORD_JSON) or {})


def prune_runs(root: Path, keep: int) -> list[Path]:
    """Remove the oldest runs beyond the newest `keep`, except each deployment's last good run
    (the newest run that left it ready). Returns the folders removed."""
    folders = run_folders(root)
    if len(folders) <= keep:
        return []
    protected: set[Path] = set()
    seen: set[tuple[str, str]] = set()
    for folder in reversed(folders):
        good = good_deployments(folder) - seen
        if good:
            protected.add(folder)
            seen |= good
    removed = []
    for folder in folders[:max(len(folders) - keep, 0)]:
        if folder in protected:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def keep_count() -> int:
    with contextlib.suppress(ValueError):
        return max(int(os.environ.get(KEEP_RUNS_VAR, DEFAULT_KEEP_RUNS)), 1)
    return DEFAULT_KEEP_RUNS


def find_run(name: str | None, root: Path) -> Path | None:
    """A run by folder path, by name under the runs folder, or the newest."""
    if name:
        path = Path(name)
        if path.is_dir():
            return path.resolve()
        path = root / name
        return path if path.is_dir() else None
    folders = run_folders(root)
    return folders[-1] if folders else None


def stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
