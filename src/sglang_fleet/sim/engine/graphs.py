"""Which CUDA graphs SGLang 0.5.23 captures at start-up, with which sizes.

Modelled on sglang/srt/arg_groups/cuda_graph_hook.py (parse_cuda_graph_config,
apply_cuda_graph_compatibility, disable_prefill_cuda_graph_for_deepseek_trtllm_mla,
generate_decode_cuda_graph_batch_sizes, generate_prefill_cuda_graph_batch_sizes),
sglang/srt/model_executor/cuda_graph_config.py (default_cuda_graph_config: decode "full",
prefill "breakable" on CUDA) and sglang/srt/arg_groups/memory_hook.py (the GPU-memory
defaults of chunked_prefill_size and the decode max batch size). Flags are read by SGLang's
dest names with getattr, so the simulator works with any parser that uses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FULL, BREAKABLE, DISABLED = "full", "breakable", "disabled"


@dataclass(frozen=True)
class CapturePlan:
    decode_backend: str
    prefill_backend: str
    decode_sizes: list[int]
    prefill_sizes: list[int]
    chunked_prefill_size: int
    prefill_note: str | None = None  # the line SGLang logs when it turns prefill capture off

    @property
    def decode(self) -> bool:
        return self.decode_backend != DISABLED

    @property
    def prefill(self) -> bool:
        return self.prefill_backend != DISABLED


def _explicit(args: Any) -> dict[str, dict[str, Any]]:
    raw = getattr(args, "cuda_graph_config", None)
    if not raw:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, dict)}


def backends(args: Any) -> tuple[str, str, bool]:
    """(decode backend, prefill backend, prefill backend set explicitly); precedence as in
    parse_cuda_graph_config: explicit JSON > per-phase flags > off-switches > legacy flag."""
    decode, prefill, locked = FULL, BREAKABLE, False
    if getattr(args, "disable_cuda_graph", False):
        decode, prefill, locked = DISABLED, DISABLED, True
    if getattr(args, "disable_prefill_cuda_graph", False):
        prefill, locked = DISABLED, True
    if getattr(args, "disable_decode_cuda_graph", False):
        decode = DISABLED
    if getattr(args, "cuda_graph_backend_decode", None):
        decode = args.cuda_graph_backend_decode
    if getattr(args, "cuda_graph_backend_prefill", None):
        prefill, locked = args.cuda_graph_backend_prefill, True
    explicit = _explicit(args)
    decode = explicit.get("decode", {}).get("backend", decode)
    if "backend" in explicit.get("prefill", {}):
        prefill, locked = explicit["prefill"]["backend"], True
    return decode, prefill, locked


def decode_sizes(max_bs: int, speculative: bool = False) -> list[int]:
    """cuda_graph_hook.generate_decode_cuda_graph_batch_sizes."""
    if speculative:
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
                 + list(range(72, 257, 8)) + list(range(272, max_bs + 1, 16)))
    else:
        sizes = ([1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
                 + list(range(512, max_bs + 1, 32)))
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def prefill_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.generate_prefill_cuda_graph_batch_sizes (token counts)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
             + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def memory_defaults(gpu_mem_mib: float, tp: int) -> tuple[int, int]:
    """memory_hook._handle_gpu_memory_settings: (chunked_prefill_size, decode max bs)."""
    small_tp = tp < 4
    if gpu_mem_mib < 20 * 1024:
        return 2048, 8
    if gpu_mem_mib < 35 * 1024:
        return 4096, 48 if small_tp else 160
    if gpu_mem_mib < 60 * 1024:
        return 4096, 32 if small_tp else 160
    if gpu_mem_mib < 90 * 1024:
        return 8192, 256 if small_tp else 512
    if gpu_mem_mib < 160 * 1024:
        return 8192, 256 if small_tp else 512
    return 16384, 512


def capture_plan(args: Any, gpu_mem_mib: float, architecture: str, mla: bool,
                 prefill_attention_backend: str) -> CapturePlan:
    decode, prefill, locked = backends(args)
    chunked, max_bs = memory_defaults(gpu_mem_mib, int(args.tp_size))
    chunked = getattr(args, "chunked_prefill_size", None) or chunked
    note = None
    if not locked and prefill == BREAKABLE:
        if int(getattr(args, "pp_size", 1) or 1) > 1:
            prefill = DISABLED
            note = ("Disabling breakable prefill CUDA graph by default for pipeline "
                    "parallelism. Set --cuda-graph-backend-prefill=breakable to opt in.")
        elif architecture == "DeepseekV3ForCausalLM" and prefill_attention_backend == "trtllm_mla":
            note = ("Disabling prefill CUDA graph (breakable) by default for the DeepSeek-V3 "
                    "arch on the trtllm_mla attention backend (a captured prefill graph forces "
                    "a FlashAttention fallback that regresses prefill). Set the prefill cuda "
                    "graph backend explicitly (e.g. --cuda-graph-backend-prefill breakable) to "
                    "override.")
            prefill = DISABLED
    explicit = _explicit(args)
    decode_max = (getattr(args, "cuda_graph_max_bs_decode", None)
                  or explicit.get("decode", {}).get("max_bs"))
    if decode_max is None:
        decode_max = max_bs
        running = getattr(args, "max_running_requests", None)
        if running is not None and decode_max > running:
            decode_max = running
    prefill_max = (getattr(args, "cuda_graph_max_bs_prefill", None)
                   or explicit.get("prefill", {}).get("max_bs"))
    if prefill_max is None:
        prefill_max = min(8192, chunked) if mla else chunked
        total = getattr(args, "max_total_tokens", None)
        if total is not None:
            prefill_max = min(prefill_max, total)
    speculative = bool(getattr(args, "speculative_algorithm", None))
    return CapturePlan(decode_backend=decode, prefill_backend=prefill,
                       decode_sizes=decode_sizes(int(decode_max), speculative),
                       prefill_sizes=prefill_sizes(int(prefill_max)),
                       chunked_prefill_size=int(chunked), prefill_note=note)


def any_capture(args: Any) -> bool:
    decode, prefill, _ = backends(args)
    return decode != DISABLED or prefill != DISABLED
