"""The CLI's contract pieces on recorded runner events: exit codes, JUnit, progress, metrics."""

from __future__ import annotations

import io
import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sglang_fleet.cli.inputs import (
    InputError,
    check_inventory_files,
    inventory_yaml_files,
    parse_extra_vars,
)
from sglang_fleet.runs.metrics import prometheus_text
from sglang_fleet.runs.outcomes import host_outcomes
from sglang_fleet.runs.progress import Progress
from sglang_fleet.runs.runner import scrub_artifacts
from sglang_fleet.runs.summary import (
    EXIT_HOSTS_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    build_summary,
    exit_code,
    host_table,
    judge_readiness,
    junit_xml,
    rc_after_recovery,
)

ROLE = "/p/roles/sglang_server/tasks/"
GATE_ACTION = "sglang.fleet.sglang_health"


def ev(kind, host, path, action="x", task="t", **res):
    return {"event": kind, "event_data": {"host": host, "task_path": path + ":3",
                                          "task_action": action, "task": task, "res": res}}


def health(host, verdict, phase="serving", reason="", progress="serving", kind="runner_on_ok"):
    return ev(kind, host, ROLE + "observe.yml", GATE_ACTION, verdict=verdict, phase=phase,
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
    ev("runner_on_ok", "b", "/p/roles/sglang_recover/tasks/recover.yml",
       "sglang.fleet.sglang_ledger",
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
    # Refused after its node was touched (a recovery stopped it, then its restart was refused):
    # the host failed, it is no usage error.
    touched = host_outcomes([ev("runner_on_ok", "a", "/p/roles/sglang_recover/tasks/recover.yml"),
                             ev("runner_on_failed", "a", ROLE + "spec.yml",
                                msg="sglang_server_api_key resolves to nothing")],
                            {"failures": {"a": 1}})
    assert exit_code(2, touched) == EXIT_HOSTS_FAILED


def test_a_host_a_stopped_rollout_never_reached_is_not_started():
    """serial 1: a fails in its deploy, the rollout stops; b passed the checks only."""
    events = [ev("runner_on_ok", "a", ROLE + "spec.yml"),
              ev("runner_on_ok", "b", ROLE + "spec.yml"),
              ev("runner_on_failed", "a", ROLE + "service.yml", msg="start failed")]
    outcomes = host_outcomes(events, {"ok": {"a": 2, "b": 1}, "failures": {"a": 1}})
    assert outcomes["a"].status == "failed"
    assert outcomes["b"].status == "not started"
    assert outcomes["b"].message.startswith("not reached: the rollout stopped at a failed host")
    assert exit_code(2, outcomes) == EXIT_HOSTS_FAILED


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


def test_a_watch_whose_failed_hosts_were_all_recovered_exits_ok():
    """`watch --recover`: the observation's ansible-playbook failed the hosts it judged not
    ready (rc 2); once each is recovered, the observation is ok (exit 0, not 'internal
    error')."""
    outcomes = host_outcomes(EVENTS, STATS)
    assert outcomes["b"].status == "failed"
    assert rc_after_recovery(2, {"b"}, outcomes) == 2  # b is not recovered: the status holds
    outcomes["b"].status = "ok"  # the recovery's outcome replaces the observation's
    assert exit_code(2, outcomes) == EXIT_INTERNAL
    assert exit_code(rc_after_recovery(2, {"b"}, outcomes), outcomes) == EXIT_OK
    assert rc_after_recovery(2, set(), outcomes) == 2  # failed for another reason: kept


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
    assert "HEALTH [b] stalled in capturing_cuda_graph: no progress for 901 s" in lines
    assert "FAILED [b] health: stalled in capturing_cuda_graph" in lines
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
    assert "ready: serving" in lines[0] and "FAILED health: stalled" in lines[1]
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


# ---- runs that end before their recap: interrupted or never observed, never ok -------------

def test_a_host_missing_from_the_recap_is_never_ok():
    events = EVENTS[:5]  # a: progressing in the gate, b: deploying; then the run ended
    killed = host_outcomes(events, None)
    assert {h: o.status for h, o in killed.items()} == {"a": "not observed",
                                                         "b": "not observed"}
    assert exit_code(254, killed) == EXIT_INTERNAL and exit_code(0, killed) == EXIT_INTERNAL
    stopped = host_outcomes(events, None, interrupted=True)
    assert {o.status for o in stopped.values()} == {"interrupted"}
    a = stopped["a"]
    assert a.verdict_name == "progressing", "the last gate poll is the host's real state"
    assert a.last_stage == "health"
    summary = build_summary("deploy", 254, stopped, 0.0, 3.0, "/run",
                            interrupted_by="SIGINT", interrupted_exit=EXIT_SIGINT)
    assert summary["exit_code"] == 130 and summary["result"] == "interrupted"
    assert summary["interrupted_by"] == "SIGINT"
    record = summary["hosts"]["a"]
    assert record["status"] == "interrupted"
    assert record["last_state"] == "in health; progressing: loading_weights 3/64 shards"
    assert "in deploy" in summary["hosts"]["b"]["last_state"]
    assert "interrupted" in host_table(summary) and " ok " not in host_table(summary)
    cases = junit_cases(junit_xml(summary, stopped))
    assert cases[("sglang-fleet.a", "health")] is not None


def test_sigterm_exits_143():
    outcomes = host_outcomes(EVENTS, STATS, interrupted=True)
    assert exit_code(0, outcomes, EXIT_SIGTERM) == 143
    assert outcomes["a"].status == "ok", "a host in the recap keeps its status"


def junit_cases(text):
    suite = ET.fromstring(text.split("?>", 1)[1]).find("testsuite")
    return {(c.get("classname"), c.get("name")): c.find("failure")
            for c in suite.findall("testcase")}


# ---- inputs checked before Ansible starts ------------------------------------------------

BOMB = "".join(f"_{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]\n"
               for p, c in zip("abcdefgh", "bcdefghi", strict=True))
BOMB = '_a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + BOMB


def inventory(tmp_path, group_vars: bytes) -> Path:
    (tmp_path / "group_vars").mkdir(parents=True, exist_ok=True)
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    sglang_servers:\n      hosts:\n        n1:\n")
    (tmp_path / "group_vars" / "sglang_servers.yml").write_bytes(group_vars)
    return tmp_path


def test_an_alias_bomb_in_an_inventory_is_refused_in_well_under_a_second(tmp_path):
    inv = inventory(tmp_path, (BOMB + "sglang_server_extra_args: *i\n").encode())
    started = time.perf_counter()
    with pytest.raises(InputError) as exc:
        check_inventory_files(inv)
    assert time.perf_counter() - started < 0.5
    assert str(tmp_path / "group_vars" / "sglang_servers.yml") in str(exc.value)
    assert "into 1,111,111,111" in str(exc.value) or "alias bomb" in str(exc.value)


def test_aliases_a_real_inventory_uses_pass(tmp_path):
    shared = ("_defaults: &defaults\n  sglang_server_tp: 8\n  sglang_server_extra_env: "
              "{A: 1}\nsglang_server_nccl_profile:\n  <<: *defaults\n")
    assert check_inventory_files(inventory(tmp_path, shared.encode())) == 2


def test_inventory_encoding_syntax_and_cycles_are_named_with_file_and_line(tmp_path):
    cases = {b'sglang_server_served_model_name: "Kimi\xff"\n': "not valid UTF-8: byte 0xff "
                                                                "at line 1, column 39",
             b"sglang_server_tp: [8\n": "not valid YAML: line 2, column 1: expected ',' or ']'",
             b"a: &a [*a]\n": "a cycle",
             b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n": "nested too deeply"}
    for i, (text, expected) in enumerate(cases.items()):
        with pytest.raises(InputError) as exc:
            check_inventory_files(inventory(tmp_path / str(i), text))
        assert expected in str(exc.value), str(exc.value)
        assert "group_vars/sglang_servers.yml" in str(exc.value)


def test_files_ansible_does_not_read_as_yaml_are_left_alone(tmp_path):
    inv = inventory(tmp_path, b"sglang_server_tp: 8\n")
    (inv / "hosts.ini").write_text("[sglang_servers]\nn1 ansible_host=10.0.0.1\n")  # INI
    (inv / "notes.md").write_text("[not yaml\n")
    (inv / "group_vars" / "vault.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n6162\n")
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "n1").write_text("sglang_server_port: [1\n")  # no extension: YAML
    assert [p.name for p in inventory_yaml_files(inv)] == [
        "hosts.yml", "sglang_servers.yml", "vault.yml", "n1"]
    with pytest.raises(InputError, match="host_vars/n1: not valid YAML"):
        check_inventory_files(inv)


def test_tags_ansible_cannot_read_are_refused_naming_the_file_and_variable(tmp_path):
    """A !!python/object tag crashed `check` (exit 4, "stdout missing" from Ansible's loader)."""
    inv = inventory(tmp_path, b"sglang_server_tp: 8\nsglang_server_extra_env:\n"
                              b"  A: !!python/object/apply:os.system [id]\n")
    with pytest.raises(InputError) as exc:
        check_inventory_files(inv)
    assert str(exc.value) == (
        f"inventory file {inv / 'group_vars' / 'sglang_servers.yml'}: sglang_server_extra_env.A: "
        "the YAML tag !!python/object/apply:os.system (line 3) is not one Ansible reads (it "
        "reads YAML's own types, !unsafe and !vault). Fix: remove the tag and write the value "
        "as plain YAML")
    fine = inventory(tmp_path / "fine", b"a: !unsafe '{{ x }}'\nb: !!str 8\nc: !!set {x}\n")
    assert check_inventory_files(fine) == 2


@pytest.mark.parametrize("value, expected", [
    ("[" + "1, " * 1_500 + "1]", "sglang_server_extra_args (line 2) is a list of 1,501 "
     "entries, more than the 1,000 a setting's list may hold"),
    ("{" + ", ".join(f"K{i}: 1" for i in range(1500)) + "}", "sglang_server_extra_args "
     "(line 2) is a mapping of 1,500 entries, more than the 1,000"),
    ("'" + "x" * 1_100_000 + "'", "is a string of 1,100,000 characters, more than the "
     "1,048,576"),
    ("[" + ", ".join(["[" + "1, " * 999 + "1]"] * 20) + "]", "sglang_server_extra_args "
     "(line 2) holds 20,021 values, more than the 10,000 one setting may hold"),
])
def test_a_setting_too_big_to_check_is_refused_in_seconds_naming_size_and_limit(
        tmp_path, value, expected):
    """A 200,000-item sglang_server_extra_args took 672 s and 376 MB in `check`, then passed
    (bench/safety_trials.py check_bounds times that one; here, just past each bound)."""
    inv = inventory(tmp_path, f"sglang_server_tp: 8\nsglang_server_extra_args: {value}\n"
                    .encode())
    with pytest.raises(InputError) as exc:
        check_inventory_files(inv)
    assert expected in str(exc.value), str(exc.value)
    assert "Fix: give sglang_server_extra_args a value of a usable size" in str(exc.value)


def test_settings_are_bounded_in_inventory_sources_too_not_their_host_lists(tmp_path):
    hosts = "".join(f"        n{i}:\n" for i in range(1500))  # a big fleet is no setting
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    sglang_servers:\n      hosts:\n" + hosts)
    assert check_inventory_files(tmp_path) == 1
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    sglang_servers:\n      hosts:\n        n1:\n"
        "          sglang_server_extra_args: [" + "a, " * 1000 + "a]\n")
    with pytest.raises(InputError, match=r"hosts.yml: sglang_server_extra_args \(line 6\) "
                                         r"is a list of 1,001 entries"):
        check_inventory_files(tmp_path)


def test_extra_vars_are_parsed_or_refused_with_the_real_error():
    assert parse_extra_vars(['{"sglang_server_tp": 8}', "a=1 b=hang:loading_weights"]) == {
        "sglang_server_tp": 8, "a": 1, "b": "hang:loading_weights"}
    refused = {
        '{"sglang_server_tp": 8': "line 1, column 23: expected ',' or '}'",
        "sglang_server_tp=[8": "-e sglang_server_tp: not valid YAML",
        "K=\udcff": "-e: not valid UTF-8: byte 0xff at position 3",
        "{" + BOMB.replace("\n", ", ").rstrip(", ") + "}": "alias bomb",
        '{"x": !!python/object:os.system "id"}': "x: the YAML tag !!python/object:os.system",
        "sglang_server_extra_args=[" + "1," * 2000 + "1]":
            "-e sglang_server_extra_args: sglang_server_extra_args (line 1) is a list of "
            "2,001 entries, more than the 1,000",
        "@vars.yml": "files of variables are not taken here",
        "[1, 2]": "expected key=value",
    }
    for text, expected in refused.items():
        with pytest.raises(InputError) as exc:
            parse_extra_vars([text])
        assert expected in str(exc.value), (text, str(exc.value))


def test_a_secret_at_any_depth_of_extra_vars_is_refused_with_the_fix():
    for value in ({"sglang_server_api_key": "k" * 20},
                  {"sglang_server_overrides": {"sglang_server_api_key": "k" * 20}},
                  {"sglang_server_overrides": {"sglang_server_extra_env": {"HF_TOKEN": "x"}}},
                  {"sglang_server_overrides": [{"hf_token": "x"}]}):
        with pytest.raises(InputError) as exc:
            parse_extra_vars([json.dumps(value)])
        text = str(exc.value)
        assert "Fix: set sglang_server_api_key / sglang_server_hf_token in the inventory" in text
        assert "k" * 20 not in text and ": x" not in text
    with pytest.raises(InputError, match="-e sglang_server_overrides.sglang_server_api_key"):
        parse_extra_vars(['{"sglang_server_overrides": {"sglang_server_api_key": "abc"}}'])


# ---- runner artifacts: private, secrets masked at any depth ------------------------------

def test_runner_artifacts_are_private_with_nested_secrets_masked(tmp_path):
    run = tmp_path / "runner"
    events = run / "artifacts" / "x1" / "job_events"
    events.mkdir(parents=True)
    (run / "env").mkdir()
    secret = "sk-nested-secret-0123456789"
    settings = {"sglang_server_overrides": {"sglang_server_api_key": secret,
                                            "sglang_server_extra_env": {"MY_TOKEN": secret}},
                "sglang_server_tokenizer_path": "/m", "secret_env_names": ["HF_TOKEN"]}
    (run / "env" / "extravars").write_text(json.dumps(settings))
    (events / "1-abc.json").write_text(json.dumps(
        {"event": "runner_on_ok", "event_data": {"res": {"ansible_facts": {
            "sglang_server_launch_spec": {"settings": settings}}}}}))
    (run / "artifacts" / "x1" / "command").write_text(json.dumps(
        {"command": ["ansible-playbook", "-e", json.dumps(settings)],
         "env": {"MY_SERVICE_TOKEN": secret, "PATH": "/bin"}}))
    scrub_artifacts(str(run))
    for path in [p for p in run.rglob("*") if p.is_file()]:
        text = path.read_text()
        assert secret not in text, path
        assert path.stat().st_mode & 0o077 == 0, path
    kept = json.loads((run / "env" / "extravars").read_text())
    assert kept["sglang_server_overrides"]["sglang_server_api_key"] == "********"
    assert kept["sglang_server_tokenizer_path"] == "/m"
    assert kept["secret_env_names"] == ["HF_TOKEN"], "names of secrets are not secrets"
    assert all(p.stat().st_mode & 0o077 == 0 for p in run.rglob("*") if p.is_dir())


# ---- what a node sends is inert; a stop is not a failure -----------------------------------

HOSTILE = "bad \x1b[2J\x1b]0;owned\x07\x00 line\x1b[1A\x1b[2Kok: [a] => ready \ufffe\ud800"


def test_node_text_in_junit_json_table_and_progress_is_inert():
    events = [
        health("b", "crashed", "serving", reason=f"TP0: ValueError: {HOSTILE}"),
        ev("runner_on_failed", "b", ROLE + "verdict.yml", "fail", "Fail the host",
           msg=f"b: crashed while serving: TP0: ValueError: {HOSTILE}\nFix: recover it"),
    ]
    outcomes = host_outcomes(events, {"failures": {"b": 1}})
    summary = build_summary("deploy", 2, outcomes, 0.0, 1.0, "/run")
    xml = junit_xml(summary, outcomes)
    failure = ET.fromstring(xml.split("?>", 1)[1]).find("testsuite/testcase/failure")
    assert "\\x1b[2J" in failure.text and "\\x00" in failure.text and "\\ud800" in failure.text
    assert not any(c in xml for c in "\x1b\x00\x07\ufffe")
    assert "\\u001b" in json.dumps(summary)  # JSON escapes control characters itself
    table = host_table(summary, width=100)
    assert "\x1b" not in table and "\\x1b]0;owned\\x07" in table
    out = io.StringIO()
    progress = Progress(out, tty=False)
    for e in events:
        progress(e)
    assert "\x1b" not in out.getvalue() and "\\x1b[2J" in out.getvalue()


def test_a_server_stopped_by_stop_yml_does_not_fail_health_and_the_cause_is_recorded():
    stopped = ev("runner_on_ok", "a", ROLE + "observe.yml", GATE_ACTION, verdict="stopped",
                 phase="serving", reason="stopped by stop.yml at 2026-01-01 00:00:00 UTC",
                 stopped_by="stop.yml")
    outside = ev("runner_on_ok", "b", ROLE + "observe.yml", GATE_ACTION, verdict="stopped",
                 phase="serving", reason="stopped by a SIGTERM from outside sglang-fleet",
                 stopped_by="SIGTERM")
    crashed = ev("runner_on_ok", "c", ROLE + "observe.yml", GATE_ACTION, verdict="crashed",
                 phase="loading_weights", reason="r", cause="environment",
                 failure={"said": "TP0: OSError: [Errno 28] No space left on device"})
    outcomes = host_outcomes([stopped, outside, crashed], {"ok": {"a": 1, "b": 1, "c": 1}})
    judge_readiness(outcomes)
    assert outcomes["a"].status == "ok" and outcomes["b"].status == "failed"
    summary = build_summary("health", 0, outcomes, 0.0, 1.0, "/run")
    assert summary["hosts"]["c"]["cause"] == "environment"
    assert summary["hosts"]["c"]["failure"] == "TP0: OSError: [Errno 28] No space left on device"
