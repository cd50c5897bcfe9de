"""The fan-out: nodes in a pipelined chain behind the origin. Each node fetches from the node
before it while that node is still fetching, so every link carries the model once at the
per-node bandwidth and the origin serves it once, whatever the fleet's size. A node also knows
the nodes further up and the origin, last, for when the one before it is gone or stuck."""

from __future__ import annotations


def peer_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{int(port)}"


def sources_by_node(nodes: list[tuple[str, str]], origin: str) -> dict[str, list[str]]:
    """nodes: (name, its agent's URL) in chain order; each node's sources, nearest first."""
    out = {}
    for i, (name, _) in enumerate(nodes):
        upstream = [url for _, url in reversed(nodes[:i])]
        out[name] = upstream + [origin]
    return out
