"""A server that goes quiet partway through a run of requests: the benchmark fails naming the
request that got no answer and how many were answered."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_fleet.node.bench.client import BenchError, run_benchmark


def quiet_after(answers: int, quiet: threading.Event):
    """A stand-in /generate that streams its tokens for `answers` requests, then holds every
    request until `quiet` is set (the test's end)."""

    class Handler(BaseHTTPRequestHandler):
        served = 0

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"{}")
            if self.path == "/generate" and type(self).served >= answers:
                quiet.wait(10)
                return
            self.send_response(200)
            self.end_headers()
            if self.path != "/generate":
                return
            type(self).served += 1
            for n in range(1, body["sampling_params"]["max_new_tokens"] + 1):
                self.wfile.write(b"data: %s\n\n" % json.dumps(
                    {"meta_info": {"completion_tokens": n}}).encode())
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


@pytest.fixture
def quiet_server():
    quiet = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), quiet_after(3, quiet))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    quiet.set()
    server.shutdown()
    server.server_close()


def test_a_server_quiet_after_three_answers_fails_naming_the_fourth(quiet_server):
    with pytest.raises(BenchError) as err:
        run_benchmark("127.0.0.1", quiet_server, 4, 2, warmup=1, repetitions=10,
                      concurrency=[1], timeout=0.3)
    assert str(err.value) == "request 4 of 11 got no answer within 0.3 s (3 answered)"


def test_every_answer_counted_when_none_is_missing(quiet_server):
    result = run_benchmark("127.0.0.1", quiet_server, 4, 2, warmup=1, repetitions=2,
                           concurrency=[1], timeout=0.3)
    assert result["levels"][0]["latency_s"]["n"] == 2
