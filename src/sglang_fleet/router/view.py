"""The routers' view of each server, read from a playbook run's events (playbooks/health.yml's
view task, roles/sglang_router/tasks/view.yml): one line per server and router, for watch."""

from __future__ import annotations

from typing import Any

VIEW_TASK = "The routers' view beside the gate's verdict"


def router_lines(events: list[dict[str, Any]]) -> list[str]:
    """The view line of each server in a run, sorted, findings included ("sim-node-1: router
    sim-router: registered, healthy, load 0 (gate: ready)")."""
    lines = []
    for event in events:
        data = event.get("event_data") or {}
        if event.get("event") != "runner_on_ok" or data.get("task") != VIEW_TASK:
            continue
        msg = (data.get("res") or {}).get("msg")
        if isinstance(msg, str):
            lines.append(" ".join(msg.split()))
    return sorted(lines)
