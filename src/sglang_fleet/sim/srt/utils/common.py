"""sglang/srt/utils/common.py: get_available_gpu_memory (with distributed=True, the minimum
over the ranks: an all_reduce) and broadcast_pyobj (TP rank 0's requests to the others)."""

from __future__ import annotations

from sglang_fleet.sim.srt.distributed.parallel_state import GroupCoordinator


def get_available_gpu_memory(group: GroupCoordinator, distributed: bool = True) -> None:
    if distributed:
        group.all_reduce()


def broadcast_pyobj(group: GroupCoordinator) -> None:
    group.broadcast()
