"""The CLI's contract with CI: exit codes, the JSON summary, JUnit XML and the host table."""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from sglang_fleet.node.common.text import inert
from sglang_fleet.node.common.vocab import verdict_phrase
from sglang_fleet.runs.advice import operator_stopped
from sglang_fleet.runs.outcomes import INTERRUPTED, NOT_OBSERVED, STAGES, HostOutcome
from sglang_fleet.runs.reasons import (
    counted,
    group_by_reason,
    hosts_text,
    shorten,
    without_host,
    wrap,
)

EXIT_OK = 0  # every host ready (or its command succeeded)
EXIT_HOSTS_FAILED = 1  # some hosts failed: verdicts and evidence in the summary
EXIT_USAGE = 2  # bad command line, unreadable or invalid inventory: no node touched
EXIT_UNREACHABLE = 3  # some hosts could not be reached
EXIT_INTERNAL = 4  # a bug, or a run that ended without its recap: see the runner artifacts
EXIT_SIGINT = 130  # interrupted (Ctrl-C): 128 + the signal, as shells report it
EXIT_SIGTERM = 143  # terminated (SIGTERM)
EXIT_CODES = {EXIT_OK: "ok", EXIT_HOSTS_FAILED: "hosts failed", EXIT_USAGE: "usage error",
              EXIT_UNREACHABLE: "unreachable hosts", EXIT_INTERNAL: "internal error",
              EXIT_SIGINT: "interrupted", EXIT_SIGTERM: "interrupted"}


def judge_readiness(outcomes: dict[str, HostOutcome]) -> None:
    """For commands that observe (health, watch): a server that is not ready fails its host."""
    for o in outcomes.values():
        if o.status == "ok" and o.verdict and operator_stopped(o.verdict):
            continue  # stopped on purpose (stop.yml): said as stopped, not a failure
        if o.status == "ok" and o.verdict and o.verdict_name != "ready":
            v = o.verdict
            o.status = "failed"
            o.message = o.message or v.get("headline") or (
                f"{verdict_phrase(v.get('verdict'), v.get('phase'))}: {v.get('reason')}")
            o.stages["health"] = o.message


def exit_code(rc: int, outcomes: dict[str, HostOutcome],
              interrupted_exit: int | None = None) -> int:
    if interrupted_exit is not None:
        return interrupted_exit  # its own outcome, whatever the hosts had reached
    failed = [o for o in outcomes.values() if o.status == "failed"]
    if not outcomes:
        return EXIT_USAGE  # nothing ran: a parse error, a bad path, or no host matched
    if any(o.status == "unreachable" for o in outcomes.values()):
        return EXIT_UNREACHABLE
    if failed and all(o.stages.get("spec") and o.only_checked for o in failed):
        return EXIT_USAGE  # the inventory was refused before any node was touched
    if failed:
        return EXIT_HOSTS_FAILED
    if any(o.status == NOT_OBSERVED for o in outcomes.values()):
        return EXIT_INTERNAL  # the run ended before its recap: nothing is known to be ok
    return EXIT_OK if rc == 0 else EXIT_INTERNAL


def rc_after_recovery(rc: int, failed: set[str], outcomes: dict[str, HostOutcome]) -> int:
    """An observation's ansible-playbook exit status once `watch --recover` has recovered
    hosts: 0 when every host that run failed (`failed`) is ok now, for that was all the status
    said; otherwise the status as it was."""
    if rc and failed and all(outcomes[h].status == "ok" for h in failed if h in outcomes):
        return 0
    return rc


def where_it_was(o: HostOutcome, with_task: bool = True) -> str:
    """A host's last known state, for a run that ended before its recap: its stage (and
    task), and its last gate verdict with progress."""
    v = o.verdict or {}
    if v:
        state = f"{v.get('verdict')}: {v.get('progress_text') or v.get('phase') or ''}".rstrip()
    else:
        state = "no verdict yet"
    stage = f"in {o.last_stage}" if o.last_stage else "before any stage"
    task = f" ({o.last_task})" if o.last_task and with_task else ""
    return f"{stage}{task}; {state}"


