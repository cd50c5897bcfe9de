"""Who serves a server's port, by the deployment marker its processes carry: a router lists
workers by URL only, and a URL served by another deployment is not this host's to remove."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from sglang_fleet.node.process.procs import MARKER_VAR
from sglang_fleet.node.process.startcheck import port_owner

LISTEN = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
          "s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)")


@pytest.fixture
def listener():
    proc = subprocess.Popen([sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, MARKER_VAR: "node2:Kimi-K2.5-30000"})
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def test_a_port_served_by_another_deployment_is_named_and_not_this_hosts(listener):
    proc, port = listener
    found = port_owner("127.0.0.1", port, "node1:Kimi-K2.5-30000")
    assert found["owner"] == "other"
    assert found["holder"].startswith(f"pid {proc.pid} (deployment node2:Kimi-K2.5-30000, ")


def test_a_port_served_by_the_deployments_own_server_is_its_own(listener):
    _, port = listener
    assert port_owner("127.0.0.1", port, "node2:Kimi-K2.5-30000") == {"owner": "own",
                                                                     "holder": None}


def test_a_port_nothing_listens_on_is_free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
        assert port_owner("127.0.0.1", port, "node1:x") == {"owner": "free", "holder": None}
