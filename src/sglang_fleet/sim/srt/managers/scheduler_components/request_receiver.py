"""sglang/srt/managers/scheduler_components/request_receiver.py: TP rank 0 pulls the requests
and broadcasts them to the other ranks, which wait for it in recv_requests."""

from __future__ import annotations

from sglang_fleet.sim.srt.distributed.parallel_state import GroupCoordinator
from sglang_fleet.sim.srt.utils.common import broadcast_pyobj


class SchedulerRequestReceiver:
    def __init__(self, group: GroupCoordinator):
        self.group = group

    def recv_requests(self) -> None:
        self._broadcast_reqs_across_ranks()

    def _broadcast_reqs_across_ranks(self) -> None:
        broadcast_pyobj(self.group)
