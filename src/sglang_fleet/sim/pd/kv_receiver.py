"""A decode server's side of a PD request's hand-shake, as SGLang 0.5.23 runs it.

The router sends a decode each request with the prefill's `bootstrap_host`, `bootstrap_port`
and a `bootstrap_room`. Before the decode can take the request's KV cache it needs the
prefill's parallel layout, which it asks the prefill's bootstrap server for once per address
(sglang/srt/disaggregation/common/conn.py CommonKVManager.try_ensure_parallel_info, GET
/route with every rank -1) and then keeps (`prefill_info_table`). A failed attempt is logged
and retried once a second (sglang/srt/disaggregation/decode.py DecodePreallocQueue
_ensure_prefill_info: `_ensure_retry_interval` 1.0 s, `_max_ensure_retries` 15); after the
fifteenth, every request waiting on that address is aborted (the receiver's abort records
"Aborted by AbortReq.") and the handshake poll reports each one
(_update_handshake_waiters), which the client sees as a 500 with that text.

Once the prefill is known the request waits for its KV cache (KVPoll.WaitingForInput). The
cache travels by the transfer backend (RDMA) and its completion by a ZMQ status message, neither
of which the simulator has: the decode asks the prefill's HTTP server (its port is
`prefill_http_port` in the prefill's /route answer) at the simulator-only KV_SENT_PATH whether
the prefill has computed that request's prefill. Real servers have no such endpoint and the
toolkit never calls it; like the real transfer, it does not go through the bootstrap server.
The wait fails as 0.5.23 fails it (decode.py DecodeTransferQueue.pop_transferred: "Decode
transfer failed for request ... with exception KVTransferError(...)", a 500):
- after SGLANG_DISAGGREGATION_WAITING_TIMEOUT seconds (300) without it (conn.py
  CommonKVReceiver._check_waiting_timeout), with a warning logged once;
- when the decode's heartbeat loses the prefill (conn.py _start_heartbeat_checker_thread: GET
  the bootstrap server's /health every max(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, 2) s, 5 by
  default; after max(SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE, 1) misses, 2 by default,
  _handle_node_failure fails the requests waiting on it and forgets the prefill, so that the
  next request looks it up again).

The warm-up's own requests name the fake bootstrap host and take the fake transfer
(decode.py _is_fake_transfer): no look-up. Every TP rank's scheduler runs this loop and logs
its own lines; the simulator logs rank 0's.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from sglang_fleet.sim.engine.runtime import log
from sglang_fleet.sim.pd.bootstrap import FAKE_BOOTSTRAP_HOST, ROUTE_KEYS

MAX_ENSURE_RETRIES = 15  # decode.py DecodePreallocQueue._max_ensure_retries
ENSURE_RETRY_INTERVAL_S = 1.0  # decode.py DecodePreallocQueue._ensure_retry_interval
ROUTE_TIMEOUT_S = 5  # conn.py try_ensure_parallel_info: requests.get(url, timeout=5)
ABORTED = "Aborted by AbortReq."  # conn.py CommonKVReceiver.abort's failure record
# environ.py: SGLANG_DISAGGREGATION_WAITING_TIMEOUT (EnvInt 300),
# SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL (EnvFloat 5.0), _HEARTBEAT_MAX_FAILURE (EnvInt 2).
WAITING_TIMEOUT_VAR = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"
HEARTBEAT_INTERVAL_VAR = "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"
HEARTBEAT_MAX_FAILURE_VAR = "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"
# conn.py _check_waiting_timeout's logger.warning_once.
WAITING_TIMEOUT_WARNING = (
    "Some requests fail to receive KV Cache transfer done signal after bootstrapping. "
    "If a greater mean TTFT is acceptable, you can 'export "
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax the timeout condition. ")
KV_POLL_S = 0.05  # how often a waiting request asks whether its KV cache arrived
KV_SENT_PATH = "/sim/kv_sent"  # the simulator's stand-in for the transfer's completion


class KVTransferAborted(Exception):
    """The request was aborted by the decode's scheduler: prepare_abort(req, message,
    status_code=HTTPStatus.INTERNAL_SERVER_ERROR)."""

    status = 500


def route_info_url(addr: str) -> str:
    """try_ensure_parallel_info's URL: the whole prefill's info (every rank -1)."""
    return f"http://{addr}/route?" + "&".join(f"{key}={-1}" for key in ROUTE_KEYS)


def bootstrap_addr(host: str, port: Any) -> str:
    """decode.py _bootstrap_addr: NetworkAddress(host, port).to_host_port_str()."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def fetch_error_line(error: BaseException) -> str:
    return f"Error fetching prefill server info from bootstrap: {error}"


