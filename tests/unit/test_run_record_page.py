"""The run record from a run's events: verdict rows failed first, what changed against the last
good run (secrets as fingerprints), destructive actions with their reasons, a page that keeps
node text as text, a killed run's page, and pruning that keeps each deployment's last good
run."""

from __future__ import annotations

import html
import json
import os
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

from sglang_fleet.record.build import build_record, setting_changes
from sglang_fleet.record.history import prune_runs, run_folders, write_run_record
from sglang_fleet.record.page import render_page

T0 = 1_800_000_000.0


def created(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).replace(tzinfo=None).isoformat()


def event(kind: str, host: str, action: str, res: dict, at: float, task: str = "task",
          path: str = "/x/roles/sglang_server/tasks/gate.yml:3") -> dict:
    return {"event": kind, "created": created(at), "event_data": {
        "host": host, "task": task, "task_action": f"sglang.fleet.{action}",
        "task_path": path, "res": res}}


def spec_event(host: str, at: float, attention: str, key_print: str) -> dict:
    spec = {"host": host, "deployment": f"Kimi-{host}", "config_hash": f"cfg-{attention}",
            "settings": {"sglang_server_attention_backend": attention, "sglang_server_tp": 8},
            "secret_fingerprints": {"SGLANG_API_KEY": key_print}}
    return event("runner_on_ok", host, "set_fact", {"ansible_facts": {
        "sglang_server_launch_spec": spec}}, at, "Build the LaunchSpec from the variables",
        "/x/roles/sglang_server/tasks/spec.yml:1")


def gate(host: str, at: float, verdict: str, phase: str | None, kind: str = "runner_on_ok",
         **more) -> dict:
    res = {"verdict": verdict, "phase": phase, "since": at - 0.5, "reason": more.pop(
        "reason", "r"), "headline": more.pop("headline", f"{verdict} in {phase}"), **more}
    return event(kind, host, "sglang_health", res, at,
                 "Observe the server until it is ready or judged failed",
                 "/x/roles/sglang_server/tasks/observe.yml:5")


def stats(ok=(), failures=()) -> dict:
    return {"event": "playbook_on_stats", "created": created(T0 + 100), "event_data": {
        "ok": {h: 1 for h in ok}, "failures": {h: 1 for h in failures}, "dark": {}}}


def a_run(hosts=("sim-node-1", "sim-node-2"), hang="sim-node-2", recap=True,
          bundle: Path | None = None, last_lines=("Load weight begin.",)) -> list[dict]:
    """A deploy: every host validated and gated; `hang` stalls in graph capture, is killed
    and rolled back to its last good configuration."""
    events = []
    for i, host in enumerate(hosts):
        at = T0 + i
        attention = "flashinfer" if host == hang else "triton"
        events += [spec_event(host, at, attention, "sha256:bbbbbbbbbbbb"),
                   gate(host, at + 5, "progressing", "loading_weights", "runner_retry")]
        if host == hang:
            events += [
                gate(host, at + 10, "stalled", "capturing_cuda_graph", cause="configuration",
                     advice="see where each rank is",
                     evidence={"last_lines": list(last_lines), "busy_wait": "spinning"}),
                event("runner_on_failed", host, "fail", {"msg": "stalled\nFix: set "
                      "sglang_server_attention_backend='triton'"}, at + 11),
                event("runner_on_ok", host, "sglang_stop", {"killed": [{"pid": 41}, {"pid": 42}],
                      "seconds_to_free": 0.25}, at + 20, "Stop the deployment's processes"),
                event("runner_on_ok", host, "sglang_ledger", {"entry": {
                    "kind": "recovery", "config_hash": "cfg-flashinfer", "verdict": "stalled",
                    "evidence": str(bundle) if bundle else None,
                    "next": {"source": "last_known_good", "config_hash": "cfg-triton",
                             "why": "it failed while starting"}}}, at + 21),
            ]
        else:
            events.append(gate(host, at + 12, "ready", "serving", headline="ready"))
    if recap:
        events.append(stats(ok=[h for h in hosts if h != hang], failures=[hang]))
    return events


LEDGER = [{"kind": "ready", "host": "sim-node-2", "deployment": "Kimi-sim-node-2",
           "config_hash": "cfg-triton", "at": T0 - 50, "run": {"id": "earlier"},
           "settings": {"sglang_server_attention_backend": "triton", "sglang_server_tp": 8},
           "secrets": {"SGLANG_API_KEY": "sha256:aaaaaaaaaaaa"}}]


def test_failed_host_first_with_its_verdict_fix_changes_and_actions(tmp_path):
    record = build_record(tmp_path, a_run(), ledger=LEDGER)
    first = record["servers"][0]
    assert first["host"] == "sim-node-2" and first["verdict"] == "stalled"
    assert first["fix"] == "Fix: set sglang_server_attention_backend='triton'"
    assert first["cause"] == "configuration"
    assert [p["phase"] for p in first["timeline"]][-3:] == [
        "capturing_cuda_graph", "stalled", "killed"]
    assert record["fleet"]["serving"] == "partly"
    assert record["fleet"]["line"].startswith("Partly serving: 1 of 2 servers ready")
    (change,) = [c for c in record["changes"] if c["host"] == "sim-node-2"]
    assert change["against"]["config_hash"] == "cfg-triton"
    assert {s["name"]: (s["old"], s["new"]) for s in change["settings"]} == {
        "sglang_server_attention_backend": ("triton", "flashinfer"),
        "SGLANG_API_KEY": ("sha256:aaaaaaaaaaaa", "sha256:bbbbbbbbbbbb")}
    kinds = [(a["kind"], a["host"]) for a in record["actions"]]
    assert kinds == [("kill", "sim-node-2"), ("rollback", "sim-node-2")]
    assert "stalled in capturing_cuda_graph" in record["actions"][0]["reason"]
    assert record["actions"][1]["reason"] == "it failed while starting"


