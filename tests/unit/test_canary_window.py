"""The canaries' shared window (sglang_fleet.rollout.window.observe) against small local HTTP
servers that count what reaches them as SGLang's /metrics does: several canaries judged at
once probe a shared baseline once, and no probe is counted as live traffic; each job ends at
its own window; a server that does not answer leaves only the jobs that read it unjudged, with
no prober left behind."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang_fleet.rollout.plan import CanaryPlan
from sglang_fleet.rollout.window import Job, Target, observe


class CountingServer(ThreadingHTTPServer):
    """Answers /generate greedily ("ok") and counts each request in
    sglang:num_requests_total, as SGLang does when a request finishes."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: CountingServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            with self.server.lock:
                n = self.server.requests
            self._send(f'sglang:num_requests_total{{model_name="m"}} {n}\n'.encode(),
                       "text/plain")
        elif self.path == "/server_info":
            self._send(b'{"version": "0.5.23"}', "application/json")
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"text": " ok", "meta_info": {
            "finish_reason": {"type": "length"},
            "output_token_logprobs": [[-0.1, 7, " ok"]],
            "output_top_logprobs": [[[-0.1, 7, " ok"]]]}}).encode()
        with self.server.lock:
            self.server.requests += 1
        self._send(body, "application/json")


@contextmanager
def servers(n: int) -> Iterator[list[CountingServer]]:
    started = [CountingServer() for _ in range(n)]
    for s in started:
        threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield started
    finally:
        for s in started:
            s.shutdown()
            s.server_close()


def target(name: str, server: CountingServer) -> Target:
    return Target(name, server.url, server.url, "0.5.23")


def test_two_canaries_share_one_prober_on_their_baseline_and_count_no_probe_as_live():
    plan = CanaryPlan(window=0.3, min_requests=1)
    with servers(3) as (a, b, base):
        jobs = [Job(plan, target("a", a), (target("base", base),)),
                Job(plan, target("b", b), (target("base", base),))]
        judged = observe(jobs)
        probed, canary_probed = base.requests, a.requests
    assert set(judged) == {"a", "b"}
    # One prober on the shared baseline, as on each canary (two would send it about twice).
    assert 0 < probed <= 1.5 * canary_probed + 2, (probed, canary_probed)
    for name in ("a", "b"):
        # Every request each server got was a probe: no live traffic on either side.
        assert judged[name]["live_requests"] == {"canary": 0.0, "baseline": 0.0}
        assert judged[name]["verdict"] == "inconclusive"
        assert "canary and baseline got fewer than 1 live requests" in judged[name]["message"]


def test_live_requests_beside_the_probes_are_counted_on_the_shared_baseline():
    plan = CanaryPlan(window=0.3, min_requests=1)
    with servers(3) as (a, b, base):
        live = 5

        def sleep(seconds: float) -> None:
            # Live traffic inside the window, beside the probes.
            with base.lock:
                base.requests += live
            threading.Event().wait(seconds)

        jobs = [Job(plan, target("a", a), (target("base", base),)),
                Job(plan, target("b", b), (target("base", base),))]
        judged = observe(jobs, sleep=sleep)
    # The first job's end sees the 5; the second's sleep adds 5 more before its end.
    assert judged["a"]["live_requests"]["baseline"] == live
    assert judged["b"]["live_requests"]["baseline"] == 2 * live


def test_each_job_ends_at_its_own_window():
    short, long = CanaryPlan(window=0.1, min_requests=1), CanaryPlan(window=0.5, min_requests=1)
    with servers(3) as (a, b, base):
        judged = observe([Job(long, target("b", b), (target("base", base),)),
                          Job(short, target("a", a), (target("base", base),))])
    assert judged["a"]["seconds"] < judged["b"]["seconds"]
    assert judged["b"]["seconds"] >= 0.5
    assert judged["a"]["window"] == 0.1 and judged["b"]["window"] == 0.5


def test_a_server_that_does_not_answer_leaves_only_its_job_unjudged_and_no_prober():
    plan = CanaryPlan(window=0.1, min_requests=1)
    with servers(4) as (a, b, base, gone):
        gone.shutdown()
        gone.server_close()
        before = {t.name for t in threading.enumerate()}
        judged = observe([Job(plan, target("a", a), (target("gone", gone),)),
                          Job(plan, target("b", b), (target("base", base),))])
    assert judged["a"] == {"error": f"a: not judged under live traffic: {gone.url}/metrics "
                                    "did not answer: ConnectionError"}, judged["a"]
    assert judged["b"]["verdict"] == "inconclusive"  # judged, beside it
    assert not {t.name for t in threading.enumerate() if t.name.startswith("probe-")} - before
