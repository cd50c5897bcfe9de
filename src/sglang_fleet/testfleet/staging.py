"""A simulated fleet of staging nodes on loopback, for the bench and the tests: each node is a
root folder and a port on 127.0.0.1, its agent the real one (the same code the sglang_stage
module starts on a node), with a per-node bandwidth cap; the origin is a seed agent serving a
folder and counting the bytes it serves."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from sglang_fleet.node.staging import node
from sglang_fleet.staging.chain import peer_url, sources_by_node
from sglang_fleet.testfleet.local import SimFleet, free_port_block, make_fleet


def free_ports(n: int) -> list[int]:
    """n free consecutive loopback ports, below the ephemeral range (testfleet's rule)."""
    base = free_port_block(n)
    return list(range(base, base + n))


def staging_fleet(tmp: Path, port_variable: str, hosts: int = 2) -> tuple[SimFleet, int]:
    """A simulated fleet whose nodes' staging agents listen on loopback, each on a free port
    of its own (the host variable `port_variable`), and a free port for the controller's
    origin."""
    fleet = make_fleet(tmp, hosts=hosts)
    ports = free_ports(hosts + 1)
    for i, host in enumerate(fleet.hosts):
        fleet.set_host_vars(host, {port_variable: ports[i], "sglang_stage_address": "127.0.0.1"})
    return fleet, ports[-1]


def agent_status(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/status", timeout=10) as r:
        return json.load(r)


class Origin:
    """A seed agent serving a folder; it counts the bytes it serves."""

    def __init__(self, work: Path, manifest: dict, folder: Path, rate: float):
        self.places = node.layout(str(work / "origin-agent"), manifest["model"],
                                  manifest["revision"])
        self.url = peer_url("127.0.0.1", free_ports(1)[0])
        port = int(self.url.rsplit(":", 1)[1])
        node.start_agent(self.places, manifest, ("127.0.0.1", port), [],
                         {"rate_out": rate, "linger_s": 3600}, seed_folder=str(folder))
        status = node.read_status(self.places, timeout=60)
        if status is None or status["state"] != "serving":
            raise RuntimeError(f"the origin's agent did not start ({status}): "
                               f"{self.places['log']}")

    def served(self) -> int:
        return agent_status(self.url)["bytes_served"]

    def stop(self) -> None:
        node.stop_agent(self.places)


class LoopbackFleet:
    """n nodes in a chain behind the origin, each under work/<name>."""

    def __init__(self, work: Path, manifest: dict, origin_url: str, n: int, options: dict,
                 ports: dict[str, int] | None = None):
        self.manifest = manifest
        self.options = options
        self.names = [f"node-{i + 1}" for i in range(n)]
        self.ports = ports or dict(zip(self.names, free_ports(n), strict=True))
        self.chain = sources_by_node(
            [(nm, peer_url("127.0.0.1", self.ports[nm])) for nm in self.names], origin_url)
        self.places = {nm: node.layout(str(work / nm), manifest["model"], manifest["revision"])
                       for nm in self.names}

    def start(self, names: list[str] | None = None) -> None:
        """The disk check on every node first, then each node's agent (one already running
        for this revision is kept)."""
        names = names or self.names
        for nm in names:
            node.check_disk(self.places[nm], self.manifest, nm)
        for nm in names:
            node.start_agent(self.places[nm], self.manifest, ("127.0.0.1", self.ports[nm]),
                             self.chain[nm], self.options)

    def published(self, nm: str) -> bool:
        return node.published(self.places[nm], self.manifest)

    def wait(self, timeout: float, names: list[str] | None = None) -> dict[str, float]:
        """Seconds from now until each node published, or until its agent ended without."""
        names = names or self.names
        start = time.monotonic()
        done: dict[str, float] = {}
        while len(done) < len(names) and time.monotonic() - start < timeout:
            for nm in names:
                if nm not in done and (self.published(nm) or self.ended(nm)):
                    done[nm] = time.monotonic() - start
            time.sleep(0.05)
        return done

    def ended(self, nm: str) -> bool:
        status = self.status(nm)
        return bool(status) and status["state"] in ("incomplete", "failed", "stopped")

    def status(self, nm: str) -> dict:
        return node.read_status(self.places[nm], timeout=0) or {}

    def stop(self) -> None:
        for nm in self.names:
            node.stop_agent(self.places[nm])


def stop_agents_under(folder: Path) -> int:
    """Stop every staging agent whose config lies under `folder` (found by its pid file and
    its own config path on its command line, never by name); how many were running."""
    stopped = 0
    for config in folder.rglob("agent.json"):
        places = {"pidfile": str(config.with_name("agent.pid")), "config": str(config)}
        stopped += bool(node.stop_agent(places))
    return stopped
