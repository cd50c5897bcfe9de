"""The router seen from the fleet: in-flight readings, the bounded drain, the router's view beside
the gate's verdict, and what the load generator and sampler count."""

from __future__ import annotations

import json
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from sglang_fleet.bench.loadgen import Request, out_of_rotation, percentile, routed_to, summarize
from sglang_fleet.node.router.api import (
    Router,
    describe_view,
    drain,
    finding,
    mode_refusal,
    report_failure,
    report_line,
    router_active,
    server_mode,
    view_of,
    worker_inflight,
)
from sglang_fleet.testfleet.local import loopback_http_server

# Shapes of the exports: SGLang's scheduler gauges and sglang-router 0.3.2's per-worker gauge.
WORKER_METRICS = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Kimi-K2.5",engine_type="unified",tp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="Kimi-K2.5",engine_type="unified",tp_rank="0"} 2.0
sglang:gen_throughput{model_name="Kimi-K2.5"} 63.6
"""
ROUTER_METRICS = """# TYPE smg_worker_requests_active gauge
smg_worker_requests_active{worker="http://127.0.0.1:30001"} 4
smg_worker_requests_active{worker="http://127.0.0.1:30002"} 0
"""


def test_in_flight_counts_from_the_worker_and_the_router():
    assert worker_inflight(WORKER_METRICS) == 5
    assert worker_inflight("sglang:gen_throughput 1\n") is None
    assert router_active(ROUTER_METRICS, "http://127.0.0.1:30001/") == 4
    assert router_active(ROUTER_METRICS, "http://127.0.0.1:30002") == 0
    assert router_active(ROUTER_METRICS, "http://127.0.0.1:30003") is None


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def reader(values, clock):
    readings = iter(values)

    def read():
        value = next(readings, values[-1])
        return value, ["worker /metrics"] if value is not None else []
    return read


def test_drain_waits_for_two_zero_readings_in_a_row():
    clock = Clock()
    report = drain(reader([3, 1, 0, 2, 0, 0], clock), timeout=30, interval=0.5, clock=clock,
                   sleep=clock.sleep)
    assert report["timed_out"] is False and report["inflight_at_start"] == 3
    assert report["inflight_left"] == 0 and report["readings"] == 6
    assert report["seconds"] == 2.5 and "note" not in report


def test_drain_is_bounded_and_says_so_when_the_bound_is_hit():
    clock = Clock()
    report = drain(reader([4, 4, 3], clock), timeout=5, interval=1, clock=clock,
                   sleep=clock.sleep)
    assert report["timed_out"] is True and report["inflight_left"] == 3
    assert report["seconds"] == 5
    assert "drain timeout of 5s hit with 3 request(s) still running" in report["note"]


def test_drain_without_any_in_flight_signal_waits_out_the_bound():
    clock = Clock()
    report = drain(reader([None], clock), timeout=3, interval=1, clock=clock, sleep=clock.sleep)
    assert report["inflight_left"] is None and report["seconds"] == 3
    assert "no in-flight count available" in report["note"]


def test_an_idle_worker_drains_at_once_and_a_zero_timeout_does_not_wait():
    clock = Clock()
    assert drain(reader([0, 0], clock), 30, 0.5, clock, clock.sleep)["seconds"] == 0.5
    report = drain(reader([2], clock), 0, 0.5, clock, clock.sleep)
    assert report["timed_out"] is False and "no drain" in report["note"]


def test_the_routers_view_beside_the_gates_verdict():
    listed = view_of({"id": "w1", "url": "http://x:1", "is_healthy": True, "load": 2})
    sick = view_of({"id": "w1", "url": "http://x:1", "is_healthy": False, "load": -1})
    absent = view_of(None)
    assert describe_view(listed) == "registered, healthy, load 2"
    assert describe_view(sick) == "registered, unhealthy, load n/a"
    assert describe_view(absent) == "not registered"
    assert finding("ready", listed) is None and finding("stalled", absent) is None
    assert "does not list it" in finding("ready", absent)
    assert "marks it unhealthy" in finding("ready", sick)
    assert finding("crashed", listed).startswith("the gate says crashed but the router still "
                                                 "lists it as healthy")


def test_summaries_count_only_complete_streams():
    ok = [Request(f"r{i}", 100.0, end=100.0 + i / 10, status=200, tokens=8, completed=True)
          for i in range(1, 11)]
    cut = Request("r-cut", 100.0, end=101.0, status=200, tokens=3,
                  error="stream cut after 3 of 8 tokens")
    result = summarize([*ok, cut])
    assert (result["sent"], result["completed"], result["failed"]) == (11, 10, 1)
    assert result["p50_s"] == percentile([r.latency for r in ok], 50)
    assert round(result["p99_s"], 3) == 1.0
    assert [f["rid"] for f in result["failures"]] == ["r-cut"]


def test_out_of_rotation_time_from_the_routers_worker_list():
    a, b = "http://127.0.0.1:1", "http://127.0.0.1:2"
    samples = [(0.0, {a: True, b: True}), (1.0, {b: True}), (2.5, {a: False, b: True}),
               (3.0, {a: True, b: True}), (4.0, {a: True, b: True})]
    assert out_of_rotation(samples, a) == 2.0
    assert out_of_rotation(samples, b) == 0.0


def test_requests_are_traced_to_their_workers_in_the_routers_debug_log():
    # The shape sglang-router 0.3.2 logs at --log-level debug (colour codes included).
    line = ('\x1b[2m2026-11-30 21:27:33\x1b[0m \x1b[34mDEBUG\x1b[0m \x1b[1mhttp_request\x1b[0m'
            '\x1b[1m{\x1b[0mmethod=POST uri=/generate version=HTTP/1.1 module="smg" '
            'request_id="{rid}"\x1b[1m}\x1b[0m: smg::observability::events: '
            '/src/observability/events.rs:58: Sending request url={url}\n')
    log = "".join(line.replace("{rid}", rid).replace("{url}", url) for rid, url in [
        ("a-00001", "http://127.0.0.1:30001"), ("a-00002", "http://127.0.0.1:30002"),
        ("a-00002", "http://127.0.0.1:30001")])
    assert routed_to(log) == {"a-00001": ["http://127.0.0.1:30001"],
                              "a-00002": ["http://127.0.0.1:30002", "http://127.0.0.1:30001"]}
    # In PD mode the router sends each request to a prefill and a decode at once.
    pd = ('2026-12-05 06:21:58 DEBUG http_request{method=POST uri=/generate version=HTTP/1.1 '
          'module="smg" request_id="p-00001"}: smg::observability::events: '
          '/src/observability/events.rs:37: Sending concurrent requests '
          'prefill_url=http://127.0.0.1:22082 decode_url=http://127.0.0.1:22084\n')
    assert routed_to(pd) == {"p-00001": ["http://127.0.0.1:22082", "http://127.0.0.1:22084"]}


def test_the_router_report_says_where_it_serves_and_what_answered():
    router = {"name": "r1", "url": "http://10.0.0.5:30000", "version": "0.3.2",
              "policy": "cache_aware"}
    seen = {"workers": [{"is_healthy": True}, {"is_healthy": False}], "status": 200,
            "error": None, "answer": {"usage": {"completion_tokens": 8}, "choices": [
                {"message": {"content": "  " + "word " * 20 + " "}}]}}
    line = report_line(router, seen)
    assert line.startswith("r1: serving at http://10.0.0.5:30000 (sglang-router 0.3.2, "
                           "policy cache_aware): 2 workers registered, 1 healthy; one request "
                           "answered through it: 8 tokens, \"word word")
    assert line.endswith('word..."') and len(line.split('"')[1]) <= 60
    failed = report_failure(router, dict(seen, status=503, error="no healthy workers",
                                         workers=[]))
    assert "answered 503 to one request (no healthy workers); 0 workers registered" in failed
    assert "Fix: deploy the servers" in failed
    assert "answered nothing" in report_failure(router, dict(seen, status=None, error="x"))


class _Recorder(BaseHTTPRequestHandler):
    """A worker's /server_info and a router's POST /workers, recorded."""

    mode = "prefill"
    posted: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"disaggregation_mode": self.mode, "tp_size": 1}).encode()
        self.send_response(200 if self.path == "/server_info" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        length = int(self.headers["Content-Length"])
        self.posted.append(json.loads(self.rfile.read(length)))
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"status": "accepted"}')

    def log_message(self, *args):
        pass


@contextmanager
def _server(mode):
    handler = type("Handler", (_Recorder,), {"mode": mode, "posted": []})
    with loopback_http_server(handler) as url:
        yield url, handler.posted


def test_a_server_is_registered_only_as_the_side_its_own_server_info_says():
    with _server("decode") as (url, _):
        said = server_mode(url)
        assert said == "decode"
        assert mode_refusal(url, said, "decode") is None
        refusal = mode_refusal(url, said, "prefill")
        assert refusal.startswith(f"{url} says disaggregation_mode=decode in /server_info, "
                                  "and the inventory makes it a prefill")
        assert "not registered" in refusal
        assert "a regular server" in mode_refusal(url, said, "regular")
    with _server("null") as (url, _):
        assert mode_refusal(url, server_mode(url), "regular") is None


def test_prefill_and_decode_servers_join_with_their_side_and_the_prefills_bootstrap_port():
    with _server("null") as (router_url, posted):
        router = Router(router_url)
        router.add("http://10.0.0.1:30000/", "k", "prefill", 8998)
        router.add("http://10.0.0.2:30000", None, "decode", 8998)
        router.add("http://10.0.0.3:30000")
    assert posted == [
        {"url": "http://10.0.0.1:30000", "api_key": "k", "worker_type": "prefill",
         "bootstrap_port": 8998},
        {"url": "http://10.0.0.2:30000", "worker_type": "decode"},
        {"url": "http://10.0.0.3:30000"}]
    assert describe_view(view_of({"id": "w", "is_healthy": True, "load": 0,
                                  "worker_type": "prefill"})) == \
        "registered as prefill, healthy, load 0"
