"""A prefill server's side of a PD request's hand-shake, as SGLang 0.5.23 runs it.

A prefill puts each request that names a bootstrap room in its bootstrap queue
(KVPoll.Bootstrapping) until the decode the router paired it with has taken the request and
sent the KV indices it preallocated; only then does it run the prefill and send the cache
(disaggregation/prefill.py PrefillBootstrapQueue, common/conn.py CommonKVSender). The simulator
has neither the ZMQ message that carries the indices nor the RDMA transfer: a decode's first
ask at the simulator-only kv_receiver.KV_SENT_PATH for a room stands for its indices arriving,
and the answer `sent` for the transfer's completion.

A request whose decode never comes fails as 0.5.23 fails it: after
SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT seconds (300) in KVPoll.Bootstrapping (conn.py
_check_bootstrap_timeout: its warning logged once, the failure recorded as "Request N timed out
after Xs in KVPoll.Bootstrapping"), prefill.py handle_bootstrap_failure logs "Prefill bootstrap
failed for request rank=0 ..." and aborts the request with a 500 and that message.

A bootstrapped request runs its prefill and finishes after its first token, as a prefill
server's requests do (prefill.py process_disagg_prefill_inflight_queue: FINISH_LENGTH(length=0)):
the router reads the prefill's answer and returns the decode's. The warm-up's own requests name
the fake bootstrap host (bootstrap.FAKE_BOOTSTRAP_HOST) and take the fake transfer: no wait.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any

from sglang_fleet.sim.pd.bootstrap import FAKE_BOOTSTRAP_HOST
from sglang_fleet.sim.pd.kv_receiver import kv_failure_line

# environ.py SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (EnvInt 300).
BOOTSTRAP_TIMEOUT_VAR = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
# conn.py _check_bootstrap_timeout's logger.warning_once.
BOOTSTRAP_TIMEOUT_WARNING = (
    "Some requests timed out when bootstrapping, which means prefill instances fail to "
    "receive the KV indices from the decode instance of this request. If a greater mean TTFT "
    "is acceptable, you can 'export SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=600' (10 minutes) "
    "to relax the timeout condition. ")
# prefill.py process_disagg_prefill_inflight_queue: FINISH_LENGTH(length=0).to_json().
PREFILL_FINISH = {"type": "length", "length": 0}


def bootstrap_timeout_reason(room: Any, elapsed: float) -> str:
    return f"Request {room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping"


def bootstrap_failed_line(rank: int, rid: str, room: Any, reason: str) -> str:
    """prefill.py handle_bootstrap_failure's message."""
    return kv_failure_line("Prefill bootstrap", "req", rank, rid, room, reason)


def takes_transfer(body: dict[str, Any]) -> bool:
    """A PD request a decode takes over (not the warm-up's fake transfer, not a plain
    request)."""
    host = body.get("bootstrap_host")
    host = host[0] if isinstance(host, list) and host else host
    return bool(host) and host != FAKE_BOOTSTRAP_HOST and body.get("bootstrap_room") is not None


class KVSender:
    """The prefill's rooms: those a decode has bootstrapped, and those whose cache it sent."""

    # Rooms whose decode was told the cache is sent, kept so that a decode whose answer was
    # lost and asks again still hears it; older ones are forgotten (a room names one
    # request), so that a long run's memory stays bounded.
    DONE_KEPT = 4096

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.bootstrapped: set[str] = set()
        self.sent: set[str] = set()
        self.done: OrderedDict[str, None] = OrderedDict()
        self.bootstrap_timeout = float(os.environ.get(BOOTSTRAP_TIMEOUT_VAR) or 300)
        self.warned_timeout = False

    def asked(self, room: str) -> bool:
        """A decode asks after `room`: from now on it is bootstrapped. True once sent; the
        room is then done, and leaves both sets."""
        with self.changed:
            if room in self.done:
                return True
            if room in self.sent:
                self.sent.discard(room)
                self.bootstrapped.discard(room)
                self.done[room] = None
                while len(self.done) > self.DONE_KEPT:
                    self.done.popitem(last=False)
                return True
            if room not in self.bootstrapped:
                self.bootstrapped.add(room)
                self.changed.notify_all()
            return False

    def mark_sent(self, rooms: list[Any]) -> None:
        with self.changed:
            self.sent.update(str(room) for room in rooms if room is not None)

    def wait_bootstrapped(self, rooms: list[Any], log_line) -> list[str]:
        """Wait until a decode has bootstrapped every room; for each room, '' or why it failed
        (not bootstrapped within the bootstrap timeout)."""
        start = time.monotonic()
        deadline = start + self.bootstrap_timeout
        with self.changed:
            late = self._not_bootstrapped(rooms)
            while any(late) and time.monotonic() < deadline:
                self.changed.wait(max(0.0, min(1.0, deadline - time.monotonic())))
                late = self._not_bootstrapped(rooms)
            if any(late) and not self.warned_timeout:
                self.warned_timeout = True
                log_line(BOOTSTRAP_TIMEOUT_WARNING)
        elapsed = time.monotonic() - start
        return [bootstrap_timeout_reason(room, elapsed) if missing else ""
                for room, missing in zip(rooms, late, strict=True)]

    def _not_bootstrapped(self, rooms: list[Any]) -> list[bool]:
        """For each room, whether it still waits for a decode (a request without one never
        does)."""
        return [room is not None and str(room) not in self.bootstrapped for room in rooms]
