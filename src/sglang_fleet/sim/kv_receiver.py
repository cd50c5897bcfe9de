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

The warm-up's own requests name the fake bootstrap host and take the fake transfer
(decode.py _is_fake_transfer): no look-up. Every TP rank's scheduler runs this loop and logs
its own lines; the simulator logs rank 0's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from sglang_fleet.sim.bootstrap import FAKE_BOOTSTRAP_HOST, ROUTE_KEYS
from sglang_fleet.sim.runtime import log

MAX_ENSURE_RETRIES = 15  # decode.py DecodePreallocQueue._max_ensure_retries
ENSURE_RETRY_INTERVAL_S = 1.0  # decode.py DecodePreallocQueue._ensure_retry_interval
ROUTE_TIMEOUT_S = 5  # conn.py try_ensure_parallel_info: requests.get(url, timeout=5)
ABORTED = "Aborted by AbortReq."  # conn.py CommonKVReceiver.abort's failure record


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


def handshake_failed_line(rank: int, rid: str, room: int, reason: str) -> str:
    """decode.py _update_handshake_waiters: the f-string's `{decode_req.req.rid=}` forms, then
    KVTransferError's own str (conn.py)."""
    return (f"Decode handshake failed for request rank={rank} decode_req.req.rid={rid!r} "
            f"decode_req.req.bootstrap_room={room!r} with exception "
            f"KVTransferError(bootstrap_room={room}): {reason}")


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
        self.rounds: dict[str, _Round] = {}
        self.lock = threading.Lock()

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
        return True


def rooms_of(body: dict[str, Any], count: int) -> list[Any]:
    """The request's bootstrap_room for each of its `count` prompts (a batch names a list)."""
    room = body.get("bootstrap_room")
    return list(room) if isinstance(room, list) else [room] * count


def hand_shake(table: PrefillInfoTable, body: dict[str, Any], rids: list[str]) -> None:
    """What the decode does before a PD request's KV arrives; raises KVTransferAborted with
    the handshake's message when the prefill cannot be looked up. A request without bootstrap
    fields, or with the warm-up's fake host, needs no look-up."""
    host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
    if isinstance(host, list):
        host, port = host[0], port[0] if isinstance(port, list) else port
    if not host or host == FAKE_BOOTSTRAP_HOST or port is None:
        return
    if table.ensure(bootstrap_addr(str(host), port)):
        return
    messages = [handshake_failed_line(0, rid, room, ABORTED)
                for rid, room in zip(rids, rooms_of(body, len(rids)), strict=True)]
    for message in messages:
        log(message, table.log_prefix)
    raise KVTransferAborted(messages[0])
