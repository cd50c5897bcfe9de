"""The simulated decode's wait for a request's KV cache, against the simulator's KV bootstrap
server and a stand-in for the prefill's HTTP server, on loopback (the whole simulated pair is
tests/integration/test_pd_inventory.py's): the cache arrives once the prefill has computed the
prefill; a transfer that never completes fails at SGLANG_DISAGGREGATION_WAITING_TIMEOUT with
the release's words; a prefill the heartbeat loses fails the requests waiting on it and is
looked up again."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

import pytest

from sglang_fleet.sim.pd import kv_receiver
from sglang_fleet.sim.pd.bootstrap import start_bootstrap_server
from sglang_fleet.testfleet.local import free_port_block


class Prefill:
    """A simulated prefill's KV bootstrap server (the simulator's own) and, on its
    prefill_http_port, a stand-in for its HTTP server's answer at kv_receiver.KV_SENT_PATH."""

    def __init__(self) -> None:
        self.kv_sent: set[str] = set()
        self.hang_transfers = False
        sent = self.kv_sent

        class KVSent(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                room = parse_qs(urlparse(self.path).query).get("room", [""])[0]
                data = json.dumps({"room": room, "sent": room in sent}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), KVSent)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        args = SimpleNamespace(host="127.0.0.1", disaggregation_bootstrap_port=free_port_block(1),
                               tp_size=1, port=self.http.server_address[1])
        server = start_bootstrap_server(args)
        assert server is not None
        self.bootstrap = server
        self.addr = f"127.0.0.1:{args.disaggregation_bootstrap_port}"

    def sent(self, rooms: list[int]) -> None:
        if not self.hang_transfers:
            self.kv_sent.update(str(r) for r in rooms)

    def die(self) -> None:
        self.bootstrap.stop()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def new_table():
    """PrefillInfoTables whose heartbeats end with the test."""
    made: list[kv_receiver.PrefillInfoTable] = []

    def make() -> kv_receiver.PrefillInfoTable:
        made.append(kv_receiver.PrefillInfoTable(" TP0"))
        return made[-1]

    yield make
    for table in made:
        table.close()


@pytest.fixture
def prefill():
    server = Prefill()
    yield server, server.addr
    server.die()


def test_a_request_waits_until_its_prefill_has_sent_the_kv_cache(prefill, new_table):
    server, addr = prefill
    table = new_table()
    assert table.ensure(addr)
    threading.Timer(0.3, server.sent, args=([7],)).start()
    started = time.monotonic()
    assert table.wait_for_kv(addr, 7) == ""
    assert 0.25 <= time.monotonic() - started < 5


def test_a_transfer_that_never_completes_fails_at_the_waiting_timeout(prefill, new_table, capsys):
    server, addr = prefill
    server.hang_transfers = True  # the transfer_hang fault
    server.sent([7, 8])
    table = new_table()
    table.waiting_timeout = 0.3
    assert table.ensure(addr)
    reason = table.wait_for_kv(addr, 7)
    assert reason.startswith("Request 7 timed out after 0.") and \
        reason.endswith("s in KVPoll.WaitingForInput")
    assert table.wait_for_kv(addr, 8).startswith("Request 8 timed out after")
    logged = capsys.readouterr().out
    assert logged.count(kv_receiver.WAITING_TIMEOUT_WARNING) == 1  # warned once


def test_a_prefill_the_heartbeat_loses_fails_its_waiting_requests(prefill, new_table, capsys):
    server, addr = prefill
    server.hang_transfers = True
    table = new_table()
    table.heartbeat_interval = 0.1  # the release's floor is 2 s; the logic is the same
    assert table.ensure(addr)
    waiter = threading.Thread(target=lambda: results.append(table.wait_for_kv(addr, 9)))
    results: list[str] = []
    waiter.start()
    server.die()  # the prefill dies while the request waits on its KV cache
    waiter.join(timeout=10)
    assert results == [kv_receiver.lost_reason(addr)]
    logged = capsys.readouterr().out
    assert logged.count(kv_receiver.reconnect_line(addr)) == 2  # two misses, then lost
    assert kv_receiver.lost_line(addr, 1) in logged
    assert addr not in table.known  # the next request looks the prefill up again


def test_the_request_is_aborted_with_the_transfer_line(prefill, new_table, capsys):
    server, addr = prefill
    server.hang_transfers = True
    table = new_table()
    table.waiting_timeout = 0.2
    host, port = addr.split(":")
    body = {"bootstrap_host": host, "bootstrap_port": int(port), "bootstrap_room": 11}
    with pytest.raises(kv_receiver.KVTransferAborted) as aborted:
        kv_receiver.hand_shake(table, body, ["abc"])
    assert str(aborted.value).startswith(
        "Decode transfer failed for request rank=0 decode_req.req.rid='abc' "
        "decode_req.req.bootstrap_room=11 with exception KVTransferError(bootstrap_room=11): "
        "Request 11 timed out after 0.")
    assert str(aborted.value) in capsys.readouterr().out