def fetch_status_line(status: int, text: str) -> str:
    return f"Failed to get prefill server info: {status}, {text}"


def gave_up_line(addr: str, count: int) -> str:
    return f"Could not fetch prefill parallel info from {addr} after {count} attempts"


def kv_failure_line(stage: str, req: str, rank: int, rid: str, room: Any, reason: str) -> str:
    """A scheduler's line for a request whose KV hand-shake or transfer failed (decode.py
    _update_handshake_waiters and DecodeTransferQueue.pop_transferred, prefill.py
    handle_bootstrap_failure): the f-string's `{req.rid=}` and `{req.bootstrap_room=}` forms
    (`req` is the expression the release names), then KVTransferError's own str (conn.py)."""
    return (f"{stage} failed for request rank={rank} {req}.rid={rid!r} "
            f"{req}.bootstrap_room={room!r} with exception "
            f"KVTransferError(bootstrap_room={room}): {reason}")


def handshake_failed_line(rank: int, rid: str, room: int, reason: str) -> str:
    return kv_failure_line("Decode handshake", "decode_req.req", rank, rid, room, reason)


def transfer_failed_line(rank: int, rid: str, room: int, reason: str) -> str:
    return kv_failure_line("Decode transfer", "decode_req.req", rank, rid, room, reason)


def waiting_timeout_reason(room: Any, elapsed: float) -> str:
    return f"Request {room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput"


def lost_reason(addr: str) -> str:
    return f"Lost connection with prefill instance (bootstrap_addr: {addr})"


def lost_line(addr: str, affected: int) -> str:
    return f"{lost_reason(addr)}, {affected} requests affected"


def reconnect_line(addr: str) -> str:
    return f"Attempting to reconnect to {addr}..."


def _env_number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


@dataclass
class _Round:
    """One address's attempts; requests that arrive meanwhile wait on its outcome, as the
    pending queue's requests of one address share their attempts."""

    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


