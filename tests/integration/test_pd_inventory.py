"""A prefill/decode deployment: `check` refuses what a decode would find only at its first
request, before any node is touched; a consistent one deploys each side, and a prefill is ready
only while its KV bootstrap server answers too."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_fleet.node.process import procs
from sglang_fleet.testfleet import local
from sglang_fleet.testfleet.local import http_status, run_playbook, sglang_fleet, wait_for

pytestmark = pytest.mark.integration


def make_pd_fleet(tmp_path, decode_vars: dict | None = None,
                  prefill_vars: dict | None = None):
    return local.make_pd_fleet(tmp_path, decode_vars, prefill_vars)


def bootstrap_port(fleet) -> int:
    return local.pd_bootstrap_port(fleet)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_pd_deployment_whose_sides_disagree_is_refused_before_any_node(tmp_path):
    fleet = make_pd_fleet(tmp_path, {"sglang_server_kv_cache_dtype": "fp8_e4m3",
                                     "sglang_server_disaggregation_transfer_backend": "mooncake"})
    check = sglang_fleet("check", "-i", str(fleet.inventory), "-e", json.dumps(fleet.extra))
    out = flat(check.stdout)
    assert check.returncode == 2, check.stdout[-3000:]
    assert ("PD deployment kimi_pd: its servers disagree on --kv-cache-dtype (auto on "
            "sim-node-1; fp8_e4m3 on sim-node-2)") in out, out[-3000:]
    assert "disagree on transfer backend (nixl on sim-node-1; mooncake on sim-node-2)" in out
    assert "Fix: set it once, in group_vars/kimi_pd" in out
    assert not fleet.root.exists(), "no node may be touched"


def test_a_prefill_is_ready_with_its_bootstrap_server_and_unhealthy_once_it_dies(tmp_path):
    """The simulated prefill runs SGLang's KV bootstrap server; its fault ends that server once
    a decode (here the test) has looked the prefill up, while /health keeps answering 200."""
    fleet = make_pd_fleet(tmp_path, prefill_vars={"sglang_server_sim_fault": "bootstrap_dead"})
    port = bootstrap_port(fleet)
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]
        for host in fleet.hosts:
            assert f"{host}: ready at" in run.output
        script = (fleet.host_root("sim-node-1") / "conf" /
                  f"Kimi-K2.5-{fleet.port('sim-node-1')}.launch.sh").read_text()
        assert "--disaggregation-mode prefill" in script
        assert f"--disaggregation-bootstrap-port {port}" in script
        prefill_log = fleet.log_file("sim-node-1").read_text()
        for line in (f"CommonKVBootstrapServer started successfully on 127.0.0.1:{port}",
                     "Start of pd disaggregation warmup ...",
                     "Disaggregation warmup requests completed for all 1 DP ranks",
                     "End of disaggregation warmup"):
            assert line in prefill_log, line
        assert "Start of pd disaggregation warmup ..." in fleet.log_file("sim-node-2").read_text()
        base = f"http://127.0.0.1:{port}"
        assert requests.get(base + "/health", timeout=5).text == "OK"
        keys = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
        info = requests.get(f"{base}/route?{keys}", timeout=5).json()
        assert info["prefill_http_port"] == fleet.port("sim-node-1")

        # That look-up ended the bootstrap server; the HTTP server answers on.
        local.wait_for(lambda: http_status(base + "/health", timeout=2) is None, timeout=10)
        assert http_status(fleet.url("sim-node-1") + "/health") == 200

        # A decode that has not looked this prefill up yet asks its bootstrap server, once a
        # second, 15 times (decode.py _ensure_prefill_info), then aborts the request.
        aborted = requests.post(fleet.url("sim-node-2") + "/generate", timeout=60, json={
            "text": "hello", "sampling_params": {"max_new_tokens": 2},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": 4411})
        assert aborted.status_code == 500, aborted.text
        assert aborted.json()["message"].endswith(
            "decode_req.req.bootstrap_room=4411 with exception "
            "KVTransferError(bootstrap_room=4411): Aborted by AbortReq.")
        decode_log = fleet.log_file("sim-node-2").read_text()
        assert decode_log.count("Error fetching prefill server info from bootstrap: "
                                f"HTTPConnectionPool(host='127.0.0.1', port={port})") == 15
        assert (f"Could not fetch prefill parallel info from 127.0.0.1:{port} after 15 "
                f"attempts") in decode_log

        health = run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra)
        out = flat(health.output)
        assert health.rc != 0, out[-3000:]
        assert (f"sim-node-1: unhealthy while serving: /health answered 200, but its KV "
                f"bootstrap server on "
                f"port {port} does not answer: no decode server can fetch this prefill's KV "
                f"cache") in out, out[-3000:]
        assert (f"sim-node-2: ready: /health answered 200; KV transfers failed since the last "
                f"look (the log holds 1 request aborted, 16 failed look-ups of a prefill, "
                f"naming the prefill at 127.0.0.1:{port}") in out, out[-3000:]
    finally:
        fleet.kill_leftovers()


def test_a_prefill_whose_bootstrap_port_is_taken_is_refused_or_unhealthy_with_the_cause(
        tmp_path):
    """Taken before the start, the bootstrap port is refused by the check before the start,
    as the HTTP port is: nothing starts. Taken while the prefill loads (after that check), the
    prefill serves on without its bootstrap server, and the gate says so with the cause."""
    # A prefill that loads for seconds: time to take its port meanwhile.
    fleet = make_pd_fleet(tmp_path, prefill_vars={"sglang_server_sim_time_factor": 0.1})
    port = bootstrap_port(fleet)
    holder = socket.socket()  # this test's own listener holds the prefill's bootstrap port
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        refused = fleet.deploy("--limit", "sim-node-1")
        out = flat(refused.output)
        assert refused.rc != 0, out[-3000:]
        assert (f"the prefill's KV bootstrap port 127.0.0.1:{port} is held by {os.getpid()} "
                f"(") in out, out[-3000:]
        assert "Fix: stop that program, or set sglang_server_disaggregation_bootstrap_port to " \
               "a free port" in out
        assert fleet.processes("sim-node-1") == []
        holder.close()

        holder = socket.socket()
        with ThreadPoolExecutor(max_workers=1) as pool:
            deploying = pool.submit(fleet.deploy)
            wait_for(lambda: fleet.processes("sim-node-1"), timeout=300, interval=0.05)
            holder.bind(("127.0.0.1", port))
            holder.listen()
            run = deploying.result(timeout=600)
        out = flat(run.output)
        assert run.rc != 0, out[-3000:]
        assert (f"port {port} does not answer: no decode server can fetch this prefill's KV "
                f"cache; it could not bind the port (OSError: [Errno 98] error while "
                f"attempting to bind on address ('127.0.0.1', {port}): address already in "
                f"use); port {port} is held by {os.getpid()} (") in out, out[-3000:]
        assert f"free port {port} (ss -ltnp 'sport = :{port}'" in out
        assert "sim-node-2: ready at" in run.output
        assert (f"Server error: [Errno 98] error while attempting to bind on address "
                f"('127.0.0.1', {port}): address already in use") in \
            fleet.log_file("sim-node-1").read_text()
    finally:
        holder.close()
        fleet.kill_leftovers()


def test_a_decode_fails_a_transfer_that_hangs_or_whose_prefill_dies_and_serves_on(tmp_path):
    """The prefill's transfers never complete (transfer_hang): the decode fails the request at
    SGLANG_DISAGGREGATION_WAITING_TIMEOUT; then the prefill is killed while a request waits,
    and the decode's heartbeat (every SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, two misses)
    fails it as a lost prefill. The decode stays ready and its verdict says both."""
    fleet = make_pd_fleet(
        tmp_path, decode_vars={"sglang_server_extra_env": {
            "SGLANG_ENABLE_JIT_DEEPGEMM": 0, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 8,
            "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": 2}},
        prefill_vars={"sglang_server_sim_fault": "transfer_hang"})
    port = bootstrap_port(fleet)
    addr = f"127.0.0.1:{port}"
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]

        def generate(room: int) -> requests.Response:
            return requests.post(fleet.url("sim-node-2") + "/generate", timeout=60, json={
                "text": "hello", "sampling_params": {"max_new_tokens": 2},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room})

        timed_out = generate(5)
        assert timed_out.status_code == 500, timed_out.text
        message = timed_out.json()["message"]
        assert message.startswith("Decode transfer failed for request rank=0 ") and \
            "KVTransferError(bootstrap_room=5): Request 5 timed out after 8." in message and \
            message.endswith("s in KVPoll.WaitingForInput"), message

        # A request waits on its KV cache while the prefill dies. Whether it reaches the decode
        # just before or just after the kill, it waits on the prefill the decode knows until
        # the heartbeat's second miss (4 s) declares that prefill lost.
        with ThreadPoolExecutor(max_workers=1) as pool:
            waiting = pool.submit(generate, 6)
            procs.signal_pids([p["pid"] for p in fleet.processes("sim-node-1")], signal.SIGKILL)
            lost = waiting.result(timeout=60)
        assert lost.status_code == 500, lost.text
        assert lost.json()["message"].endswith(
            f"KVTransferError(bootstrap_room=6): Lost connection with prefill instance "
            f"(bootstrap_addr: {addr})")
        decode_log = fleet.log_file("sim-node-2").read_text()
        assert decode_log.count(f"Attempting to reconnect to {addr}...") == 2
        assert f"Lost connection with prefill instance (bootstrap_addr: {addr}), 1 requests " \
               f"affected" in decode_log

        health = run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra,
                              "--limit", "sim-node-2")
        out = flat(health.output)
        assert health.rc == 0, out[-3000:]
        assert ("sim-node-2: ready: /health answered 200; KV transfers failed since the last "
                "look (the log holds 2 requests aborted, 1 lost connection to a prefill, "
                f"naming the prefill at {addr}") in out, out[-3000:]
    finally:
        fleet.stop()
        fleet.kill_leftovers()


def test_a_prefill_waits_for_its_decode_and_fails_a_request_no_decode_takes(tmp_path):
    """A prefill holds each PD request until a decode takes it (bootstraps its room); then it
    answers after its first token, as a prefill server does, while the decode answers in full.
    A request that no decode takes fails at SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT with the
    release's words; the prefill stays ready and its verdict counts the request."""
    fleet = make_pd_fleet(tmp_path, prefill_vars={"sglang_server_extra_env": {
        "SGLANG_ENABLE_JIT_DEEPGEMM": 0, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": 3}})
    port = bootstrap_port(fleet)
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]

        def generate(host: str, room: int) -> requests.Response:
            return requests.post(fleet.url(host) + "/generate", timeout=60, json={
                "text": "hello", "sampling_params": {"max_new_tokens": 6},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room})

        with ThreadPoolExecutor(max_workers=2) as pool:
            prefilled = pool.submit(generate, "sim-node-1", 22)
            decoded = pool.submit(generate, "sim-node-2", 22)
            prefill_answer, decode_answer = prefilled.result(60), decoded.result(60)
        assert prefill_answer.status_code == 200, prefill_answer.text
        assert prefill_answer.json()["output_ids"] == [0]
        assert prefill_answer.json()["meta_info"]["finish_reason"] == {"type": "length",
                                                                       "length": 0}
        assert decode_answer.status_code == 200, decode_answer.text
        assert len(decode_answer.json()["output_ids"]) == 6

        # A stream's 200 goes out before the hand-shake, as SGLang's StreamingResponse sends
        # it: the router then sees the decode's failure at once instead of waiting on the
        # prefill. No decode ever takes rooms 21 and 23.
        streamed = requests.post(fleet.url("sim-node-1") + "/generate", timeout=60, stream=True,
                                 json={"text": "hello", "stream": True,
                                       "sampling_params": {"max_new_tokens": 6},
                                       "bootstrap_host": "127.0.0.1", "bootstrap_port": port,
                                       "bootstrap_room": 23})
        assert streamed.status_code == 200
        assert "bootstrap_room=23" not in fleet.log_file("sim-node-1").read_text()
        orphan = generate("sim-node-1", 21)
        chunks = [line for line in streamed.iter_lines() if line]
        assert chunks[-1] == b"data: [DONE]", chunks
        abort = json.loads(chunks[-2].removeprefix(b"data: "))["meta_info"]["finish_reason"]
        assert abort["type"] == "abort" and abort["status_code"] == 500, abort
        assert "KVTransferError(bootstrap_room=23): Request 23 timed out" in abort["message"]
        assert orphan.status_code == 500, orphan.text
        message = orphan.json()["message"]
        assert message.startswith("Prefill bootstrap failed for request rank=0 req.rid=") and \
            "req.bootstrap_room=21 with exception KVTransferError(bootstrap_room=21): " \
            "Request 21 timed out after 3." in message and \
            message.endswith("s in KVPoll.Bootstrapping"), message
        prefill_log = fleet.log_file("sim-node-1").read_text()
        assert prefill_log.count("Some requests timed out when bootstrapping") == 1

        health = run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra,
                              "--limit", "sim-node-1")
        out = flat(health.output)
        assert health.rc == 0, out[-3000:]
        assert ("sim-node-1: ready: /health answered 200; KV transfers failed since the last "
                "look (the log holds 2 requests aborted") in out, out[-3000:]
    finally:
        fleet.stop()
        fleet.kill_leftovers()


def test_the_pd_example_holds_its_router_and_passes_check_with_its_keys_set(monkeypatch):
    """The example's clients come in through its router in PD mode, whose keys come from the
    controller's environment as the servers' key does."""
    for name in ("SGLANG_API_KEY", "SGLANG_ROUTER_API_KEY", "SGLANG_ROUTER_ADMIN_KEY"):
        monkeypatch.setenv(name, secrets.token_hex(24))
    example = "inventory/examples/pd-deepseek-v3"
    check = sglang_fleet("check", "-i", example)
    assert check.returncode == 0, check.stdout[-3000:]
    assert "result: ok (exit 0): 3 hosts checked" in flat(check.stdout), check.stdout[-3000:]
    monkeypatch.delenv("SGLANG_ROUTER_ADMIN_KEY")
    unset = sglang_fleet("check", "-i", example)
    assert unset.returncode == 2 and "SGLANG_ROUTER_ADMIN_KEY is not set on the controller" \
        in flat(unset.stdout), unset.stdout[-3000:]
