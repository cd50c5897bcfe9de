"""The gate's watch on the node, on a fake clock: how soon a ready server is judged ready, and
when an observation returns so that the progress lines keep flowing."""

from __future__ import annotations

import pytest

from sglang_fleet.node.health import gate

WINDOWS = {p: 30.0 for p in ("launching", "loading_weights", "allocating_kv_cache",
                             "capturing_cuda_graph", "starting_http", "warming_up")}
CEILINGS = {p: 1000.0 for p in WINDOWS}
T0 = 1_000_000.0


class Server:
    """A scripted SGLang start on a fake clock: `phases` is [(from_t, phase, port_open)], Up at
    `up_at`. /health answers as 0.5.23's does: 503 at once while starting, 200 one second
    after a request made once the server is Up."""

    def __init__(self, phases, up_at=None, observe_cost=0.05):
        self.phases, self.up_at, self.observe_cost = phases, up_at, observe_cost
        self.now = T0
        self.health_asked: list[float] = []

    # the time module's calls the gate makes
    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def state(self):
        current = self.phases[0]
        for entry in self.phases:
            if self.now - T0 >= entry[0]:
                current = entry
        return current[1], current[2]

    def http_status(self, url: str, timeout: float):
        assert url.endswith("/health")
        self.health_asked.append(self.now - T0)
        if self.up_at is not None and self.now - T0 >= self.up_at:
            if timeout < 1.0:
                self.now += timeout
                return None
            self.now += 1.0
            return 200
        self.now += 0.005
        return 503

    def observe(self, p, health_answered=False, stack_state=None):
        self.now += self.observe_cost
        phase, port = self.state()
        health = 200 if health_answered else (self.http_status("x/health", 25) if port
                                              else None)
        return {
            "run_id": T0, "started": True, "started_at": T0,
            "processes": [{"pid": 10, "state": "S", "cmdline": "sglang::scheduler_TP0",
                           "utime_ticks": 0, "stime_ticks": 0, "rchar": 0, "syscw": 0}],
            "main_alive": True, "serves_http": True, "port_open": port, "health": health,
            "gpu_memory_used": 0, "xids": [], "exit_status": None,
            "last_log_activity": self.now, "phase_started_at": None,
            "log": {"phase": phase, "shards": None, "capture": None, "failures": [],
                    "progress_ticks": 0, "meaningful_lines": 5, "error_lines": [],
                    "last_lines": ["..."]},
        }


@pytest.fixture
def server(monkeypatch):
    def make(phases, up_at=None):
        fake = Server(phases, up_at)
        monkeypatch.setattr(gate, "time", fake)
        monkeypatch.setattr(gate, "observe", fake.observe)
        monkeypatch.setattr(gate, "http_status", fake.http_status)
        return fake
    return make


def params(wait=10.0, poll=1.0):
    return {"host": "127.0.0.1", "port": 30000, "health_timeout": 25.0, "wait": wait,
            "poll": poll, "serves_http": True}


def test_a_server_that_turns_up_is_ready_a_second_later_in_the_same_call(server):
    # Warming up with the port open from the start; Up at 3.0 s.
    fake = server([(0, "warming_up", True)], up_at=3.0)
    obs, verdict, _ = gate.watch(params(), None, WINDOWS, CEILINGS)
    assert verdict["verdict"] == "ready"
    # /health is asked every 0.2 s, observations included: the first request after Up starts
    # within 0.2 s of it, and its 200 (a second later) is the verdict.
    ready_after_up = fake.now - T0 - 3.0
    assert 1.0 <= ready_after_up <= 1.26
    asked = fake.health_asked
    gaps = [b - a for a, b in zip(asked, asked[1:], strict=False) if b < 3.0]
    assert gaps and max(gaps) <= 0.26


def test_a_phase_change_before_the_port_opens_returns_at_once(server):
    fake = server([(0, "loading_weights", False), (2.5, "capturing_cuda_graph", False)])
    _, verdict, _ = gate.watch(params(), None, WINDOWS, CEILINGS)
    assert verdict["verdict"] == "progressing" and verdict["phase"] == "capturing_cuda_graph"
    assert fake.now - T0 < 2.5 + 1.0 + 0.1, "one poll after the change"


def test_a_change_into_warm_up_waits_for_health_before_returning(server):
    # The change to warming_up is seen at about 2 s; the server is Up 0.5 s later: the call
    # answers ready instead of returning the change and judging it a module run later.
    fake = server([(0, "starting_http", True), (2.0, "warming_up", True)], up_at=2.5)
    _, verdict, _ = gate.watch(params(), None, WINDOWS, CEILINGS)
    assert verdict["verdict"] == "ready"
    assert fake.now - T0 < 2.5 + 1.0 + 0.3


def test_a_change_with_the_port_open_is_reported_within_the_grace_when_not_up(server):
    fake = server([(0, "starting_http", True), (2.0, "warming_up", True)])
    _, verdict, _ = gate.watch(params(), None, WINDOWS, CEILINGS)
    assert verdict["verdict"] == "progressing" and verdict["phase"] == "warming_up"
    # Seen by the next observation (1 s apart at most), reported 2 s later.
    assert 2.0 + 2.0 - 0.3 <= fake.now - T0 <= 2.0 + 1.0 + 2.0 + 0.3


def test_the_wait_bounds_the_call_and_no_wait_is_one_observation(server):
    fake = server([(0, "warming_up", True)])
    _, verdict, _ = gate.watch(params(wait=4.0), None, WINDOWS, CEILINGS)
    assert verdict["verdict"] == "progressing" and 3.7 <= fake.now - T0 <= 4.4
    fake = server([(0, "warming_up", True)])
    gate.watch(params(wait=0), None, WINDOWS, CEILINGS)
    assert len(fake.health_asked) == 1, "one observation, which asked /health once"


def test_a_200_asked_before_the_call_is_not_asked_again(server):
    # The node check asks /health as its module starts; the first observation uses that 200
    # and a ready server is judged ready without a second request (a second more).
    fake = server([(0, "warming_up", True)], up_at=0.0)
    _, verdict, _ = gate.watch(params(wait=0), None, WINDOWS, CEILINGS, health_answered=True)
    assert verdict["verdict"] == "ready"
    assert fake.health_asked == []
    assert fake.now - T0 < 0.1