def host_record(o: HostOutcome) -> dict[str, Any]:
    v = o.verdict or {}
    record = {
        "status": o.status, "verdict": o.verdict_name, "phase": v.get("phase"),
        "reason": v.get("reason"), "progress": v.get("progress_text"),
        # Why it failed: configuration, environment, external or hardware, and the failure
        # the verdict rests on in one line (the exception's own final line, ranks, log line).
        "cause": v.get("cause"), "failure": (v.get("failure") or {}).get("said"),
        "advice": v.get("advice"),
        "evidence": o.evidence, "message": o.message if o.status != "ok" else "",
        "failed_task": o.failed_task if o.status != "ok" else "",
        "last_stage": o.last_stage, "last_task": o.last_task,
        "stages": {s: ("passed" if msg is None else "failed") for s, msg in o.stages.items()},
    }
    if o.benchmark:
        level = o.benchmark["benchmark"]["levels"][0]
        record["benchmark"] = {"output_tok_s": level["output_tok_s"]["median"],
                               "ttft_s": level["ttft_s"]["median"],
                               "simulated": o.benchmark.get("simulated"),
                               "config_hash": o.benchmark.get("config_hash")}
    if o.canary:
        record["canary"] = o.canary
    if o.status in (INTERRUPTED, NOT_OBSERVED):
        record["last_state"] = where_it_was(o, with_task=False)
        record["message"] = f"{o.status} {where_it_was(o)}" + (
            f"; last failure: {o.message}" if o.message else "")
    if o.recovery:
        record["recovery"] = {k: o.recovery.get(k) for k in
                              ("config_hash", "verdict", "phase", "evidence", "seconds_to_free",
                               "reboot_needed", "next")}
    return record


def build_summary(command: str, rc: int, outcomes: dict[str, HostOutcome], started: float,
                  finished: float, run_dir: Path, interrupted_by: str | None = None,
                  interrupted_exit: int | None = None, **extra: Any) -> dict[str, Any]:
    code = exit_code(rc, outcomes, interrupted_exit)
    return {
        "command": command, "exit_code": code, "result": EXIT_CODES[code],
        "interrupted_by": interrupted_by, "ansible_rc": rc,
        "started": started, "finished": finished,
        "seconds": round(finished - started, 1), "run_dir": str(run_dir),
        "hosts": {h: host_record(o) for h, o in sorted(outcomes.items())}, **extra,
    }


def _failure_text(host: str, stage: str, o: HostOutcome, message: str) -> str:
    v = o.verdict or {}
    lines = [f"{host}: {stage} failed"]
    if v and stage in ("health", "recover"):
        lines.append(f"verdict: {verdict_phrase(v.get('verdict'), v.get('phase'))}: "
                     f"{v.get('reason')}")
        if v.get("cause"):
            lines.append(f"cause: {v['cause']}")
    if o.evidence:
        lines.append(f"evidence: {o.evidence}")
    lines.append(message)
    return "\n".join(lines)


def junit_document(suite_name: str, seconds: float,
                   cases: list[tuple[str, str, str | None, str]]) -> str:
    """JUnit XML: (classname, name, failure text or None, failure message) per test case."""
    suite = ET.Element("testsuite", name=suite_name, time=str(seconds))
    failures = 0
    for classname, name, text, message in cases:
        case = ET.SubElement(suite, "testcase", classname=inert(classname, False),
                             name=inert(name, False))
        if text is not None:
            failures += 1
            # Node text made inert: control characters shown as \x1b, never written raw (XML
            # 1.0 cannot hold them, and a CI page would render them).
            ET.SubElement(case, "failure", message=inert(message[:200], keep_newlines=False)
                          ).text = inert(text)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def junit_xml(summary: dict[str, Any], outcomes: dict[str, HostOutcome]) -> str:
    """One test case per host and stage; a failed stage carries its verdict and evidence."""
    cases: list[tuple[str, str, str | None, str]] = []
    for host, o in sorted(outcomes.items()):
        stages = [(s, o.stages[s]) for s in STAGES if s in o.stages]
        if o.status == "unreachable":
            stages.append(("connect", o.message or "unreachable"))
        elif o.status in (INTERRUPTED, NOT_OBSERVED):
            stages.append((o.last_stage or "run", f"{o.status} {where_it_was(o)}"))
        elif o.status == "failed" and all(msg is None for _, msg in stages):
            stages.append((o.failed_task or "run", o.message or "failed"))
        for stage, message in stages:
            if message is None:
                cases.append((f"sglang-fleet.{host}", stage, None, ""))
                continue
            short = o.verdict_name if stage == "health" else message.splitlines()[0]
            cases.append((f"sglang-fleet.{host}", stage,
                          _failure_text(host, stage, o, message), short))
    return junit_document(f"sglang-fleet {summary['command']}", summary["seconds"], cases)


