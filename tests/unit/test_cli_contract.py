"""The CLI's contract pieces on recorded runner events: exit codes, JUnit, progress, metrics."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

from sglang_fleet.metrics import prometheus_text
from sglang_fleet.outcomes import host_outcomes
from sglang_fleet.progress import Progress
from sglang_fleet.summary import (
    EXIT_HOSTS_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    build_summary,
    exit_code,
    judge_readiness,
    junit_xml,
)

ROLE = "/p/roles/sglang_server/tasks/"


def ev(kind, host, path, action="x", task="t", **res):
    return {"event": kind, "event_data": {"host": host, "task_path": path + ":3",
                                          "task_action": action, "task": task, "res": res}}


def health(host, verdict, phase="serving", reason="", progress="serving", kind="runner_on_ok"):
    return ev(kind, host, ROLE + "observe.yml", "sglang_health", verdict=verdict, phase=phase,
              reason=reason, progress_text=progress)


EVENTS = [
    ev("runner_on_ok", "a", ROLE + "spec.yml"), ev("runner_on_ok", "b", ROLE + "spec.yml"),
    ev("runner_on_ok", "a", ROLE + "service.yml"), ev("runner_on_ok", "b", ROLE + "service.yml"),
    health("a", "progressing", "loading_weights", progress="loading_weights 3/64 shards",
           kind="runner_retry"),
    health("a", "ready"),
    health("b", "stalled", "capturing_cuda_graph", "no progress for 901 s"),
    ev("runner_on_failed", "b", ROLE + "gate.yml", "fail", "Fail the host",
       msg="b: stalled in capturing_cuda_graph"),
    ev("runner_on_ok", "b", "/p/roles/sglang_recover/tasks/recover.yml", "sglang_ledger",
       entry={"kind": "recovery", "evidence": "/ev/b/1", "verdict": "stalled"}),
]
STATS = {"ok": {"a": 5, "b": 3}, "failures": {"b": 1}, "dark": {}}


def test_exit_codes():
    outcomes = host_outcomes(EVENTS, STATS)
    assert exit_code(2, outcomes) == EXIT_HOSTS_FAILED
    assert exit_code(0, {}) == EXIT_USAGE
    assert exit_code(0, host_outcomes(EVENTS[:6], {"ok": {"a": 1, "b": 1}})) == EXIT_OK
    assert exit_code(99, host_outcomes(EVENTS[:6], {"ok": {"a": 1}})) == EXIT_INTERNAL
    gone = host_outcomes([ev("runner_on_unreachable", "c", "/p/playbooks/x.yml",
                             msg="ssh: connect to host refused")], {"dark": {"c": 1}})
    assert exit_code(4, gone) == EXIT_UNREACHABLE
    refused = host_outcomes([ev("runner_on_failed", "a", ROLE + "spec.yml",
                                msg="sglang_server_tp=100: out of range")], {"failures": {"a": 1}})
    assert exit_code(2, refused) == EXIT_USAGE


def test_junit_has_one_case_per_host_and_stage_with_verdict_and_evidence():
    outcomes = host_outcomes(EVENTS, STATS)
    summary = build_summary("deploy", 2, outcomes, 0.0, 12.5, "/run")
    suite = ET.fromstring(junit_xml(summary, outcomes).split("?>", 1)[1]).find("testsuite")
    cases = {(c.get("classname"), c.get("name")): c.find("failure")
             for c in suite.findall("testcase")}
    assert set(cases) == {("sglang-fleet.a", s) for s in ("spec", "deploy", "health")} | {
        ("sglang-fleet.b", s) for s in ("spec", "deploy", "health", "recover")}
    failure = cases[("sglang-fleet.b", "health")]
    assert failure.get("message") == "stalled"
    assert "stalled in capturing_cuda_graph: no progress for 901 s" in failure.text
    assert "evidence: /ev/b/1" in failure.text
    assert suite.get("tests") == "7" and suite.get("failures") == "1"
    assert summary["hosts"]["b"]["evidence"] == "/ev/b/1"


def test_health_judges_a_server_that_is_not_ready_as_failed():
    outcomes = host_outcomes([health("a", "ready"), health("b", "unhealthy", reason="503")],
                             {"ok": {"a": 1, "b": 1}})
    judge_readiness(outcomes)
    assert outcomes["a"].status == "ok" and outcomes["b"].status == "failed"
    assert exit_code(0, outcomes) == EXIT_HOSTS_FAILED


def test_plain_progress_prints_one_line_per_change():
    out = io.StringIO()
    progress = Progress(out, tty=False)
    for e in EVENTS + EVENTS[:1]:
        assert progress(e) is True  # runner keeps every event
    lines = out.getvalue().splitlines()
    assert "GATE [a] progressing: loading_weights 3/64 shards" in lines
    assert "HEALTH [b] stalled: capturing_cuda_graph: no progress for 901 s" in lines
    assert any(line.startswith("FAILED [b] failed in health 'Fail the host'") for line in lines)
    assert "\x1b[" not in out.getvalue()


def test_terminal_progress_redraws_a_board_in_place():
    out = io.StringIO()
    progress = Progress(out, tty=True)
    for e in EVENTS[4:8]:  # a progressing, a ready, b stalled, b failed
        progress(e)
    draws = out.getvalue().split("\x1b[")
    # Each change moves the cursor up over the board drawn so far and redraws every line.
    assert out.getvalue().count("\x1b[1F") == 2 and out.getvalue().count("\x1b[2F") == 1
    board = out.getvalue().rsplit("\x1b[2F", 1)[1]
    lines = [x for x in board.split("\x1b[2K") if x]
    assert [x.split()[0] for x in lines] == ["a", "b"]
    assert "ready: serving" in lines[0] and "failed in health" in lines[1]
    assert all(len(x.rstrip("\n")) <= 118 for x in lines) and draws


def test_prometheus_text():
    outcomes = host_outcomes(EVENTS, STATS)
    text = prometheus_text(outcomes, 1700000000.5, 3, {"b": 1})
    assert 'sglang_fleet_server_verdict{host="a",verdict="ready"} 1' in text
    assert 'sglang_fleet_server_verdict{host="a",verdict="stalled"} 0' in text
    assert 'sglang_fleet_server_ready{host="b"} 0' in text
    assert 'sglang_fleet_server_phase{host="b",phase="capturing_cuda_graph"} 1' in text
    assert 'sglang_fleet_watch_recoveries_total{host="b"} 1' in text
    assert "sglang_fleet_watch_last_observation_timestamp_seconds 1700000000.500" in text
    assert text.count("# TYPE") == 7
