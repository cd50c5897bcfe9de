"""A PD server's KV transfer failures, read from its log and judged: counted apart from the
server's own failures, the prefill each names, and a ready decode that says so while it serves
on. Log lines in the shapes 0.5.23 prints (disaggregation/decode.py, prefill.py,
common/conn.py)."""

from __future__ import annotations

from sglang_fleet.node.health.classify import classify
from sglang_fleet.node.logs.logphase import parse_log

WINDOWS = {p: 10 for p in ("launching", "loading_weights", "allocating_kv_cache",
                           "capturing_cuda_graph", "starting_http", "warming_up")}
CEILINGS = {p: 1000 for p in WINDOWS}
READY = "[2026-12-04 21:29:50] The server is fired up and ready to roll!"
LOOKUP = ("[2026-12-04 21:30:0{s} TP0] Error fetching prefill server info from bootstrap: "
          "HTTPConnectionPool(host='10.0.0.5', port=8998): Max retries exceeded with url: "
          "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1 "
          "(Caused by NewConnectionError('Failed to establish a new connection: [Errno 111] "
          "Connection refused'))")
GAVE_UP = ("[2026-12-04 21:30:14 TP0] Could not fetch prefill parallel info from "
           "10.0.0.5:8998 after 15 attempts")


def handshake(rid: str, room: int, second: int = 14) -> str:
    return (f"[2026-12-04 21:30:{second} TP0] Decode handshake failed for request rank=0 "
            f"decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={room} with exception "
            f"KVTransferError(bootstrap_room={room}): Aborted by AbortReq.")


def decode_log(*extra: str) -> str:
    return "\n".join([READY, LOOKUP.format(s=0), LOOKUP.format(s=1), GAVE_UP,
                      handshake("9f3a", 4411), handshake("77c0", 4412), *extra]) + "\n"


def observation(text: str) -> dict:
    return {"run_id": 1.0, "started": True, "processes": [{"pid": 10, "state": "S"}],
            "main_alive": True, "serves_http": True, "port_open": True, "health": 200,
            "xids": [], "exit_status": None, "log": parse_log(text)}


def test_kv_transfer_lines_are_counted_apart_with_the_prefill_they_name():
    log = parse_log(decode_log())
    assert log["failures"] == [], "a request's KV failure is not the server's failure"
    kv = log["kv_transfer"]
    assert kv["requests_failed"] == 2 and kv["lookups_failed"] == 3
    assert kv["prefills"] == {"10.0.0.5:8998": 3}
    assert "rid='77c0'" in kv["last_request_line"]
    assert parse_log(READY + "\n")["kv_transfer"] is None


def test_a_decode_failing_transfers_stays_ready_and_names_the_prefill_only_when_news_come():
    first, state = classify(None, observation(decode_log()), 100.0, WINDOWS, CEILINGS)
    assert first["verdict"] == "ready"
    assert first["headline"].startswith(
        "ready: /health answered 200; KV transfers failed in its log (the log holds 2 "
        "requests aborted, 3 failed look-ups of a prefill, naming the prefill at "
        "10.0.0.5:8998; the latest at ")
    assert first["headline"].endswith("KVTransferError(bootstrap_room=4412): Aborted by "
                                      "AbortReq.)")
    assert "recovering it, not this server" in first["advice"]
    assert first["kv_transfer"]["prefills"] == ["10.0.0.5:8998"]

    again, state = classify(state, observation(decode_log()), 101.0, WINDOWS, CEILINGS)
    assert again["headline"] == "ready: /health answered 200", \
        "lines already reported are not news: the prefill may be back"
    assert "kv_transfer" not in again

    news, _ = classify(state, observation(decode_log(handshake("c1d2", 4413, 30))), 102.0,
                       WINDOWS, CEILINGS)
    assert "KV transfers failed since the last look (the log holds 3 requests aborted" in \
        news["headline"]
