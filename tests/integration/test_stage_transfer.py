"""Staging's transfer on a simulated fleet on loopback: real agent processes (the code the
sglang_stage module starts on a node), each node a root folder and a port with a bandwidth cap,
the origin a seed agent that counts what it serves. A small synthetic checkpoint keeps the CPU
cost low; the cap keeps each copy slow enough to kill mid-way."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler

import pytest

from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.node.staging import node
from sglang_fleet.staging.synthetic import make_checkpoint
from sglang_fleet.testfleet.local import loopback_http_server
from sglang_fleet.testfleet.staging import LoopbackFleet, Origin

PIECE = 64 * 1024
RATE = 400_000  # bytes/s per node, each way
# A peer flat for stall_s is passed over for the next source (the origin last): long enough
# that a peer slowed by a loaded test machine is waited on, not bypassed.
OPTIONS = {"rate_in": RATE, "rate_out": RATE, "wait_s": 0.5, "stall_s": 4.0,
           "give_up_s": 6.0, "linger_s": 2.0}


@pytest.fixture
def staged(tmp_path):
    """(work folder, manifest, origin, fleets made with make(n)); every agent stopped after."""
    folder = make_checkpoint(tmp_path / "origin" / "tiny", 1_200_000, shards=2, layers=2)
    manifest = mf.build(str(folder), "tiny", "r1", piece_size=PIECE)
    origin = Origin(tmp_path, manifest, folder, RATE)
    fleets = []

    def make(n, name="fleet"):
        fleets.append(LoopbackFleet(tmp_path / name, manifest, origin.url, n, OPTIONS))
        return fleets[-1]

    yield tmp_path, manifest, origin, make
    for fleet in fleets:
        fleet.stop()
    origin.stop()


def _pieces(manifest):
    return len(mf.pieces(manifest))


def _wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _journal_count(fleet, nm):
    try:
        with open(os.path.join(fleet.places[nm]["staging"], "journal"), "rb") as j:
            return sum(j.read())
    except OSError:
        return 0


def _kill9(fleet, nm):
    pid = node.agent_pid(fleet.places[nm])
    os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: node.agent_pid(fleet.places[nm]) != pid or _reap(pid), 10)


def _reap(pid):
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def test_the_fleet_is_staged_verified_and_a_rerun_moves_nothing(staged):
    _, manifest, origin, make = staged
    fleet = make(3)
    fleet.start()
    fleet.wait(60)
    for nm in fleet.names:
        assert fleet.published(nm), fleet.status(nm)
        assert node.verify_published(fleet.places[nm], manifest) == []
    first = origin.served()
    assert first <= 1.05 * manifest["total_bytes"]
    fleet.stop()
    fleet.start()  # the re-run: every node is published with this manifest
    assert all(node.agent_pid(fleet.places[nm]) is None for nm in fleet.names)
    assert origin.served() == first


def test_a_node_killed_mid_copy_resumes_fetching_at_most_one_piece_again(staged):
    _, manifest, origin, make = staged
    fleet = make(1)
    fleet.start()
    _wait_for(lambda: _journal_count(fleet, "node-1") >= _pieces(manifest) // 3, 30)
    _kill9(fleet, "node-1")
    served_before_restart = origin.served()
    held = _journal_count(fleet, "node-1")
    assert 0 < held < _pieces(manifest)
    fleet.start()
    fleet.wait(60)
    assert fleet.published("node-1"), fleet.status("node-1")
    assert fleet.status("node-1")["pieces_at_start"] == held
    fetched_again = served_before_restart // PIECE - held
    assert fetched_again <= 1
    assert node.verify_published(fleet.places["node-1"], manifest) == []


CONTROLLER = """
import json, sys
from pathlib import Path
from sglang_fleet.testfleet.staging import LoopbackFleet
from sglang_fleet.node.staging import manifest as mf
manifest = mf.load(sys.argv[1])
# The test's ports, so that its re-run names the same agents.
fleet = LoopbackFleet(Path(sys.argv[2]), manifest, sys.argv[3], 3, json.loads(sys.argv[4]),
                      ports=json.loads(sys.argv[5]))
