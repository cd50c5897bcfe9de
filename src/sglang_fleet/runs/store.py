"""The controller's state: where it lives, and its JSON-lines files (the recovery ledger and the
benchmark results store).

Appends are one write(2) with O_APPEND, so hosts recording at once never interleave lines; a
torn last line from a crash is skipped on reading, never fatal.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STATE_DIR_VAR = "SGLANG_FLEET_STATE_DIR"


def state_path(name: str, project: str | Path) -> str:
    """Where the controller keeps `name` (ledger.jsonl, results.jsonl, evidence, runs): under
    $SGLANG_FLEET_STATE_DIR when set, else the project's own stores (.sglang-fleet/, and
    evidence/ beside it). Playbooks, the CLI and the tests all ask here."""
    override = os.environ.get(STATE_DIR_VAR)
    if override:
        return str(Path(override) / name)
    root = Path(project)
    return str(root / name if name == "evidence" else root / ".sglang-fleet" / name)


def read_jsonl(path: str) -> list[dict[str, Any]]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def append_jsonl(path: str, entry: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    line = (json.dumps(dict(entry, at=entry.get("at", time.time())), sort_keys=True,
                       default=str) + "\n").encode()
    # 0600: ledger entries carry settings and evidence paths, results carry the hardware.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
