"""sglang/srt/distributed/parallel_state.py: GroupCoordinator's collectives (all_reduce,
barrier, broadcast). A rank whose peer never joins waits here, as in NCCL, until a timeout or
forever."""

from __future__ import annotations

import threading


class GroupCoordinator:
    """One rank's view of its TP group."""

    def __init__(self, peers_joined: threading.Event | None = None):
        # Set when every peer has joined the collective; never set for a hung peer.
        self.peers_joined = peers_joined or threading.Event()

    def all_reduce(self, timeout: float | None = None) -> bool:
        return self.peers_joined.wait(timeout)

    def barrier(self, timeout: float | None = None) -> bool:
        return self.peers_joined.wait(timeout)

    def broadcast(self, timeout: float | None = None) -> bool:
        return self.peers_joined.wait(timeout)