# Lines of one failure message shown under the table; the summary keeps all of them.
REASON_LINES = 40
DETAIL_WIDTH = 60


def failure_reason(record: dict[str, Any]) -> str:
    """Why a host is not ok, whole: its verdict in words with the reason, or the failed
    task's message (a refused LaunchSpec: every problem with its fix)."""
    if record["status"] == "ok" and record["verdict"] in ("ready", NOT_OBSERVED):
        return ""
    if record["status"] in (INTERRUPTED, NOT_OBSERVED):
        return record["message"]
    message = (record["message"] or "").strip()
    if record["stages"].get("spec") == "failed" or not record["reason"]:
        return message or record["status"]
    if "Fix:" in message.split("\n", 1)[0]:
        return message.split("\n", 1)[0]  # the verdict with what to do (health.yml)
    if re.search(r"^Fix: ", message, re.M):
        return message  # a failure block: verdict, cause, next step, fix, evidence
    return f"{verdict_phrase(record['verdict'], record['phase'])}: {record['reason']}"


def _detail(host: str, r: dict[str, Any]) -> str:
    if r.get("benchmark"):
        b = r["benchmark"]
        return (f"{b['output_tok_s']:.1f}{' SIMULATED' if b['simulated'] else ''} tok/s, "
                f"TTFT {b['ttft_s']:.3f} s")
    if r["status"] in (INTERRUPTED, NOT_OBSERVED):
        return r["last_state"]
    reason = failure_reason(r)
    if not reason:
        return r["progress"] or ""
    if r["stages"].get("spec") == "failed":
        return "LaunchSpec refused (below)"
    return shorten(without_host(reason, host), DETAIL_WIDTH)


def host_table(summary: dict[str, Any], width: int | None = None) -> str:
    """One row per host; below it, the full reason of every host that is not ok, said once
    for all the hosts that share it, wrapped at `width` between words (None: one line per
    line of the reason, for logs and grep). A DETAIL cell is only ever cut where its full
    text follows below."""
    rows = [("HOST", "STATUS", "VERDICT", "DETAIL", "EVIDENCE")]
    for host, r in summary["hosts"].items():
        rows.append((host, r["status"], r["verdict"], _detail(host, r), r["evidence"] or ""))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    table = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    failed = [(host, failure_reason(r)) for host, r in summary["hosts"].items()
              if r["status"] not in (INTERRUPTED, NOT_OBSERVED) and failure_reason(r)]
    if failed:
        table += ["", "why:"]
        for hosts, reason in group_by_reason(failed):
            lines = reason.splitlines()
            more = len(lines) - REASON_LINES
            if more > 0:
                lines = lines[:REASON_LINES] + [f"... {counted(more, 'more line')} in summary.json"]
            same = f" (the same on {len(hosts)} hosts)" if len(hosts) > 1 else ""
            table.append(f"  {hosts_text(hosts)}{same}:")
            table += (wrap("\n".join(lines), width=width, indent="    ", more="      ")
                      if width else ["    " + x for x in lines])
    return inert("\n".join(table))


def write_private(path: Path, text: str) -> None:
    """0600: the summary names settings and evidence paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def write_summary(summary: dict[str, Any], outcomes: dict[str, HostOutcome], json_path: Path,
                  junit_path: Path) -> None:
    write_private(json_path, json.dumps(summary, indent=2, default=str) + "\n")
    write_private(junit_path, junit_xml(summary, outcomes))
