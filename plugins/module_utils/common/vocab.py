# -*- coding: utf-8 -*-
# The one vocabulary every tool speaks: start-up phases and gate verdicts. Pure Python: shipped
# to nodes as module_utils and imported by the controller package as sglang_fleet.node.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

PHASES = (
    "launching",
    "loading_weights",
    "allocating_kv_cache",
    "capturing_cuda_graph",
    "starting_http",
    "warming_up",
    "serving",
)

READY = "ready"
PROGRESSING = "progressing"
STALLED = "stalled"
CRASHED = "crashed"
UNHEALTHY = "unhealthy"
GPU_FAULT = "gpu_fault"
STOPPED = "stopped"  # by an operator or the toolkit (recorded), or by a SIGTERM the log shows
ABSENT = "absent"
VERDICTS = (READY, PROGRESSING, STALLED, CRASHED, UNHEALTHY, GPU_FAULT, STOPPED, ABSENT)
# Verdicts that end a gate: the host failed and goes to recovery.
FAILED_VERDICTS = (STALLED, CRASHED, UNHEALTHY, GPU_FAULT, ABSENT)


def verdict_phrase(verdict, phase):
    """A verdict as words, with the phase only where it says where the server is:
    'stalled in capturing_cuda_graph', 'unhealthy while serving', 'absent', 'ready'."""
    if verdict in (READY, PROGRESSING, ABSENT, STOPPED) or not phase:
        return str(verdict)
    if phase == "serving":
        return "%s while serving" % verdict
    return "%s in %s" % (verdict, phase)


# Why a server failed (DESIGN.md "Cause"): only a configuration cause changes the
# configuration; the others are recovered on the same one, with the cause named.
CONFIGURATION = "configuration"  # a Rule or a flag: change the configuration
ENVIRONMENT = "environment"  # disk, host memory, the node rebooted: fix the node
EXTERNAL = "external"  # someone else's signal, a frozen process: same configuration
HARDWARE = "hardware"  # a GPU fault
CAUSES = (CONFIGURATION, ENVIRONMENT, EXTERNAL, HARDWARE)

# What a phase waits on, for a stall's advice.
WAITS_ON = {
    "launching": "torch.distributed and NCCL set-up between all ranks (every node of a "
                 "multi-node group must have started and reach --dist-init-addr)",
    "loading_weights": "reading the checkpoint from disk or the network",
    "allocating_kv_cache": "profiling GPU memory on every rank (one rank held in a collective "
                           "holds the others)",
    "capturing_cuda_graph": "running and recording each batch size on every rank, with "
                            "collectives between the ranks (first-run kernel compiles can take "
                            "minutes)",
    "starting_http": "the tokenizer and detokenizer processes and the HTTP server",
    "warming_up": "the warm-up request's generation through every rank",
}
# Phases whose hang is most often a collective between ranks.
COLLECTIVE_PHASES = ("launching", "allocating_kv_cache", "capturing_cuda_graph", "warming_up")
NCCL_DEBUG_ENV = ("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
                  "TORCH_NCCL_DUMP_ON_TIMEOUT=1")


def duration_text(seconds):
    """'45 s', '5 min 03 s', '1 h 20 min', '2 d 03 h'."""
    s = int(round(max(0.0, float(seconds))))
    if s < 60:
        return "%d s" % s
    if s < 3600:
        return "%d min %02d s" % (s // 60, s % 60)
    if s < 86400:
        return "%d h %02d min" % (s // 3600, s % 3600 // 60)
    return "%d d %02d h" % (s // 86400, s % 86400 // 3600)

# Stall windows (seconds without progress) for a 1000B-parameter model; smaller models scale
# down to a floor. Graph capture gets longer: first-run FlashInfer JIT compiles can sit for
# minutes with no bar movement (SGLang #7324).
BASE_STALL_WINDOW_S = {
    "launching": 300,
    "loading_weights": 300,
    "allocating_kv_cache": 180,
    "capturing_cuda_graph": 600,
    "starting_http": 120,
    "warming_up": 300,
}
# Hard ceilings (seconds in a phase, progress or not) for a 1000B model.
BASE_CEILING_S = {
    "launching": 1800,
    "loading_weights": 7200,
    "allocating_kv_cache": 900,
    "capturing_cuda_graph": 3600,
    "starting_http": 600,
    "warming_up": 1800,
}
MIN_SCALE = 0.25


def scale_for_model(size_b):
    """Windows grow with model size: 1000B -> 1.0, 70B -> 0.25 (floor)."""
    try:
        return max(MIN_SCALE, min(4.0, float(size_b) / 1000.0))
    except (TypeError, ValueError):
        return 1.0


def default_windows(size_b):
    scale = scale_for_model(size_b)
    return ({p: int(v * scale) for p, v in BASE_STALL_WINDOW_S.items()},
            {p: int(v * scale) for p, v in BASE_CEILING_S.items()})


# NVIDIA's recommended action per Xid (reference: gpu-and-processes.md).
XID_ACTIONS = {
    13: "restart the application", 31: "restart the application",
    43: "ignore (application error)", 94: "restart the application",
    45: "follow the earlier Xid", 48: "reset the GPU, check ECC counters",
    63: "nothing now; the pending row remap activates at the next reset",
    46: "reset the GPU", 64: "reset the GPU", 95: "reset the GPU", 109: "reset the GPU",
    119: "reset the GPU", 120: "reset the GPU",
    74: "follow the NVLink error workflow", 79: "reboot or power-cycle the node",
}
# Xids that leave the GPU healthy (application errors), as NVIDIA's device plugin treats them.
APPLICATION_XIDS = (13, 31, 43, 45, 68)
