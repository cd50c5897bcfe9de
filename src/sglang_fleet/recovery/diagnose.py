"""`sglang-fleet diagnose LOGFILE`: one SGLang server log read the way the gate reads it.

The phase and the progress of its current sub-step, the phase timeline with durations, the
failures (kind, fatal or not, the exception's own final line, the ranks that printed it, the
log line), the cause with what to do, and what the gate would conclude from the log alone.
The log is read within stated bounds (its first HEAD_BYTES and last TAIL_BYTES; a pipe up to
STREAM_LIMIT), and every byte of it is shown inert. Exit codes: 0 the log shows no fatal
failure in its current run, 1 it does, 2 the log cannot be read (missing, a folder, a device,
unreadable).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from sglang_fleet.node.common import vocab
from sglang_fleet.node.common.text import inert
from sglang_fleet.node.logs import failures as failures_grammar
from sglang_fleet.node.logs import logphase, logread
from sglang_fleet.runs.summary import EXIT_HOSTS_FAILED, EXIT_OK, EXIT_USAGE

HEAD_BYTES = logread.HEAD_BYTES
TAIL_BYTES = logread.TAIL_BYTES  # bytes read from the end of a bigger log, as the gate
STREAM_LIMIT = logread.STREAM_LIMIT
REFERENCE_SIZE_B = 1000  # the gate's windows are given for a 1000B model


class LogUnreadable(Exception):
    pass


def read_source(path: str) -> tuple[str, float | None, str, bool]:
    """(text, modification time or None, note, whether it is the whole log) of a log file,
    a pipe, or standard input for '-'."""
    if path == "-":
        read = logread.read_stream(sys.stdin.buffer, HEAD_BYTES, TAIL_BYTES, STREAM_LIMIT)
        return read.text, None, read.note, read.whole
    fix = ("Fix: give the server's log file (sglang_server_log_file on the node), a "
           "`docker logs CONTAINER > FILE 2>&1` capture, or - to read standard input")
    try:
        read = logread.read_bounded(path, head=HEAD_BYTES, tail=TAIL_BYTES)
    except logread.LogUnreadable as exc:
        what = str(exc)[len(path) + 2:]
        if what == "No such file or directory":
            what = "no such file"
        elif not what.startswith("is a"):
            what = f"cannot be read ({what})"
        raise LogUnreadable(f"LOGFILE {path}: {what}. {fix}") from exc
    return read.text, read.mtime, read.note, read.whole


def diagnose(text: str, mtime: float | None = None, now: float | None = None,
             whole: bool = True) -> dict[str, Any]:
    """Everything the log says, as one JSON-ready dict. Durations come from the log's own
    stamps; the age of its last line against `now` is said as such."""
    now = time.time() if now is None else now
    parsed = logphase.parse_log(text, now=mtime or now,
                                lines_from="file" if whole else "the part read")
    # The last thing the server did: its last stamped line, or for an undated bar redraw the
    # file's modification time (named as such).
    by_mtime = bool(parsed["last_line_is_bar"] and mtime)
    active = mtime if by_mtime else parsed["last_line_at"]
    timeline = []
    rows = parsed["timeline"]
    for i, row in enumerate(rows):
        # Between the log's own stamps only: a file's time and a copied log's stamps can be
        # days apart.
        end = rows[i + 1]["at"] if i + 1 < len(rows) else parsed["last_line_at"]
        seconds = (round(end - row["at"], 1) if end is not None and row["at"] is not None
                   else None)
        timeline.append({"phase": row["phase"], "step": row["step"], "at": row["at"],
                         "seconds": seconds, "current": i + 1 == len(rows),
                         "progress": row["progress"], "line": row["line"],
                         "line_no": row.get("line_no")})
    failures = [dict(_failure_view(f), why=logphase.FAILURE_WHY[f["kind"]],
                     hint=failures_grammar.hint(f, parsed["phase"]))
                for f in parsed["failures"]]
    return {
        "phase": parsed["phase"],
        "step": parsed["step"],
        "progress": parsed["progress"],
        "progress_text": logphase.progress_text(parsed),
        "failures": failures,
        "failures_total": parsed["failures_total"],
        "fatal": parsed["fatal"],
        "cause": _failure_view(parsed["cause"]) if parsed["cause"] else None,
        "stop": parsed["stop"],
        "timeline": timeline,
        "gate": gate_conclusion(parsed, active, now),
        # When the server last wrote something, and by which clock that is known.
        "last_activity_at": active,
        "last_activity_from": "the file's modification time; its last line has no stamp"
        if by_mtime else "the log's own stamp",
        "runs": logphase.count_runs(text),
        "lines": parsed["meaningful_lines"],
        "last_line_at": parsed["last_line_at"],
    }


def _failure_view(f: dict[str, Any]) -> dict[str, Any]:
    keep = ("kind", "fatal", "line", "at", "line_no", "lines_from", "ranks", "count",
            "exception", "message", "said", "hint", "during_stop", "after_sglang_failure")
    view = {k: f.get(k) for k in keep if k in f}
    view["ranks_text"] = failures_grammar.ranks_text(f.get("ranks") or [])
    view.setdefault("said", failures_grammar.said(f))
    return view


def gate_conclusion(parsed: dict[str, Any], active: float | None, now: float
                    ) -> dict[str, Any]:
    """The verdict the gate would reach from this log alone (it also watches processes, disk
    reads, GPU memory and /health, which can only add progress or a failure)."""
    phase, cause = parsed["phase"], parsed["cause"]
    if parsed["stop"] and not (cause and cause["line_no"] is not None
                               and parsed["stop"]["line_no"] is not None
                               and cause["line_no"] < parsed["stop"]["line_no"]):
        return {"verdict": vocab.STOPPED, "line": parsed["stop"]["line"],
                "reason": "stopped by a SIGTERM (SGLang drained and exited); not a crash"}
    if cause is not None:
        verdict = (vocab.GPU_FAULT if cause["kind"] in failures_grammar.GPU_FAULT_KINDS
                   else vocab.CRASHED)
        return {"verdict": verdict, "line": cause["line"], "hint": cause.get("hint"),
                "reason": f"{cause['said']}; {cause['kind']} in {phase}: fatal, even while "
                          f"processes live"}
    if phase == "serving":
        return {"verdict": vocab.READY,
                "reason": "the log says the server is up; the gate also asks /health for 200"}
    return _timed_conclusion(parsed, active, now)


def _timed_conclusion(parsed: dict[str, Any], active: float | None, now: float
                      ) -> dict[str, Any]:
    phase = parsed["phase"]
    windows, ceilings = vocab.default_windows(REFERENCE_SIZE_B)
    window, ceiling = windows[phase], ceilings[phase]
    if active is None:
        return {"verdict": vocab.PROGRESSING,
                "reason": f"{phase}; no dated line to judge how long it has been quiet"}
    quiet = max(0.0, now - active)
    since = parsed["phase_started_at"]
    clock = "by the log's stamps against this machine's clock"
    if quiet > window:
        return {"verdict": vocab.STALLED,
                "reason": f"no log progress for {duration(quiet)} in {phase} (window "
                          f"{window} s for a {REFERENCE_SIZE_B}B model, {clock}), unless its "
                          f"processes read from disk or its GPU memory moves"}
    if since is not None and now - since > ceiling:
        return {"verdict": vocab.STALLED,
                "reason": f"{phase} has lasted {duration(now - since)}, over its ceiling of "
                          f"{ceiling} s for a {REFERENCE_SIZE_B}B model"}
    return {"verdict": vocab.PROGRESSING,
            "reason": f"{phase}, last log progress {duration(quiet)} ago (window {window} s "
                      f"for a {REFERENCE_SIZE_B}B model, {clock})"}


def duration(seconds: float) -> str:
    return vocab.duration_text(seconds)


def _progress(p: dict[str, Any] | None) -> str:
    return f"{p['done']}/{p['total']} {p['unit']}" if p else ""


def _stamp(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at is not None else "?"


def render(report: dict[str, Any], source: str, now: float | None = None,
           note: str = "") -> str:
    """The plain report: what an engineer needs at 3 a.m., most important first. Every
    byte that came from the log is shown inert."""
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
    if gate.get("line") and gate["line"] not in gate["reason"]:
        out.append(f"            {gate['line']}")
    if gate.get("hint"):
        out.append(f"            Fix: {gate['hint']}")
    active = report["last_activity_at"]
    if active is not None:
        out.append(f"  last      {_stamp(active)} ({report['last_activity_from']}; "
                   f"{duration(max(0.0, now - active))} before this machine's clock now)")
    out += [""] + _timeline_lines(report["timeline"]) + [""] + _failure_lines(report)
    return inert("\n".join(out) + "\n")


def _timeline_lines(rows: list[dict[str, Any]]) -> list[str]:
    out = ["timeline (durations between the log's own stamps)"]
    names = [r["phase"] + (" " + r["step"] if r["step"] else "") for r in rows]
    tooks = [(duration(r["seconds"]) if r["seconds"] is not None else "?")
             + (" so far" if r["current"] else "") for r in rows]
    width, took_width = max(map(len, names), default=0), max(map(len, tooks), default=0)
    for name, took, row in zip(names, tooks, rows, strict=True):
        out.append(f"  {_stamp(row['at'])}  {name:<{width}}  {took:>{took_width}}  "
                   f"{_progress(row['progress'])}".rstrip())
    return out


def _failure_lines(report: dict[str, Any]) -> list[str]:
    failures = report["failures"]
    if not failures:
        return ["failures  none"]
    fatal = [f for f in failures if f["fatal"]]
    count = str(len(failures))
    if report["failures_total"] > len(failures):
        count = f"{len(failures)} ({report['failures_total']} lines, the same ones said once)"
    out = [f"failures  {count}, {len(fatal)} fatal"]
    kind_width = max(len(f["kind"]) for f in failures)
    for f in failures:
        mark = "FATAL" if f["fatal"] else "warn "
        times = f" (x{f['count']})" if f.get("count", 1) > 1 else ""
        out.append(f"  {mark}  {f['kind']:<{kind_width}}  {f['said']}{times}")
    out.append("")
    for kind in dict.fromkeys(f["kind"] for f in failures):
        first = next(f for f in failures if f["kind"] == kind)
        hint = f" Try: {first['hint']}." if first["hint"] else ""
        out.append(f"  {kind:<{kind_width}}  {'fatal' if first['fatal'] else 'not fatal'}: "
                   f"{first['why']}.{hint}")
    return out


def command(args: argparse.Namespace) -> int:
    try:
        text, mtime, note, whole = read_source(args.logfile)
    except LogUnreadable as exc:
        print(f"sglang-fleet diagnose: {exc}", file=sys.stderr)
        return EXIT_USAGE
    report = diagnose(text, mtime=mtime, whole=whole)
    source = "stdin" if args.logfile == "-" else args.logfile
    if args.json:
        report["source"] = source
        report["note"] = note
        report["read_limits"] = {"head_bytes": HEAD_BYTES, "tail_bytes": TAIL_BYTES,
                                 "stream_bytes": STREAM_LIMIT}
        print(json.dumps(report, indent=2))  # JSON escapes every control character
    else:
        print(render(report, inert(source, keep_newlines=False), note=note), end="")
    return EXIT_HOSTS_FAILED if report["fatal"] else EXIT_OK
