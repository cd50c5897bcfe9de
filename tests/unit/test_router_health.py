"""The router in every verdict: its own verdict from one visit (its workers and a request through
it), its row and exit code, its Prometheus metrics, and the one line per host `health` says."""

from __future__ import annotations

import io

from sglang_fleet.node.router.api import router_verdict
from sglang_fleet.router.rejoin import ready_to_add, unseen_servers
from sglang_fleet.runs.metrics import prometheus_text
from sglang_fleet.runs.outcomes import host_outcomes
from sglang_fleet.runs.progress import Progress
from sglang_fleet.runs.summary import EXIT_HOSTS_FAILED, EXIT_OK, exit_code, judge_readiness

ROUTER = {"name": "r1", "url": "http://10.0.0.5:30000", "version": "0.3.2",
          "policy": "cache_aware"}
ANSWER = {"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 1}}
HEALTH = "/repo/playbooks/health.yml"
ROUTER_HEALTH = "/repo/roles/sglang_router/tasks/health.yml"


def seen(workers=(), status=200, error=None, workers_error=None):
    return {"workers": [{"url": u, "is_healthy": h} for u, h in workers],
            "workers_error": workers_error, "status": status,
            "answer": ANSWER if status == 200 else None, "error": error}


def test_a_router_that_serves_a_healthy_worker_is_ready():
    v = router_verdict(ROUTER, seen([("http://a:1", True), ("http://b:1", False)]))
    assert v["verdict"] == "ready"
    assert v["headline"] == "ready: 1 of 2 workers healthy; one request answered through it"
    assert v["router"] == {"registered": 2, "healthy": 1} and not v["advice"]


def test_a_router_that_does_not_answer_is_absent_and_says_how_to_start_it():
    v = router_verdict(ROUTER, seen(status=None, error="[Errno 111] Connection refused",
                                    workers_error="[Errno 111] Connection refused"))
    assert v["verdict"] == "absent"
    assert "nothing answers at http://10.0.0.5:30000" in v["reason"]
    assert "no client reaches the fleet" in v["reason"]
    assert "ansible-playbook deploy.yml --limit r1" in v["advice"]


def test_a_router_with_no_healthy_worker_or_a_failed_request_is_unhealthy():
    empty = router_verdict(ROUTER, seen(status=503, error="No available workers"))
    assert empty["verdict"] == "unhealthy"
    assert "lists no healthy worker (0 registered)" in empty["reason"]
    failing = router_verdict(ROUTER, seen([("http://a:1", True)], status=500, error="boom"))
    assert failing["verdict"] == "unhealthy"
    assert failing["reason"].startswith("1 of 1 workers healthy, but a request through it "
                                        "answered 500")


def _events(router_gate):
    server = {"verdict": "ready", "phase": "serving", "headline": "ready: /health answered 200"}
    return [
        {"event": "runner_on_ok", "event_data": {
            "host": "n1", "task_path": "/repo/roles/sglang_server/tasks/observe.yml:5",
            "task_action": "sglang.fleet.sglang_health", "task": "Observe", "res": server}},
        {"event": "runner_on_ok", "event_data": {
            "host": "n1", "task_path": HEALTH + ":40", "task_action": "ansible.builtin.assert",
            "task": "One line per host",
            "res": {"msg": "n1: ready: /health answered 200; router r1: registered, healthy"}}},
        {"event": "runner_on_ok", "event_data": {
            "host": "r1", "task_path": ROUTER_HEALTH + ":8",
            "task_action": "sglang.fleet.sglang_router_probe", "task": "Ask",
            "res": {"gate": router_gate}}},
    ]


def test_a_router_down_fails_health_and_has_its_own_row_and_metrics():
    down = router_verdict(ROUTER, seen(status=None, error="refused", workers_error="refused"))
    events = _events(down)
    stats = {"ok": {"n1": 3, "r1": 1}, "failures": {"r1": 1}}
    outcomes = host_outcomes(events, stats)
    judge_readiness(outcomes)
    assert outcomes["r1"].verdict_name == "absent" and outcomes["r1"].status == "failed"
    assert exit_code(2, outcomes) == EXIT_HOSTS_FAILED
    text = prometheus_text(outcomes, 1.0, 1, {})
    assert 'sglang_fleet_router_ready{router="r1"} 0' in text
    assert 'sglang_fleet_router_verdict{router="r1",verdict="absent"} 1' in text
    assert 'sglang_fleet_router_workers{router="r1",state="healthy"} 0' in text
    assert 'host="r1"' not in text, "a router is not counted as a server"
    up = host_outcomes(_events(router_verdict(ROUTER, seen([("http://n1:1", True)]))),
                       {"ok": {"n1": 3, "r1": 2}})
    judge_readiness(up)
    assert exit_code(0, up) == EXIT_OK
    assert 'sglang_fleet_router_ready{router="r1"} 1' in prometheus_text(up, 1.0, 1, {})


def test_health_says_one_line_per_host():
    out = io.StringIO()
    progress = Progress(stream=out, tty=False, final_only=True)
    spec = {"event": "runner_on_ok", "event_data": {
        "host": "n1", "task_path": "/repo/roles/sglang_server/tasks/spec.yml:5",
        "task_action": "ansible.builtin.set_fact", "task": "Build the LaunchSpec", "res": {}}}
    for event in [{"event": "playbook_on_play_start", "event_data": {"play": "p"}}, spec,
                  *_events(router_verdict(ROUTER, seen([("http://n1:1", True)]))),
                  {"event": "playbook_on_stats", "event_data": {}}]:
        progress(event)
    assert out.getvalue().splitlines() == [
        "[n1] ready: /health answered 200; router r1: registered, healthy",
        "HEALTH [r1] ready: 1 of 1 workers healthy; one request answered through it"]


def test_a_router_restarted_alone_finds_the_servers_this_run_did_not_deploy():
    groups = {"sglang_routers": ["r1"], "sglang_servers": ["n1", "n2"]}
    groups = {**groups, "sglang_servers": ["n1", "n2", "n3"]}
    hostvars = {"r1": {}, "n1": {"sglang_server_port": 30001, "ansible_host": "10.0.0.11",
                                 "sglang_server_host": "0.0.0.0",
                                 "sglang_server_api_key": "sk" + "7f3a9c2e41b8d056" * 2},
                "n2": {"sglang_server_port": 30002, "sglang_server_verdict": {"verdict": "ready"}},
                "n3": {"sglang_server_port": 30003, "sglang_server_host": "0.0.0.0"}}
    found = unseen_servers("r1", groups, hostvars)
    assert [(s["name"], s.get("url"), s.get("worker_type")) for s in found] == [
        ("n1", "http://10.0.0.11:30001", "regular"), ("n3", None, None)], \
        "n2 was observed by this run"
    assert found[0]["spec"]["http"]["port"] == 30001
    assert found[1]["spec"] is None and "sglang_server_api_key" in found[1]["refused"]


def test_a_router_killed_mid_roll_is_named_not_one_or_more_items_failed():
    said = ("router sim-router stopped answering while http://127.0.0.1:40001 left it "
            "([Errno 111] Connection refused): no client reaches the fleet through it. Fix: "
            "start it again with ansible-playbook deploy.yml --limit sim-router (it adds back "
            "every ready server), then re-run this deploy")
    failed = {"event": "runner_on_failed", "event_data": {
        "host": "n1", "task_path": "/repo/roles/sglang_router/tasks/membership.yml:30",
        "task_action": "sglang.fleet.sglang_router_member",
        "task": "Apply the server's membership in each router",
        "res": {"msg": "One or more items failed", "failed": True, "changed": False,
                "results": [{"failed": True, "msg": said, "item": {"name": "sim-router"}}]}}}
    outcome = host_outcomes([failed], {"failures": {"n1": 1}})["n1"]
    assert outcome.message == said and outcome.stages["deploy"] == said
    out = io.StringIO()
    Progress(stream=out, tty=False)(failed)
    assert "router sim-router stopped answering" in out.getvalue()
    assert "One or more items failed" not in out.getvalue()


def test_a_router_deployed_alone_adds_back_a_decode_only_beside_a_ready_prefill():
    def seen(name, side, verdict, deployment="dsv3"):
        return {"item": {"name": name, "worker_type": side, "pd_deployment": deployment},
                "verdict": verdict}
    prefill_down = [seen("p1", "prefill", "crashed"), seen("d1", "decode", "ready"),
                    seen("n1", "regular", "ready")]
    assert [r["item"]["name"] for r in ready_to_add(prefill_down, {})] == ["n1"]
    prefill_up = [seen("p1", "prefill", "ready"), seen("d1", "decode", "ready"),
                  seen("d2", "decode", "ready", deployment="other")]
    assert [r["item"]["name"] for r in ready_to_add(prefill_up, {})] == ["p1", "d1"]
    judged = {"p2": {"sglang_server_verdict": {"verdict": "ready"},
                     "sglang_server_launch_spec": {"pd": {"mode": "prefill",
                                                          "deployment": "other"}}}}
    assert [r["item"]["name"] for r in ready_to_add(prefill_up, judged)] == ["p1", "d1", "d2"]


def test_a_router_stopped_with_its_whole_fleet_is_stopped_and_passes():
    """`stop.yml` of the whole fleet: nothing answers at the router, and every server was
    stopped on purpose, so the router is `stopped` and health passes; a router alone down
    in front of running servers stays `absent` and fails."""
    gone = seen(status=None, error="refused", workers_error="refused")
    stopped = router_verdict(ROUTER, gone, fleet_stopped=True)
    assert stopped["verdict"] == "stopped" and stopped["stopped_by"] == "stop.yml"
    outcomes = host_outcomes(_events(stopped), {"ok": {"n1": 3, "r1": 1}})
    judge_readiness(outcomes)
    assert outcomes["r1"].status == "ok"
    assert router_verdict(ROUTER, gone)["verdict"] == "absent"
