"""Which scheduler processes one node runs, and how SGLang 0.5.23 names and places them.

Modelled on sglang/srt/entrypoints/engine.py (_calculate_rank_ranges,
Engine._launch_scheduler_processes), sglang/srt/managers/data_parallel_controller.py
(launch_dp_schedulers, launch_tensor_parallel_group) and sglang/srt/managers/scheduler.py
(configure_scheduler_process). Reads parsed flags by SGLang's own dest names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SchedulerRank:
    dp_rank: int | None  # None without data parallelism, as SGLang's parallel.dp_rank
    pp_rank: int
    tp_rank: int
    ep_rank: int
    gpu_id: int
    prefix: str  # the log prefix, e.g. " DP0 PP1 TP3"

    @property
    def title(self) -> str:
        return "sglang::scheduler" + self.prefix.replace(" ", "_")

    @property
    def draws_bars(self) -> bool:
        """tqdm bars are drawn on TP rank 0 (capture) of each stage and replica."""
        return self.tp_rank == 0

    @property
    def loads_with_bar(self) -> bool:
        """The shard loader's bar: torch.distributed rank 0 of each replica's world."""
        return self.tp_rank == 0 and self.pp_rank == 0


@dataclass(frozen=True)
class Topology:
    tp: int
    pp: int
    dp: int
    ep: int
    attn_dp: int
    nnodes: int
    node_rank: int
    base_gpu_id: int

    @classmethod
    def from_args(cls, args: Any) -> Topology:
        dp = int(getattr(args, "dp_size", 1) or 1)
        attn_dp = int(getattr(args, "attn_dp_size", 1) or 1)
        if attn_dp == 1 and getattr(args, "enable_dp_attention", False):
            attn_dp = dp  # the deprecated spelling of --attn-dp-size <dp-size>
        return cls(tp=int(args.tp_size), pp=int(getattr(args, "pp_size", 1) or 1), dp=dp,
                   ep=int(getattr(args, "ep_size", 1) or 1), attn_dp=attn_dp,
                   nnodes=int(getattr(args, "nnodes", 1) or 1),
                   node_rank=int(getattr(args, "node_rank", 0) or 0),
                   base_gpu_id=int(getattr(args, "base_gpu_id", 0) or 0))

    @property
    def attention_dp(self) -> bool:
        return self.attn_dp > 1

    @property
    def uses_dp_controller(self) -> bool:
        # engine.py: use_dp_controller = num_dp_ranks > 1
        return self.dp > 1 or self.attention_dp

    @property
    def dp_replicas(self) -> int:
        """Separate scheduler groups the controller launches (pure DP); 1 otherwise."""
        return 1 if self.attention_dp else self.dp

    def rank_ranges(self) -> tuple[range, range, int, int]:
        """engine.py _calculate_rank_ranges for this node."""
        pp_per_node = max(self.pp // self.nnodes, 1)
        nnodes_per_pp_rank = max(self.nnodes // self.pp, 1)
        pp_range = range(pp_per_node * (self.node_rank // nnodes_per_pp_rank),
                         pp_per_node * (self.node_rank // nnodes_per_pp_rank + 1))
        tp_per_node = self.tp // nnodes_per_pp_rank
        tp_range = range(tp_per_node * (self.node_rank % nnodes_per_pp_rank),
                         tp_per_node * (self.node_rank % nnodes_per_pp_rank + 1))
        return pp_range, tp_range, pp_per_node, tp_per_node

    def schedulers(self, dp_rank: int | None = None) -> list[SchedulerRank]:
        """This node's schedulers of one DP replica (dp_rank), or of the whole server."""
        pp_range, tp_range, pp_per_node, tp_per_node = self.rank_ranges()
        # data_parallel_controller.launch_dp_schedulers: each replica starts tp*pp GPUs on.
        replica_base = (dp_rank or 0) * self.tp * self.pp if not self.attention_dp else 0
        out = []
        for pp_rank in pp_range:
            for tp_rank in tp_range:
                gpu = (self.base_gpu_id + replica_base + (pp_rank % pp_per_node) * tp_per_node
                       + tp_rank % tp_per_node)
                ep_rank = tp_rank // max(self.tp // self.ep, 1)
                shown_dp = dp_rank
                if self.attention_dp:
                    shown_dp = tp_rank // max(self.tp // self.attn_dp, 1)
                out.append(SchedulerRank(shown_dp, pp_rank, tp_rank, ep_rank, gpu,
                                         self._prefix(shown_dp, pp_rank, tp_rank, ep_rank)))
        return out

    def stats_rank(self, dp_rank: int | None) -> SchedulerRank:
        """The scheduler that reports a DP rank's metrics (attention-TP rank 0 of the first
        pipeline stage on this node)."""
        ranks = self.schedulers(dp_rank if not self.attention_dp else None)
        return next((r for r in ranks if r.dp_rank == dp_rank), ranks[0])

    def all_schedulers(self) -> list[SchedulerRank]:
        if not self.uses_dp_controller or self.attention_dp:
            return self.schedulers(None)
        return [s for d in range(self.dp) for s in self.schedulers(d)]

    def _prefix(self, dp_rank: int | None, pp_rank: int, tp_rank: int, ep_rank: int) -> str:
        # scheduler.py configure_scheduler_process: DP, PP, (ATTN_CP, MOE_DP), TP, EP.
        prefix = ""
        if dp_rank is not None:
            prefix += f" DP{dp_rank}"
        if self.pp > 1:
            prefix += f" PP{pp_rank}"
        if self.tp > 1:
            prefix += f" TP{tp_rank}"
        if self.ep > 1:
            prefix += f" EP{ep_rank}"
        return prefix

    @property
    def gpus_per_node(self) -> int:
        _, _, pp_per_node, tp_per_node = self.rank_ranges()
        return pp_per_node * tp_per_node * self.dp_replicas
