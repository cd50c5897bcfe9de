"""`sglang-fleet diagnose LOGFILE`: one SGLang server log read the way the gate reads it.

The phase and the progress of its current sub-step, the phase timeline with durations, the
failure lines (kind, fatal or not, the line) and what the gate would conclude from the log
alone. Exit codes: 0 the log shows no fatal failure in its current run, 1 it does, 2 the log
cannot be read (missing, a folder, unreadable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from sglang_fleet.summary import EXIT_HOSTS_FAILED, EXIT_OK, EXIT_USAGE
from sglang_fleet_node import sglang_fleet_logphase as logphase
from sglang_fleet_node import sglang_fleet_vocab as vocab

READ_LIMIT = 64 << 20  # bytes read from the end of a bigger log
REFERENCE_SIZE_B = 1000  # the gate's windows are given for a 1000B model


class LogUnreadable(Exception):
    pass


def read_source(path: str) -> tuple[str, float | None, str]:
    """(text, modification time or None, note) of a log file, or of standard input for '-'."""
    if path == "-":
        data = sys.stdin.buffer.read()
        note = ""
        if len(data) > READ_LIMIT:
            data, note = data[-READ_LIMIT:], f"read the last {READ_LIMIT >> 20} MiB"
        return data.decode("utf-8", "replace"), None, note
    fix = ("Fix: give the server's log file (sglang_server_log_file on the node), a "
           "`docker logs CONTAINER > FILE 2>&1` capture, or - to read standard input")
    if not os.path.exists(path):
        raise LogUnreadable(f"LOGFILE {path}: no such file. {fix}")
    if os.path.isdir(path):
        raise LogUnreadable(f"LOGFILE {path}: is a folder, not a log. {fix}")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            note = ""
            if size > READ_LIMIT:
                f.seek(size - READ_LIMIT)
                note = f"read the last {READ_LIMIT >> 20} MiB of {size >> 20} MiB"
            data = f.read()
        return data.decode("utf-8", "replace"), os.path.getmtime(path), note
    except OSError as exc:
        raise LogUnreadable(f"LOGFILE {path}: cannot be read ({exc.strerror}). {fix}") from exc


def diagnose(text: str, mtime: float | None = None, now: float | None = None) -> dict[str, Any]:
    """Everything the log says, as one JSON-ready dict."""
    now = time.time() if now is None else now
    parsed = logphase.parse_log(text, now=mtime or now)
    # The last thing the server did: an undated bar redraw is dated by the file's mtime.
    active = mtime if parsed["last_line_is_bar"] and mtime else parsed["last_line_at"]
    timeline = []
    rows = parsed["timeline"]
    for i, row in enumerate(rows):
        end = rows[i + 1]["at"] if i + 1 < len(rows) else active
        seconds = (round(end - row["at"], 1) if end is not None and row["at"] is not None
                   else None)
        timeline.append({"phase": row["phase"], "step": row["step"], "at": row["at"],
                         "seconds": seconds, "current": i + 1 == len(rows),
                         "progress": row["progress"], "line": row["line"]})
    failures = [{"kind": f["kind"], "fatal": f["fatal"], "line": f["line"], "at": f["at"],
                 "why": logphase.FAILURE_WHY[f["kind"]],
                 "hint": logphase.FAILURE_HINTS.get(f["kind"])} for f in parsed["failures"]]
    return {
        "phase": parsed["phase"],
        "step": parsed["step"],
        "progress": parsed["progress"],
        "progress_text": logphase.progress_text(parsed),
        "failures": failures,
        "failures_total": parsed["failures_total"],
        "fatal": parsed["fatal"],
        "timeline": timeline,
        "gate": gate_conclusion(parsed, active, now),
        # When the server last wrote something: its last dated line, or the file's last
        # change when the last line is an undated bar redraw.
        "last_activity_at": active,
        "last_activity_from": "the file's last change; its last line is undated"
        if active is not None and active == mtime and parsed["last_line_is_bar"]
        else "its last dated line",
        "runs": logphase.count_runs(text),
        "lines": parsed["meaningful_lines"],
        "last_line_at": parsed["last_line_at"],
    }


def gate_conclusion(parsed: dict[str, Any], active: float | None, now: float
                    ) -> dict[str, Any]:
    """The verdict the gate would reach from this log alone (it also watches processes, disk
    reads, GPU memory and /health, which can only add progress or a failure)."""
    phase = parsed["phase"]
    fatal = [f for f in parsed["failures"] if f["fatal"]]
    if fatal:
        return {"verdict": vocab.CRASHED, "line": fatal[0]["line"],
                "reason": f"{fatal[0]['kind']} in {phase}: fatal, even while processes live"}
    if phase == "serving":
        return {"verdict": vocab.READY,
                "reason": "the log says the server is up; the gate also asks /health for 200"}
    windows, ceilings = vocab.default_windows(REFERENCE_SIZE_B)
    window, ceiling = windows[phase], ceilings[phase]
    if active is None:
        return {"verdict": vocab.PROGRESSING,
                "reason": f"{phase}; no dated line to judge how long it has been quiet"}
    quiet = max(0.0, now - active)
    since = parsed["phase_started_at"]
    if quiet > window:
        return {"verdict": vocab.STALLED,
                "reason": f"no log progress for {duration(quiet)} in {phase} (window "
                          f"{window} s for a {REFERENCE_SIZE_B}B model), unless its processes "
                          f"read from disk or its GPU memory moves"}
    if since is not None and now - since > ceiling:
        return {"verdict": vocab.STALLED,
                "reason": f"{phase} has lasted {duration(now - since)}, over its ceiling of "
                          f"{ceiling} s for a {REFERENCE_SIZE_B}B model"}
    return {"verdict": vocab.PROGRESSING,
            "reason": f"{phase}, last log progress {duration(quiet)} ago (window {window} s "
                      f"for a {REFERENCE_SIZE_B}B model)"}


def duration(seconds: float) -> str:
    return vocab.duration_text(seconds)


def _progress(p: dict[str, Any] | None) -> str:
    return f"{p['done']}/{p['total']} {p['unit']}" if p else ""


def _stamp(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at is not None else "?"


def render(report: dict[str, Any], source: str, now: float | None = None,
           note: str = "") -> str:
    """The plain report: what an engineer needs at 3 a.m., most important first."""
    now = time.time() if now is None else now
    out = []
    head = f"{source}: {report['lines']} lines in the current run"
    if report["runs"] > 1:
        head += f" (the log holds {report['runs']} runs; earlier ones are left out)"
    out.append(head + (f"; {note}" if note else ""))
    out.append("")
    phase = report["phase"] + (f" ({report['step']})" if report["step"] else "")
    progress = f"  {_progress(report['progress'])}" if report["progress"] else ""
    out.append(f"  phase     {phase}{progress}")
    gate = report["gate"]
    out.append(f"  gate      {gate['verdict']}: {gate['reason']}")
    if gate.get("line"):
        out.append(f"            {gate['line']}")
    active = report["last_activity_at"]
    if active is not None:
        out.append(f"  last      {_stamp(active)} ({report['last_activity_from']}), "
                   f"{duration(max(0.0, now - active))} ago")
    fatal = [f for f in report["failures"] if f["fatal"]]
    out.append("")
    out.append("timeline")
    rows = report["timeline"]
    names = [r["phase"] + (" " + r["step"] if r["step"] else "") for r in rows]
    tooks = [(duration(r["seconds"]) if r["seconds"] is not None else "?")
             + (" so far" if r["current"] else "") for r in rows]
    width, took_width = max(map(len, names), default=0), max(map(len, tooks), default=0)
    for name, took, row in zip(names, tooks, rows, strict=True):
        out.append(f"  {_stamp(row['at'])}  {name:<{width}}  {took:>{took_width}}  "
                   f"{_progress(row['progress'])}".rstrip())
    out.append("")
    failures = report["failures"]
    if not failures:
        out.append("failures  none")
        return "\n".join(out) + "\n"
    count = str(len(failures))
    if report["failures_total"] > len(failures):
        count = f"{report['failures_total']} (first and last {len(failures)} shown)"
    out.append(f"failures  {count}, {len(fatal)} fatal")
    kind_width = max(len(f["kind"]) for f in failures)
    for f in failures:
        out.append(f"  {'FATAL' if f['fatal'] else 'warn '}  {f['kind']:<{kind_width}}  "
                   f"{f['line']}")
    out.append("")
    for kind in dict.fromkeys(f["kind"] for f in failures):
        first = next(f for f in failures if f["kind"] == kind)
        hint = f" Try: {first['hint']}." if first["hint"] else ""
        out.append(f"  {kind:<{kind_width}}  {'fatal' if first['fatal'] else 'not fatal'}: "
                   f"{first['why']}.{hint}")
    return "\n".join(out) + "\n"


def command(args: argparse.Namespace) -> int:
    try:
        text, mtime, note = read_source(args.logfile)
    except LogUnreadable as exc:
        print(f"sglang-fleet diagnose: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = diagnose(text, mtime=mtime)
    if args.json:
        report["source"] = "stdin" if args.logfile == "-" else args.logfile
        report["note"] = note
        print(json.dumps(report, indent=2))
    else:
        print(render(report, "stdin" if args.logfile == "-" else args.logfile, note=note),
              end="")
    return EXIT_HOSTS_FAILED if report["fatal"] else EXIT_OK
