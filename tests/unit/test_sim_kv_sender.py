"""The simulated prefill's side of a PD request: it holds a request until a decode bootstraps
its room, and fails the request, with the release's words, once the bootstrap timeout passes."""

from __future__ import annotations

import threading
import time

from sglang_fleet.sim.pd import kv_sender
from sglang_fleet.sim.pd.bootstrap import FAKE_BOOTSTRAP_HOST


def test_a_request_waits_until_a_decode_bootstraps_its_room():
    sender = kv_sender.KVSender()
    threading.Timer(0.3, sender.asked, args=("7",)).start()
    started = time.monotonic()
    assert sender.wait_bootstrapped([7], print) == [""]
    assert 0.25 <= time.monotonic() - started < 5


def test_a_room_a_decode_asks_after_before_the_prefill_has_it_is_bootstrapped_already():
    sender = kv_sender.KVSender()
    assert sender.asked("9") is False  # not sent yet
    assert sender.wait_bootstrapped([9], print) == [""]
    sender.mark_sent([9])
    assert sender.asked("9") is True


def test_rooms_no_decode_takes_fail_at_the_bootstrap_timeout_warning_once():
    sender = kv_sender.KVSender()
    sender.bootstrap_timeout = 0.2
    sender.asked("1")
    logged: list[str] = []
    reasons = sender.wait_bootstrapped([1, 2], logged.append)
    assert reasons[0] == ""
    assert reasons[1].startswith("Request 2 timed out after 0.") and \
        reasons[1].endswith("s in KVPoll.Bootstrapping")
    assert sender.wait_bootstrapped([3], logged.append)[0].startswith("Request 3 timed out")
    assert logged == [kv_sender.BOOTSTRAP_TIMEOUT_WARNING]  # warned once


def test_the_timeout_comes_from_the_releases_variable(monkeypatch):
    monkeypatch.setenv(kv_sender.BOOTSTRAP_TIMEOUT_VAR, "12")
    assert kv_sender.KVSender().bootstrap_timeout == 12
    monkeypatch.delenv(kv_sender.BOOTSTRAP_TIMEOUT_VAR)
    assert kv_sender.KVSender().bootstrap_timeout == 300


def test_only_a_request_a_decode_takes_over_waits():
    pd = {"bootstrap_host": "10.0.0.5", "bootstrap_port": 8998, "bootstrap_room": 5}
    assert kv_sender.takes_transfer(pd)
    assert kv_sender.takes_transfer({**pd, "bootstrap_host": ["10.0.0.5"],
                                     "bootstrap_room": [5]})
    assert not kv_sender.takes_transfer({**pd, "bootstrap_host": FAKE_BOOTSTRAP_HOST})
    assert not kv_sender.takes_transfer({"text": "hello"})
    assert not kv_sender.takes_transfer({**pd, "bootstrap_room": None})


def test_a_room_whose_decode_heard_it_was_sent_is_forgotten_within_a_bound(monkeypatch):
    monkeypatch.setattr(kv_sender.KVSender, "DONE_KEPT", 3)
    sender = kv_sender.KVSender()
    for room in ("1", "2", "3", "4"):
        assert sender.asked(room) is False  # bootstrapped
        sender.mark_sent([int(room)])
        assert sender.asked(room) is True
        assert room not in sender.bootstrapped and room not in sender.sent
    # A decode whose answer was lost asks again and still hears it; the oldest is forgotten.
    assert sender.asked("4") is True and list(sender.done) == ["2", "3", "4"]