fleet.start()
fleet.wait(120)
"""


def test_a_controller_killed_mid_copy_leaves_the_agents_to_finish_and_a_rerun_attaches(
        staged):
    work, manifest, origin, make = staged
    fleet = make(3, "fleet")
    manifest_path = work / "manifest.json"
    mf.dump(manifest, str(manifest_path))
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(manifest_path), str(work / "fleet"), origin.url,
         json.dumps(OPTIONS), json.dumps(fleet.ports)])
    _wait_for(lambda: _journal_count(fleet, "node-3") >= 3, 30)
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    pids = {nm: node.agent_pid(fleet.places[nm]) for nm in fleet.names}
    assert all(pids.values()), "the agents outlive the controller"
    fleet.start()  # the re-run attaches to the running agents
    assert {nm: node.agent_pid(fleet.places[nm]) for nm in fleet.names} == pids
    fleet.wait(60)
    assert all(fleet.published(nm) for nm in fleet.names)
    assert origin.served() <= 1.05 * manifest["total_bytes"]
    for nm in fleet.names:  # the same agents throughout: no piece fetched twice
        assert fleet.status(nm)["bytes_fetched"] == manifest["total_bytes"]


def test_a_corrupt_piece_on_a_serving_peer_is_caught_named_and_fetched_again(staged):
    _, manifest, origin, make = staged
    fleet = make(2)
    fleet.start(["node-1"])
    _wait_for(lambda: _journal_count(fleet, "node-1") >= _pieces(manifest) // 2, 30)
    node.stop_agent(fleet.places["node-1"])
    first = manifest["files"][0]
    path = os.path.join(fleet.places["node-1"]["files"], first["path"])
    with open(path, "r+b") as f:  # one byte of piece 0, held and journalled by node-1
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    fleet.start()
    fleet.wait(60)
    peer = fleet.status("node-2")
    assert [(c["piece"], c["source"]) for c in peer["corrupt"]] == [(0, fleet.chain["node-2"][0])]
    assert fleet.status("node-1")["corrupt"][0]["source"] == "this node's own copy"
    for nm in fleet.names:
        assert fleet.published(nm)
        assert node.verify_published(fleet.places[nm], manifest) == []


def test_a_flipped_byte_in_a_published_copy_fails_the_node_check(staged):
    _, manifest, _, make = staged
    fleet = make(1)
    fleet.start()
    fleet.wait(60)
    shard = manifest["files"][-1]["path"]
    path = os.path.join(fleet.places["node-1"]["model_dir"], shard)
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    problems = node.verify_published(fleet.places["node-1"], manifest)
    assert len(problems) == 1 and problems[0].startswith(shard)


def test_an_origin_that_dies_mid_way_leaves_the_peers_with_what_the_fleet_holds(staged):
    _, manifest, origin, make = staged
    fleet = make(3)
    fleet.start()
    _wait_for(lambda: _journal_count(fleet, "node-1") >= _pieces(manifest) // 3, 30)
    origin.stop()
    fleet.wait(60)
    held = {nm: _journal_count(fleet, nm) for nm in fleet.names}
    assert held["node-2"] == held["node-3"] == held["node-1"] < _pieces(manifest)
    for nm in fleet.names:
        status = fleet.status(nm)
        assert status["state"] == "incomplete" and not fleet.published(nm)
        assert status["missing"] and "no source holds the missing pieces" in status["error"]


class RangeFiles(SimpleHTTPRequestHandler):
    """A plain HTTP server of a folder that answers byte ranges (206), as a web server or an
    object store does, and counts the bytes it serves."""

    served = 0

    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        path = self.translate_path(self.path)
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if not os.path.isfile(path) or not match:
            return super().do_GET()
        start, end = int(match[1]), int(match[2])
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{os.path.getsize(path)}")
        self.end_headers()
        self.wfile.write(data)
        type(self).served += len(data)


def test_an_http_origin_is_read_in_byte_ranges_once_for_the_fleet(tmp_path):
    folder = make_checkpoint(tmp_path / "www" / "tiny", 600_000, shards=2, layers=2)
    manifest = mf.build(str(folder), "tiny", "r1", piece_size=PIECE)
    handler = type("Counted", (RangeFiles,), {"served": 0})
    with loopback_http_server(partial(handler, directory=str(tmp_path / "www"))) as url:
        fleet = LoopbackFleet(tmp_path / "fleet", manifest, f"files+{url}/tiny", 3, OPTIONS)
        try:
            fleet.start()
            fleet.wait(60)
        finally:
            fleet.stop()
    assert all(fleet.published(nm) for nm in fleet.names), fleet.status("node-1")
    assert handler.served == manifest["total_bytes"]
    for nm in fleet.names:
        assert node.verify_published(fleet.places[nm], manifest) == []
