"""The run record: one run's servers, timelines, verdicts, evidence, router membership, what
changed against each deployment's last good configuration, and every destructive action with
its reason, as data (run.json, docs/run-record.md) read from the run's own files.

Built from ansible-runner-shaped events (the CLI's runner artifacts, or the events.jsonl the
stdout callback streams for a plain ansible-playbook run), the run's summary.json when it has
one, the ledger and the evidence bundles. The same function builds a finished run's record,
a killed run's (from what its files hold) and `sglang-fleet report RUN`'s rebuild.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sglang_fleet.node.common.secrets import MASK, is_secret_name, mask_secrets
from sglang_fleet.runs.outcomes import NOT_OBSERVED, HostOutcome, host_outcomes
from sglang_fleet.runs.store import read_jsonl
from sglang_fleet.runs.summary import build_summary, failure_reason

SCHEMA = "sglang-fleet.run-record/1"
RECORD_JSON = "run.json"
RECORD_HTML = "run.html"
CALLBACK_EVENTS = "events.jsonl"  # what the stdout callback streams (plain ansible-playbook)
RUN_META = "run-meta.json"  # the callback's run: playbook, inventory, ledger, started
LOG_TAIL_LINES = 15
# Evidence files linked by name, in this order; py-spy dumps follow.
EVIDENCE_ORDER = ("verdict.json", "log_tail.txt", "phase_timeline.txt", "kernel.txt",
                  "processes.txt", "stop.json", "gpus.json", "launch_spec.json", "summary.json",
                  "run.log")
_GATE_ACTIONS = ("sglang_health", "sglang_node")
_RAN = ("runner_on_ok", "runner_on_failed", "runner_retry")


def _epoch(created: str | None) -> float | None:
    """ansible-runner's event time (ISO 8601, UTC without a zone) as epoch seconds."""
    if not created:
        return None
    with contextlib.suppress(ValueError):
        stamp = datetime.fromisoformat(created)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        return stamp.timestamp()
    return None


def _action(data: dict[str, Any]) -> str:
    return str(data.get("task_action") or "").rpartition(".")[2]


# ---- reading a run's files ----------------------------------------------------------------

def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every event of the run, in order: the runner artifacts' job events (each playbook run
    of the command, oldest first), else the callback's events.jsonl."""
    # A command's runs (runner/), or an experiment's trials (NN-name/), each in the order
    # they ended.
    found = {*run_dir.glob("runner/artifacts/*/job_events"),
             *run_dir.glob("*/artifacts/*/job_events")}
    folders = sorted(found, key=lambda p: p.stat().st_mtime)
    events: list[dict[str, Any]] = []
    for folder in folders:
        batch = []
        for path in folder.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                batch.append(json.loads(path.read_text()))
        events += sorted(batch, key=lambda e: e.get("counter", 0))
    if not events:
        events = read_jsonl(str(run_dir / CALLBACK_EVENTS))
    return events