def test_a_secret_value_is_never_shown_only_its_fingerprint():
    changes = setting_changes({"sglang_server_overrides": {"api_key": "sk-old-value"}},
                              {"sglang_server_overrides": {"api_key": "sk-new-value"}})
    assert "sk-" not in json.dumps(changes)


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_node_text_and_host_names_render_as_text(tmp_path):
    host, line = "<b>x</b>", "<script>alert(1)</script>"
    bundle = tmp_path / "evidence-src" / "b1"
    bundle.mkdir(parents=True)
    (bundle / "log_tail.txt").write_text(f"ok\n{line}\n")
    for last_lines, evidence in (([line], bundle), ([line], None)):
        events = a_run(hosts=(host, "sim-node-1"), hang=host, bundle=evidence,
                       last_lines=last_lines)
        record = build_record(tmp_path / "run", events, ledger=[])
        assert line in (record["servers"][0]["evidence"] or {"log_tail": last_lines})[
            "log_tail"]
        page = render_page(record)
        parsed = _Tags()
        parsed.feed(page)
        assert parsed.tags.count("script") == 1, "only the page's own filter script"
        assert "b" not in parsed.tags
        text = "".join(parsed.text)
        assert line in text and host in text
        assert "https://" not in page and "http://" not in page
        assert "default-src 'none'" in page


def test_a_run_killed_before_its_recap_gets_a_page_that_says_so(tmp_path):
    run = tmp_path / "20260101T000000Z-deploy"
    run.mkdir()
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n"
                                              for e in a_run(recap=False)) + '{"torn')
    page = write_run_record(run)
    record = json.loads((run / "run.json").read_text())
    assert record["run"]["ended"] == "ended before its recap"
    assert {s["status"] for s in record["servers"]} == {"not observed"}
    assert "ended before Ansible's recap" in html.unescape(page.read_text())
    assert oct(page.stat().st_mode & 0o777) == "0o600"


def _run_with(root: Path, name: str, servers: list[tuple[str, str]]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run": {}, "servers": [
        {"host": h, "deployment": f"d-{h}", "verdict": v, "status": "ok" if v == "ready"
         else "failed"} for h, v in servers]}))
    return folder


def test_pruning_keeps_the_newest_and_each_deployments_last_good_run(tmp_path):
    good_a = _run_with(tmp_path, "20260101T000001Z-deploy", [("a", "ready"), ("b", "ready")])
    good_b = _run_with(tmp_path, "20260101T000002Z-deploy", [("b", "ready")])
    for i in range(3, 8):
        _run_with(tmp_path, f"20260101T00000{i}Z-deploy", [("a", "stalled"), ("b", "crashed")])
    os.symlink(tmp_path / "elsewhere", tmp_path / "20260101T000000Z-link")
    removed = prune_runs(tmp_path, keep=2)
    left = [f.name for f in run_folders(tmp_path)]
    assert good_a.name in left and good_b.name in left, "a deployment's last good run went"
    assert left[-2:] == ["20260101T000006Z-deploy", "20260101T000007Z-deploy"]
    assert len(removed) == 3 and (tmp_path / "20260101T000000Z-link").is_symlink()


def test_router_membership_drains_and_lock_takeovers_are_recorded_with_their_reasons(tmp_path):
    host = "sim-node-1"
    member = {"results": [{"item": {"name": "router-1"}, "action": "removed", "at": T0 + 30,
                           "drain": {"seconds": 1.5, "inflight_left": 0},
                           "view_text": "not registered"},
                          {"item": {"name": "router-2"}, "action": "added", "at": T0 + 40,
                           "view_text": "registered, healthy"}]}
    events = [spec_event(host, T0, "triton", "sha256:aaaaaaaaaaaa"),
              gate(host, T0 + 20, "unhealthy", "serving", headline="unhealthy: generation "
                   "timed out"),
              event("runner_on_ok", host, "sglang_router_member", member, T0 + 41),
              event("runner_on_ok", host, "sglang_lock", {
                  "outcome": "taken_over", "taken_over_because": "its run (pid 7) is gone"},
                  T0 + 42), stats(ok=[host])]
    record = build_record(tmp_path, events, ledger=[])
    assert [(r["router"], r["action"]) for r in record["routers"]] == [
        ("router-1", "removed"), ("router-2", "added")]
    drain, takeover = record["actions"]
    assert drain["kind"] == "drain" and "router-1" in drain["what"]
    assert drain["reason"] == "unhealthy: generation timed out"
    assert takeover["kind"] == "lock takeover" and "pid 7" in takeover["reason"]
    phases = [p["phase"] for p in record["servers"][0]["timeline"]]
    assert phases[-2:] == ["drained", "joined_router"]
