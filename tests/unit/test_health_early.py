"""The node check's first request: /health asked from the module's options as they arrive,
before the rest of the module loads, so that SGLang's one-second answer overlaps that work."""

from __future__ import annotations

import http.server
import time

import pytest

from sglang_fleet.node.common.http import HEALTH_GRACE_S, ask_health_early
from sglang_fleet.testfleet.local import loopback_http_server


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200
    delay = 0.0
    asked: list[float] = []

    def do_GET(self):  # noqa: N802 - stdlib name
        type(self).asked.append(time.monotonic())
        time.sleep(self.delay)
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    _Health.asked, _Health.status, _Health.delay = [], 200, 0.0
    with loopback_http_server(_Health) as url:
        yield int(url.rsplit(":", 1)[1])


def raw(port, **gate):
    return {"host_name": "n1", "gate": {"host": "127.0.0.1", "port": port,
                                        "health_timeout": 20, "serves_http": True, **gate}}


def test_a_server_answering_200_is_asked_at_once_and_the_answer_kept(health_server):
    _Health.delay = 0.3  # SGLang's answer comes a second later; this one 0.3 s
    started = time.monotonic()
    asked = ask_health_early(raw(health_server))
    assert asked is not None
    # The request is under way before the caller does anything else.
    while not _Health.asked:
        assert time.monotonic() - started < 5, "the request never reached the server"
        time.sleep(0.01)
    assert asked.answered() is True
    assert len(_Health.asked) == 1


@pytest.mark.parametrize("status", [503, 500])
def test_any_other_answer_is_not_taken_as_health(health_server, status):
    _Health.status = status
    assert ask_health_early(raw(health_server)).answered() is False


def test_a_slow_answer_is_waited_for_no_longer_than_the_gate_waits_between_observations(
        health_server):
    # A server that takes longer than the grace is left to the observation's own request.
    _Health.delay = HEALTH_GRACE_S + 1.0
    started = time.monotonic()
    assert ask_health_early(raw(health_server, health_timeout=60)).answered() is False
    assert time.monotonic() - started < HEALTH_GRACE_S + 0.9


@pytest.mark.parametrize("params", [
    {},
    {"gate": None},
    {"gate": {"host": "127.0.0.1", "port": "not a port"}},
    {"gate": {"host": "127.0.0.1"}},
    {"gate": {"host": "127.0.0.1", "port": 1, "serves_http": False}},
    {"gate": {"host": "127.0.0.1", "port": 1}, "_ansible_check_mode": True},
], ids=["no gate", "gate none", "bad port", "no port", "not serving http", "check mode"])
def test_nothing_is_asked_without_a_server_that_serves_http(params):
    assert ask_health_early(params) is None