def recap_of(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last recap (playbook_on_stats) of the events; None when the run ended before it."""
    for event in reversed(events):
        if event.get("event") == "playbook_on_stats":
            return event.get("event_data") or {}
    return None


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# ---- timelines -----------------------------------------------------------------------------

def _point(at: float | None, phase: str, source: str, text: str = "") -> dict[str, Any] | None:
    return {"at": round(at, 3), "phase": phase, "source": source, "text": text} if at else None


def _task_point(action: str, data: dict[str, Any], res: dict[str, Any], at: float | None,
                kind: str) -> dict[str, Any] | None:
    """A milestone a task's result marks: validated, files written, started, stopped, joined
    the router, drained, recovered."""
    task = str(data.get("task") or "")
    if kind != "runner_on_ok":
        return None
    if task.startswith("Refuse an invalid LaunchSpec"):
        return _point(at, "validated", "task", "LaunchSpec validated on the controller")
    if action == "sglang_node" and res.get("files_written"):
        return _point(at, "files_written", "task", "launch script, env file and unit written")
    if action == "sglang_service" and res.get("action") in ("started", "restarted"):
        return _point(at, "launching", "task", f"service {res['action']}, pid {res.get('pid')}")
    if action == "sglang_node" and res.get("started"):
        return _point(at, "launching", "task", "service started")
    if action == "sglang_stop" and res.get("killed"):
        return _point(at, "killed", "task", f"{len(res['killed'])} processes stopped")
    if action == "sglang_service" and res.get("action") == "stopped":
        return _point(at, "stopped", "task", "service stopped")
    return None


def _router_points(action: str, res: dict[str, Any], at: float | None) -> list[dict[str, Any]]:
    if action != "sglang_router_member":
        return []
    out = []
    for item in res.get("results") or [res]:
        if not isinstance(item, dict):
            continue
        router = (item.get("item") or {}).get("name") if isinstance(item.get("item"), dict) \
            else None
        when = item.get("at") or at
        if item.get("action") == "added":
            out.append(_point(when, "joined_router", "router", f"joined {router or 'the router'}"))
        elif item.get("action") == "removed":
            drained = "drained from" if item.get("drain") else "removed from"
            out.append(_point(when, "drained", "router", f"{drained} {router or 'the router'}"))
    return [p for p in out if p]


def _gate_points(action: str, res: dict[str, Any], at: float | None,
                 last: dict[str, Any]) -> list[dict[str, Any]]:
    """A phase the gate saw for the first time (at its own `since`, the log's time), and the
    verdict when it is one."""
    gate = res if action == "sglang_health" else (res.get("gate") or {})
    if not gate.get("verdict"):
        return []
    out = []
    phase = gate.get("phase")
    if phase and gate["verdict"] != "ready" and last.get("phase") != phase:
        out.append(_point(gate.get("since") or at, phase, "gate", gate.get("progress_text") or ""))
        last["phase"] = phase
    if gate["verdict"] != "progressing" and last.get("verdict") != gate["verdict"]:
        name = "ready" if gate["verdict"] == "ready" else gate["verdict"]
        out.append(_point(at, name, "gate", gate.get("headline") or gate.get("reason") or ""))
        last["verdict"] = gate["verdict"]
        last.pop("phase", None)
    elif gate["verdict"] == "progressing":
        last.pop("verdict", None)
    return [p for p in out if p]


_LOG_STAMP_LEN = len("[2026-01-01 00:00:00")


def log_points(evidence: Path | None) -> list[dict[str, Any]]:
    """The phases of the failed start as its own log dated them (the evidence bundle's
    phase_timeline.txt: a phase, then the log line that began it)."""
    if evidence is None:
        return []
    try:
        lines = (evidence / "phase_timeline.txt").read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        phase, _, said = line.partition(" ")
        said = said.strip()
        if not said.startswith("[") or len(said) < _LOG_STAMP_LEN:
            continue
        with contextlib.suppress(ValueError):
            at = datetime.strptime(said[1:_LOG_STAMP_LEN], "%Y-%m-%d %H:%M:%S").timestamp()
            out.append({"at": at, "phase": phase, "source": "log", "text": said[:200]})
    return out


# ---- destructive actions and router membership --------------------------------------------

def _verdict_reason(o: HostOutcome | None, fallback: str = "") -> str:
    v = (o.verdict if o else None) or {}
    return v.get("headline") or (f"{v.get('verdict')}: {v.get('reason')}" if v else fallback)


def _actions_of(host: str, action: str, data: dict[str, Any], res: dict[str, Any],
                at: float | None, gate: dict[str, Any]) -> list[dict[str, Any]]:
    """The destructive actions one task result records, each with its reason."""
    why = gate.get("headline") or (f"{gate.get('verdict')}: {gate.get('reason')}"
                                   if gate.get("verdict") else "")
    out = []
    if action == "sglang_stop" and res.get("killed"):
        pids = [p.get("pid") for p in res["killed"] if isinstance(p, dict)]
        freed = res.get("seconds_to_free")
        out.append({"kind": "kill", "what": f"{len(pids)} processes of the deployment "
                    f"stopped (pids {', '.join(map(str, pids[:12]))}"
                    f"{', ...' if len(pids) > 12 else ''})"
                    + (f"; GPUs free in {freed:.1f} s" if isinstance(freed, int | float)
                       else "")
                    + ("; node marked for reboot" if res.get("reboot_needed") else ""),
                    "reason": why or "the recovery stops a failed server"})
    elif action == "sglang_service" and res.get("action") in ("restarted", "stopped"):
        by = (res.get("invocation") or {}).get("module_args") or {}
        if res["action"] == "stopped":
            reason = f"stopped by {by.get('stopped_by') or 'this run'} ({data.get('task')})"
        else:
            reason = gate.get("files_reason") or "its launch files changed"
        out.append({"kind": "restart" if res["action"] == "restarted" else "stop",
                    "what": f"service {res['action']}"
                    + (f" (config {res.get('previous_config_hash')} -> {res.get('config_hash')})"
                       if res.get("previous_config_hash") else ""),
                    "reason": reason})
    elif action == "sglang_lock" and res.get("outcome") == "taken_over":
        out.append({"kind": "lock takeover", "what": "took over the deployment's lock",
                    "reason": res.get("taken_over_because") or "the run holding it is gone"})
    elif action == "sglang_ledger" and (res.get("entry") or {}).get("kind") == "recovery":
        out.append(_switch(res["entry"]))
    elif action == "sglang_router_member":
        out += _router_actions(res, why)
    return [dict(a, at=round(at, 3) if at else None, host=host) for a in out if a]


def _switch(entry: dict[str, Any]) -> dict[str, Any] | None:
    nxt = entry.get("next") or {}
    if not nxt or nxt.get("source") == "none":
        return None
    kind = "rollback" if nxt.get("source") in ("last_known_good", "rollback") \
        else "configuration switch"
    target = nxt.get("config_hash") or nxt.get("overrides") or "the next configuration"
    return {"kind": kind, "what": f"configuration {entry.get('config_hash')} -> {target} "
            f"({nxt.get('source')})",
            "reason": nxt.get("why") or nxt.get("reason") or entry.get("reason") or ""}


def _router_actions(res: dict[str, Any], why: str) -> list[dict[str, Any]]:
    out = []
    for item in res.get("results") or [res]:
        if not isinstance(item, dict) or item.get("action") != "removed":
            continue
        router = (item.get("item") or {}).get("name") if isinstance(item.get("item"), dict) \
            else "router"
        drain = item.get("drain") or {}
        what = (f"drained from {router} ({drain.get('seconds')} s, "
                f"{drain.get('inflight_left', 0)} in flight left)" if drain
                else f"removed from {router}")
        out.append({"kind": "drain" if drain else "router removal", "what": what,
                    "reason": why or "its verdict is not ready"})
    return out


def _membership(host: str, action: str, res: dict[str, Any],
                at: float | None) -> list[dict[str, Any]]:
    if action != "sglang_router_member":
        return []
    out = []
    for item in res.get("results") or [res]:
        if not isinstance(item, dict) or not item.get("action"):
            continue
        router = (item.get("item") or {}).get("name") if isinstance(item.get("item"), dict) \
            else ""
        out.append({"at": round(item.get("at") or at or 0, 3), "host": host, "router": router,
                    "action": item["action"], "view": item.get("view_text") or "",
                    "finding": item.get("finding") or ""})
    return out


# ---- one pass over the events --------------------------------------------------------------

class _Walk:
    """What the events say per host, gathered in one pass."""

    def __init__(self) -> None:
        self.timeline: dict[str, list[dict[str, Any]]] = {}
        self.actions: list[dict[str, Any]] = []
        self.routers: list[dict[str, Any]] = []
        self.specs: dict[str, list[dict[str, Any]]] = {}
        self.gate: dict[str, dict[str, Any]] = {}
        self.failed: dict[str, dict[str, Any]] = {}  # the last failed verdict and its words
        self.last: dict[str, dict[str, Any]] = {}
        self.first_at: float | None = None
        self.last_at: float | None = None

    def add(self, event: dict[str, Any]) -> None:
        at = _epoch(event.get("created"))
        if at:
            self.first_at = self.first_at or at
            self.last_at = at
        data = event.get("event_data") or {}
        host = data.get("host")
        kind = event.get("event")
        if not host or kind not in _RAN:
            return
        action, res = _action(data), data.get("res") or {}
        line = self.timeline.setdefault(host, [])
        line += _gate_points(action, res, at, self.last.setdefault(host, {}))
        if action in _GATE_ACTIONS:
            gate = res if action == "sglang_health" else (res.get("gate") or {})
            if gate.get("verdict"):
                self.gate[host] = dict(gate, files_reason=self.gate.get(host, {}).get(
                    "files_reason"))
            if gate.get("verdict") not in (None, "ready", "progressing") and kind != "runner_retry":
                self.failed[host] = {k: gate.get(k) for k in (
                    "verdict", "phase", "headline", "reason", "cause", "advice")}
                seen = gate.get("evidence")
                if isinstance(seen, dict):  # what the gate read: signals and the log's last lines
                    self.failed[host]["signals"] = {
                        k: seen[k] for k in ("flat_signals", "busy_wait", "waits_on")
                        if seen.get(k)}
                    self.failed[host]["last_lines"] = [
                        str(x)[:400] for x in (seen.get("last_lines") or [])][-LOG_TAIL_LINES:]
            if action == "sglang_node" and res.get("files_reason"):
                self.gate.setdefault(host, {})["files_reason"] = res["files_reason"]
        if kind == "runner_retry":
            return
        if kind == "runner_on_failed" and "Fix:" in str(res.get("msg")):
            self.failed.setdefault(host, {})["message"] = str(res.get("msg"))
        point = _task_point(action, data, res, at, kind)
        if point:
            line.append(point)
        line += _router_points(action, res, at)
        self.actions += _actions_of(host, action, data, res, at, self.gate.get(host, {}))
        self.routers += _membership(host, action, res, at)
        spec = (res.get("ansible_facts") or {}).get("sglang_server_launch_spec")
        if isinstance(spec, dict) and spec.get("settings"):
            self.specs.setdefault(host, []).append(spec)


# ---- what changed --------------------------------------------------------------------------

def _shown(name: str, value: Any) -> Any:
    """A setting's value as the record shows it: secrets never, by name at any depth."""
    if is_secret_name(name) and value not in (None, "", [], {}):
        return MASK
    return mask_secrets(value) if isinstance(value, dict | list) else value


def setting_changes(before: dict[str, Any], after: dict[str, Any],
                    secrets_before: dict[str, str] | None = None,
                    secrets_after: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Each setting whose value differs, old and new; secrets as their fingerprints."""
    out = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old != new:
            out.append({"name": name, "old": _shown(name, old), "new": _shown(name, new),
                        "secret": False})
    if secrets_before is not None or secrets_after is not None:
        sb, sa = secrets_before or {}, secrets_after or {}
        for name in sorted(set(sb) | set(sa)):
            if sb.get(name) != sa.get(name):
                out.append({"name": name, "old": sb.get(name), "new": sa.get(name),
                            "secret": True})
    return out


def last_good(ledger: list[dict[str, Any]], host: str, deployment: str,
              before: float) -> dict[str, Any] | None:
    """The deployment's last ready (re)start on `host` recorded before `before`."""
    found = None
    for entry in ledger:
        if entry.get("kind") == "ready" and entry.get("host") == host and \
                entry.get("deployment") == deployment and (entry.get("at") or 0) < before:
            found = entry
    return found


def changes_for(host: str, specs: list[dict[str, Any]], ledger: list[dict[str, Any]],
                started: float) -> list[dict[str, Any]]:
    """Each distinct configuration this run built for the host, against the deployment's
    last good one before the run."""
    out, seen = [], set()
    for spec in specs:
        if spec.get("config_hash") in seen:
            continue
        seen.add(spec.get("config_hash"))
        good = last_good(ledger, host, spec.get("deployment", ""), started)
        entry: dict[str, Any] = {"host": host, "deployment": spec.get("deployment"),
                                 "config_hash": spec.get("config_hash"), "against": None,
                                 "settings": []}
        if good:
            entry["against"] = {"config_hash": good.get("config_hash"), "at": good.get("at"),
                                "run": (good.get("run") or {}).get("id")}
            entry["settings"] = setting_changes(
                good.get("settings") or {}, spec.get("settings") or {},
                good.get("secrets") if "secrets" in good else None,
                spec.get("secret_fingerprints") if "secrets" in good else None)
        out.append(entry)
    return out


# ---- evidence ------------------------------------------------------------------------------

def _link_into(src: Path, dest: Path) -> None:
    """A bundle's files in the run folder (hard links, copies across file systems)."""
    for folder in (dest.parent.parent, dest.parent, dest):  # evidence/HOST/BUNDLE, private
        folder.mkdir(mode=0o700, exist_ok=True)
    for path in src.iterdir():
        target = dest / path.name
        if not path.is_file() or path.is_symlink() or target.exists():
            continue
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


def evidence_of(run_dir: Path, host: str, folder: str | None) -> dict[str, Any] | None:
    """The evidence bundle of a host, linked into the run folder (evidence/HOST/BUNDLE), its
    files as links relative to the run's page, and the log tail's last lines."""
    if not folder:
        return None
    src = Path(folder)
    # A folder name from the host's: never a path out of the run folder.
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host).lstrip(".") or "_"
    local = run_dir / "evidence" / safe / src.name
    if src.is_dir() and src.resolve() != local.resolve():
        with contextlib.suppress(OSError):
            _link_into(src, local)
    where = local if local.is_dir() else src
    names = sorted(p.name for p in where.iterdir()) if where.is_dir() else []
    order = [n for n in EVIDENCE_ORDER if n in names] + \
        [n for n in names if n not in EVIDENCE_ORDER]
    base = local.relative_to(run_dir) if local.is_dir() else src
    tail: list[str] = []
    with contextlib.suppress(OSError):
        tail = (where / "log_tail.txt").read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return {"folder": str(base), "source": str(src),
            "files": [{"name": n, "href": f"{base}/{n}"} for n in order],
            "log_tail": [line[:400] for line in tail]}


# ---- the record ----------------------------------------------------------------------------

def _fix_of(message: str | None, advice: str | None) -> str:
    for line in (message or "").splitlines():
        if "Fix:" in line:
            return line[line.index("Fix:"):].strip()
    return advice or ""


# Verdict groups on the page, in this order: failures first, recovered next, ready last.
GROUP_ORDER = ("failed", "unreachable", "crashed", "stalled", "unhealthy", "gpu_fault",
               "interrupted", NOT_OBSERVED, "absent", "progressing", "recovered",
               "not started", "stopped", "ready")


def group_rank(group: str) -> int:
    return GROUP_ORDER.index(group) if group in GROUP_ORDER else 0


def _server(run_dir: Path, host: str, rec: dict[str, Any], walk: _Walk,
            groups: dict[str, list[str]]) -> dict[str, Any]:
    specs = walk.specs.get(host) or [{}]
    evidence = evidence_of(run_dir, host, rec.get("evidence"))
    bundle = Path(evidence["folder"]) if evidence else None
    if bundle is not None and not bundle.is_absolute():
        bundle = run_dir / bundle
    timeline = walk.timeline.get(host, []) + log_points(bundle)
    timeline.sort(key=lambda p: p["at"])
    failed = walk.failed.get(host, {})
    recovered = bool(rec.get("recovery")) and rec["status"] == "ok"
    ok = rec["status"] == "ok" and rec["verdict"] == "ready"
    group = "recovered" if recovered else rec["verdict"] if rec["status"] in (
        "ok", "not started") or rec["verdict"] not in ("ready",) else rec["status"]
    return {
        "host": host, "groups": groups.get(host, []), "group": group,
        "deployment": specs[-1].get("deployment"), "config_hash": specs[-1].get("config_hash"),
        "status": rec["status"], "verdict": rec["verdict"], "phase": rec.get("phase"),
        "reason": failure_reason(rec) or rec.get("reason") or "",
        "failed_verdict": failed.get("headline") if failed and (recovered or not ok) else None,
        "cause": rec.get("cause") or (failed.get("cause") if not ok or recovered else None),
        "fix": _fix_of(rec.get("message") or failed.get("message"),
                       rec.get("advice") or failed.get("advice")) if not ok or recovered
        else "",
        "failure": rec.get("failure"),
        "progress": rec.get("progress"), "recovery": rec.get("recovery"),
        "recovered": recovered,
        "evidence": evidence, "timeline": timeline, "canary": rec.get("canary"),
        "gate_evidence": {"signals": failed.get("signals") or {},
                          "last_lines": failed.get("last_lines") or []} if failed else None,
        "benchmark": rec.get("benchmark"),
    }


def _fleet_line(servers: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for s in servers:
        counts[s["verdict"]] = counts.get(s["verdict"], 0) + 1
    ready = counts.get("ready", 0)
    total = len(servers)
    serving = "unknown" if not total else "yes" if ready == total else \
        "partly" if ready else "no"
    head = {"yes": "Serving", "partly": "Partly serving", "no": "NOT serving",
            "unknown": "Nothing observed"}[serving]
    recovered = sum(1 for s in servers if s["recovered"])
    others = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()) if v != "ready")
    line = f"{head}: {ready} of {total} servers ready" + (f" ({recovered} recovered)"
                                                          if recovered else "")
    if others:
        line += f"; {others}"
    line += f". Run {run['result']}"
    if run.get("exit_code") is not None:
        line += f" (exit {run['exit_code']})"
    if run["ended"] != "complete":
        line += f"; {run['note']}"
    return {"line": line, "serving": serving, "servers": total, "ready": ready,
            "by_verdict": counts}


def _run_meta(run_dir: Path, summary: dict[str, Any], events: list[dict[str, Any]],
              walk: _Walk, complete: bool) -> dict[str, Any]:
    result = summary.get("result") or "unknown"
    interrupted = summary.get("interrupted_by")
    if interrupted:
        ended, note = "interrupted", f"interrupted by {interrupted}: each host is shown as " \
                                     "it was last seen"
    elif complete:
        ended, note = "complete", ""
    else:
        ended = "ended before its recap"
        note = ("the run ended before Ansible's recap (killed midway?): this page is written "
                "from what its files hold, each host as it was last seen")
        result = summary.get("result") if summary.get("result") not in (None, "ok") else \
            "ended early"
    return {"id": run_dir.name, "command": summary.get("command") or "ansible-playbook",
            "playbook": summary.get("playbook"), "dir": str(run_dir),
            "started": summary.get("started") or walk.first_at,
            "finished": summary.get("finished") or walk.last_at,
            "result": result, "exit_code": summary.get("exit_code"), "ended": ended,
            "note": note, "inventory": summary.get("inventory"), "limit": summary.get("limit"),
            "events": len(events), "written_at": time.time()}


def build_record(run_dir: Path, events: list[dict[str, Any]],
                 summary: dict[str, Any] | None = None,
                 ledger: list[dict[str, Any]] | None = None,
                 groups: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The run's record from its events and summary (computed from the events when the run
    left none: a plain ansible-playbook run, or one killed before its summary)."""
    walk = _Walk()
    for event in events:
        walk.add(event)
    stats = recap_of(events)
    if summary is None:
        outcomes: dict[str, HostOutcome] = host_outcomes(events, stats)
        summary = build_summary("ansible-playbook", 0 if stats and not stats.get("failures")
                                else 1, outcomes, walk.first_at or 0, walk.last_at or 0,
                                run_dir)
        if stats is None:
            summary["result"] = None
            summary["exit_code"] = None
    run = _run_meta(run_dir, summary, events, walk, complete=stats is not None or bool(
        summary.get("exit_code") is not None and not summary.get("interrupted_by")
        and summary.get("result") != "internal error"))
    servers = [_server(run_dir, h, rec, walk, groups or {})
               for h, rec in summary.get("hosts", {}).items()]
    servers.sort(key=lambda s: (group_rank(s["group"]), s["host"]))
    started = run["started"] or 0
    changes = [c for s in servers for c in changes_for(s["host"], walk.specs.get(s["host"], []),
                                                       ledger or [], started)]
    return {"schema": SCHEMA, "run": run, "fleet": _fleet_line(servers, run),
            "servers": servers, "routers": sorted(walk.routers, key=lambda r: r["at"]),
            "changes": changes, "actions": sorted(walk.actions, key=lambda a: a["at"] or 0),
            "canary": [{"host": s["host"], **s["canary"]} for s in servers if s["canary"]],
            "trials": summary.get("trials") or []}