class PrefillInfoTable:
    """The decode's prefill_info_table and its retry loop, for one server."""

    def __init__(self, log_prefix: str, retry_interval: float = ENSURE_RETRY_INTERVAL_S):
        self.log_prefix = log_prefix
        self.retry_interval = retry_interval
        self.known: set[str] = set()
        self.http_of: dict[str, str] = {}  # bootstrap address -> the prefill's HTTP host:port
        self.rounds: dict[str, _Round] = {}
        self.lock = threading.Lock()
        self.waiting_timeout = _env_number(WAITING_TIMEOUT_VAR, 300)
        self.heartbeat_interval = max(_env_number(HEARTBEAT_INTERVAL_VAR, 5.0), 2.0)
        self.max_failures = max(int(_env_number(HEARTBEAT_MAX_FAILURE_VAR, 2)), 1)
        self.heartbeat_failures: dict[str, int] = {}
        self.waiting: dict[str, set[str]] = {}  # addr_to_rooms_tracker: rooms still waiting
        self.failures: dict[str, str] = {}  # failure_records: room -> reason
        self.warned_timeout = False
        self.session = requests.Session()
        self.heartbeat: threading.Thread | None = None  # started with the first prefill known
        self.closed = threading.Event()

    def ensure(self, addr: str) -> bool:
        """Whether the prefill at `addr` is known, asking it (once for all waiters) if not."""
        with self.lock:
            if addr in self.known:
                return True
            round_ = self.rounds.get(addr)
            owner = round_ is None
            if owner:
                round_ = self.rounds[addr] = _Round()
        assert round_ is not None
        if not owner:
            round_.done.wait()
            return round_.ok
        round_.ok = self._attempts(addr)
        with self.lock:
            self.rounds.pop(addr, None)
            if round_.ok:
                self.known.add(addr)
                if self.heartbeat is None:
                    self.heartbeat = threading.Thread(target=self._heartbeat, daemon=True,
                                                      name="HeartbeatChecker")
                    self.heartbeat.start()
        round_.done.set()
        return round_.ok

    def _attempts(self, addr: str) -> bool:
        for count in range(1, MAX_ENSURE_RETRIES + 1):
            if self._fetch(addr):
                return True
            if count < MAX_ENSURE_RETRIES:
                time.sleep(self.retry_interval)
        log(gave_up_line(addr, MAX_ENSURE_RETRIES), self.log_prefix)
        return False

    def _fetch(self, addr: str) -> bool:
        try:
            response = requests.get(route_info_url(addr), timeout=ROUTE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - conn.py catches every error and logs it
            log(fetch_error_line(exc), self.log_prefix)
            return False
        if response.status_code != 200:
            log(fetch_status_line(response.status_code, response.text), self.log_prefix)
            return False
        try:
            http_port = response.json().get("prefill_http_port")
        except (ValueError, AttributeError):
            http_port = None  # not the prefill's info: its transfers cannot be asked after
        with self.lock:
            self.http_of[addr] = f"{addr.rsplit(':', 1)[0]}:{http_port}"
        return True

    def wait_for_kv(self, addr: str, room: Any) -> str:
        """Wait until the prefill at `addr` has sent room's KV cache; '' then, else why not."""
        key = str(room)
        with self.lock:
            self.waiting.setdefault(addr, set()).add(key)
        start = time.monotonic()
        try:
            while True:
                with self.lock:
                    failure = self.failures.pop(key, None)
                if failure:
                    return failure
                if self._kv_sent(self.http_of.get(addr, addr), key):
                    return ""
                elapsed = time.monotonic() - start
                if elapsed >= self.waiting_timeout:
                    if not self.warned_timeout:
                        self.warned_timeout = True
                        log(WAITING_TIMEOUT_WARNING, self.log_prefix)
                    return waiting_timeout_reason(room, elapsed)
                time.sleep(KV_POLL_S)
        finally:
            with self.lock:
                self.waiting.get(addr, set()).discard(key)

    @staticmethod
    def _kv_sent(http_addr: str, room: str) -> bool:
        try:
            reply = requests.get(f"http://{http_addr}{KV_SENT_PATH}", params={"room": room},
                                 timeout=2)
            return reply.status_code == 200 and bool(reply.json().get("sent"))
        except (requests.RequestException, ValueError):
            return False  # the heartbeat, not this poll, decides that a prefill is gone

    def close(self) -> None:
        """End the heartbeat: a server's table lives as long as its process, a test's table
        only as long as its test (its heartbeat would log into the next one)."""
        self.closed.set()
        if self.heartbeat is not None:
            self.heartbeat.join(timeout=10)

    def _heartbeat(self) -> None:
        while not self.closed.wait(self.heartbeat_interval):
            with self.lock:
                addresses = sorted(self.known)
            for addr in addresses:
                try:
                    healthy = self.session.get(f"http://{addr}/health",
                                               timeout=(2, 3)).status_code == 200
                except requests.RequestException:
                    healthy = False
                if healthy:
                    self.heartbeat_failures[addr] = 0
                    continue
                log(reconnect_line(addr), self.log_prefix)
                self.heartbeat_failures[addr] = self.heartbeat_failures.get(addr, 0) + 1
                if self.heartbeat_failures[addr] >= self.max_failures:
                    self._node_failure(addr)

    def _node_failure(self, addr: str) -> None:
        """_handle_node_failure: forget the prefill, fail the requests waiting on it."""
        with self.lock:
            self.known.discard(addr)
            self.heartbeat_failures.pop(addr, None)
            rooms = sorted(self.waiting.pop(addr, set()))
            for room in rooms:
                self.failures[room] = lost_reason(addr)
        log(lost_line(addr, len(rooms)), self.log_prefix)


def rooms_of(body: dict[str, Any], count: int) -> list[Any]:
    """The request's bootstrap_room for each of its `count` prompts (a batch names a list)."""
    room = body.get("bootstrap_room")
    return list(room) if isinstance(room, list) else [room] * count


def hand_shake(table: PrefillInfoTable, body: dict[str, Any], rids: list[str]) -> None:
    """What the decode does before it can decode a PD request: look the prefill up, then wait
    for the request's KV cache; raises KVTransferAborted with the handshake's or the transfer's
    message when either fails. A request without bootstrap fields, or with the warm-up's fake
    host, needs neither."""
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if isinstance(host, list):
        host, port = host[0], port[0] if isinstance(port, list) else port
    if not host or host == FAKE_BOOTSTRAP_HOST or port is None:
        return
    addr = bootstrap_addr(str(host), port)
    rooms = rooms_of(body, len(rids))
    if not table.ensure(addr):
        _abort(table, [handshake_failed_line(0, rid, room, ABORTED)
                       for rid, room in zip(rids, rooms, strict=True)])
    failed = []
    for rid, room in zip(rids, rooms, strict=True):
        reason = table.wait_for_kv(addr, room) if room is not None else ""
        if reason:
            failed.append(transfer_failed_line(0, rid, room, reason))
    if failed:
        _abort(table, failed)


def _abort(table: PrefillInfoTable, messages: list[str]) -> None:
    for message in messages:
        log(message, table.log_prefix)
    raise KVTransferAborted(messages[0])
