"""The failure texts SGLang 0.5.23 (and the torch underneath it) print, for the simulator.

Each is raised or printed by the simulated process where the real one would be, so a real
Python traceback of the simulator carries SGLang's own last line. Sources:
- sglang/srt/model_executor/pool_configurator.py MemoryPoolConfig.__post_init__
- sglang/srt/mem_cache/allocation.py (prefill and decode allocation) and
  base_prefix_cache.available_and_evictable_str
- sglang/srt/model_executor/runner/decode_cuda_graph_runner.py (capture failure) and
  runner_backend_utils/__init__.py CUDA_GRAPH_CAPTURE_FAILED_MSG,
  PREFILL_CUDA_GRAPH_CAPTURE_FAILED_MSG, breakable_cuda_graph/context.py BCG_FAILURE_HINT
- sglang/srt/utils/watchdog.py WatchdogRaw._watchdog_once and
  managers/scheduler_components/invariant_checker.py create_scheduler_watchdog (dump_info)
- torch's ProcessGroupNCCL watchdog (C++): the collective timeout and std::terminate lines.
"""

from __future__ import annotations

import builtins
import errno
import math
import os
import sys
import sysconfig
import time
from typing import Any


class DistBackendError(RuntimeError):
    """Stands in for torch.distributed.DistBackendError; printed under torch's name."""


DistBackendError.__module__ = "torch.distributed"


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError; printed under torch's name."""


OutOfMemoryError.__module__ = "torch"


CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
PREFILL_CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Fail when using backend: {backend} for prefill runner.\n"
    "Possible suggestions:\n"
    "{suggestions}"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
BCG_FAILURE_HINT = (
    "1. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled\n"
    "2. if it is an OOM problem, set --mem-fraction-static to a smaller value "
    "(e.g., 0.8 or 0.7) or set --cuda-graph-max-bs-prefill to a smaller value "
    "(e.g., 2048)\n"
)


def not_enough_memory(mem_fraction_static: float | None) -> str:
    msg = "Not enough memory. Please try to increase --mem-fraction-static."
    if mem_fraction_static is not None:
        msg += f" Current value: mem_fraction_static={mem_fraction_static}"
    return msg


def allocation_oom(stage: str, tokens: int, available: int) -> str:
    """stage: "Prefill" or "Decode"."""
    return (f"{stage} out of memory. Try to lower your batch size.\n"
            f"Try to allocate {tokens} tokens.\n"
            f"Available tokens: {available} (available_size={available} + evictable_size=0)\n")


def format_size(size: float) -> str:
    """c10/cuda/CUDACachingAllocator.cpp format_size."""
    if size <= 1024:
        return f"{int(size)} bytes"
    if size <= 1048576:
        return f"{size / 1024:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576:.2f} MiB"
    return f"{size / 1073741824:.2f} GiB"


def cuda_oom(need: float, gpu: int, total: float, free: float, in_use: float,
             allocated: float, reserved: float) -> str:
    """torch's CUDA out-of-memory message (CUDACachingAllocator, torch 2.x), in bytes: what
    was asked, the GPU's total and free memory, what this process holds (NVML's per-process
    count), what PyTorch allocated and what it reserves unallocated."""
    return (f"CUDA out of memory. Tried to allocate {format_size(need)}. GPU {gpu} has a total "
            f"capacity of {format_size(total)} of which {format_size(free)} is free. "
            f"Including non-PyTorch memory, this process has {format_size(in_use)} memory in "
            f"use. Of the allocated memory {format_size(allocated)} is allocated by PyTorch, "
            f"and {format_size(reserved)} is reserved by PyTorch but unallocated. If reserved "
            f"but unallocated memory is large try setting "
            f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            f"documentation for Memory Management  (https://docs.pytorch.org/docs/stable/"
            f"notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")


def nccl_error() -> str:
    return ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled "
            "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.5\n"
            "ncclSystemError: System call (e.g. socket, malloc) or external library call "
            "failed or device error. \nLast error:\nsocketProgress: Connection closed by "
            "remote peer")


def watchdog_timeout_lines(debug_name: str, timeout: float, soft: bool) -> str:
    return f"{debug_name} watchdog timeout (self.watchdog_timeout={timeout!r}, self.soft={soft})"


# sampling/sampling_params.py SamplingParams' fields in declaration order, as a request's are
# once the tokenizer manager has normalized them (no stop strings, no grammar): msgspec's repr.
_SAMPLING_BEFORE = "stop=None, stop_token_ids=None, stop_regex=None"
_SAMPLING_AFTER = (
    "min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, "
    "min_new_tokens=0, n=1, beam_width=None, json_schema=None, regex=None, ebnf=None, "
    "structural_tag=None, ignore_eos=False, skip_special_tokens=True, "
    "spaces_between_special_tokens=True, no_stop_trim=False, stream_interval=None, "
    "logit_bias=None, sampling_seed=None, custom_params=None, watermark=None, stop_strs=[], "
    "stop_regex_strs=[], stop_str_max_len=0, stop_regex_max_len=0, is_normalized=True, "
    "ebnf_full_assistant=False")
TOP_K_ALL = 1 << 30  # sampling_params.py: top_k=-1 (all) as the sampler stores it
SAMPLING_EPS = 1e-6  # sampling_params.py _SAMPLING_EPS: below it, sampling is greedy


def sampling_params_repr(max_new_tokens: int, temperature: float) -> str:
    """A request's SamplingParams after __post_init__ and normalize() (the simulator honours
    max_new_tokens and temperature; every other field is the default)."""
    greedy = temperature < SAMPLING_EPS  # __post_init__: greedy is temperature 1, top_k 1
    return (f"SamplingParams(max_new_tokens={max_new_tokens}, {_SAMPLING_BEFORE}, "
            f"temperature={1.0 if greedy else float(temperature)!r}, top_p=1.0, "
            f"top_k={1 if greedy else TOP_K_ALL}, {_SAMPLING_AFTER})")


def req_repr(rid: str, input_ids: list[int], output_ids: list[int], sampling: str) -> str:
    """managers/schedule_batch.py Req.__repr__ (a request with no grammar)."""
    return (f"Req(rid={rid}, input_ids={input_ids}, output_ids={output_ids}, "
            f"self.grammar=None, self.sampling_params={sampling})")


def full_pool_line(total: int, available: int) -> str:
    """scheduler_components/invariant_checker.py _check_pool_invariant for the full pool, as
    dump_info asks it (_check_all_pools, nothing counted as uncached). Simulated values: the
    running batch's tokens are what is not available."""
    return (f"[full] total={total}, available={available}, evictable=0, protected=0, "
            f"session_held=0, uncached=0")


def scheduler_debug_info(req: str, pool: str) -> str:
    """create_scheduler_watchdog's dump_info for one running request, as WatchdogRaw logs
    it."""
    return ("Scheduler debug info:\n"
            "scheduler.cur_batch_for_debug.batch_size()=1\n"
            f"scheduler.cur_batch_for_debug.reqs=[{req}]\n"
            f"{pool}")


# torch's ProcessGroupNCCL before it takes the process down (libtorch_cuda's own strings).
NCCL_ASYNC_ERROR = ("Some NCCL operations have failed or timed out. Due to the asynchronous "
                    "nature of CUDA kernels, subsequent GPU operations might run on "
                    "corrupted/incomplete data.")
NCCL_TEARDOWN = "To avoid data inconsistency, we are taking the entire process down."
# The watchdog's report of the failed work and of the collective's stack (torch's flight
# recorder is off unless TORCH_NCCL_TRACE_BUFFER_SIZE is set; SGLang does not set it).
NCCL_FAILURE_DETECTED = ("failure detected by watchdog at work sequence id: {seq} PG status: "
                         "last enqueued work: {enqueued}, last completed work: {completed}")
NCCL_NO_STACK = ("Stack trace of the failed collective not found, potentially because "
                 "FlightRecorder is disabled. You can enable it by setting "
                 "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.")
NCCL_WATCHDOG_EXCEPTION = "Process group watchdog thread terminated with exception: "


def _glog_stamp() -> str:
    now = time.time()
    return time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e9):09d}"


def write_nccl_watchdog_abort(rank: int, timeout_ms: int, ran_ms: int, seq: int) -> None:
    """What torch's NCCL watchdog writes to stderr before std::terminate aborts the process."""
    work = (f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=7168, NumelOut=7168, "
            f"Timeout(ms)={timeout_ms})")
    caught = (f"[Rank {rank}] Watchdog caught collective operation timeout: {work} ran for "
              f"{ran_ms} milliseconds before timing out.")
    pg = f"[PG ID 2 PG GUID 3 Rank {rank}]"
    head = f"[rank{rank}]:[E{_glog_stamp()} ProcessGroupNCCL.cpp"
    detected = NCCL_FAILURE_DETECTED.format(seq=seq, enqueued=seq, completed=seq - 1)
    # glog's file:line are the simulator's (torch's binary does not carry its line numbers).
    sys.stderr.write(
        f"{head}:632] {caught}\n"
        f"{head}:2168] {pg}  {detected}\n"
        f"{head}:670] {NCCL_NO_STACK}\n"
        f"{head}:684] [Rank {rank}] {NCCL_ASYNC_ERROR}\n"
        f"{head}:698] [Rank {rank}] {NCCL_TEARDOWN}\n"
        f"terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  {pg} {NCCL_WATCHDOG_EXCEPTION}{caught}\n"
        f"Exception raised from checkTimeout at "
        f"/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632 (most recent call "
        f"first):\n"
        f"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (libc10.so)\n"
        f"frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::"
        f"duration<long, std::ratio<1l, 1000l> > >) + 0x2b4 (libtorch_cuda.so)\n"
        f"frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x890 (libtorch_cuda.so)\n"
        f"frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (libtorch_cuda.so)\n"
        f"\n")
    sys.stderr.flush()


# Where SGLang's package sits in a traceback: the simulator's interpreter's site-packages, as a
# `pip install sglang` there would put it.
SGLANG_ROOT = sysconfig.get_paths()["purelib"]


class SGLangError(Exception):
    """A failure SGLang raises from its own code (or the torch under it): printed as its
    traceback (the package's files, lines and statements), ending in its final line,
    instead of the simulator's frames.
    Raised as the builtin it stands for (sglang_error), so that whatever catches or prints
    it sees SGLang's own exception."""

    def __init__(self, frames: list[tuple[str, int, str, str]], message: str = ""):
        super().__init__(*([message] if message else []))
        self.frames = frames  # (file from the package root, line, function, statement)
        self.message = message

    @property
    def final_line(self) -> str:
        cls = type(self)
        name = cls.__name__ if cls.__module__ == "builtins" else \
            f"{cls.__module__}.{cls.__name__}"
        return f"{name}: {self.message}" if self.message else name

    def traceback_text(self) -> str:
        if not self.frames:  # raised where no frame is known: Python prints the line alone
            return f"{self.final_line}\n"
        lines = ["Traceback (most recent call last):"]
        for file, line, function, code in self.frames:
            lines.append(f'  File "{SGLANG_ROOT}/{file}", line {line}, in {function}')
            lines.append(f"    {code}")
        return "\n".join(lines) + f"\n{self.final_line}\n"


def _as_builtin(base: type[Exception], name: str = "") -> type[SGLangError]:
    cls = type(name or base.__name__, (SGLangError, base), {})
    cls.__module__ = "builtins"  # printed as plain AssertionError / ValueError
    return cls


_ERRORS = {base.__name__: _as_builtin(base)
           for base in (AssertionError, ValueError, AttributeError)}


def _as_torch(name: str) -> type[SGLangError]:
    """torch.distributed's store errors (c10d's DistStoreError, DistNetworkError): printed
    under torch's qualified name."""
    cls = type(name, (SGLangError, RuntimeError), {})
    cls.__module__ = "torch.distributed"
    return cls


_ERRORS.update((name, _as_torch(name)) for name in ("DistStoreError", "DistNetworkError"))


def sglang_error(error: str, frames: list[tuple[str, int, str, str]],
                 message: str = "") -> SGLangError:
    return _ERRORS[error](frames, message)


def verdict_error(verdict: dict[str, Any]) -> SGLangError:
    """The error of a refusal by the release's own pipeline (release_check), as its verdict
    records it: SGLang's final line and the frame that raised it. The frames above that one
    are not in the verdict, so the traceback holds only SGLang's own raising frame."""
    final = " ".join(verdict.get("error") or ["RuntimeError"])
    name, _, message = final.partition(": ")
    if name not in _ERRORS:
        base = getattr(builtins, name, None)
        _ERRORS[name] = _as_builtin(base if isinstance(base, type) and
                                    issubclass(base, Exception) else Exception, name)
    raised = verdict.get("raised_at")
    frames = [(raised["file"], raised["line"], raised["function"], raised["code"])] \
        if raised else []
    return _ERRORS[name](frames, message)


def refusal_error(refusal: Any) -> SGLangError:
    """The error of a refusal of sglang_fleet.known.sglang_checks, with its frames."""
    return sglang_error(refusal.error, [(f.file, f.line, f.function, f.code)
                                        for f in refusal.frames], refusal.message)


# The frames a scheduler's Python exception passes through, by the phase it struck in
# (0.5.23: scheduler.py, tp_worker.py, model_runner.py, the loader, the KV-cache configurator,
# the event loop), each the caller of the next, down to the call into code the simulator does
# not name (torch, the model's own). The gate reads the phase from them where the log's own
# lines do not say it.
_SCHED = "sglang/srt/managers/scheduler.py"
_TP = "sglang/srt/managers/tp_worker.py"
_MR = "sglang/srt/model_executor/model_runner.py"
_LOADER = "sglang/srt/model_loader/loader.py"
_RUN = (_SCHED, 6362, "run_scheduler_process", "scheduler = Scheduler(server_args, port_args)")
_INIT = [_RUN, (_SCHED, 568, "__init__", "self.init_model_worker()")]
# Scheduler.init_model_worker: the TP worker and its model runner (distributed start, weights),
# then the memory pools, then the CUDA graphs.
_RUNNER = [
    *_INIT,
    (_SCHED, 1130, "init_model_worker", "self.init_tp_model_worker()"),
    (_SCHED, 1033, "init_tp_model_worker", "self.tp_worker = TpModelWorker(**worker_kwargs)"),
    (_TP, 319, "__init__", "self._init_model_runner()"),
    (_TP, 487, "_init_model_runner", "self._model_runner = ModelRunner("),
]
# RemoteInstanceModelLoader over NCCL: a group that could not be built (connector/
# remote_instance.py build_group logs why and returns) leaves the connector without
# `_model_update_group`, and the broadcast of the first parameter fails on it.
_REMOTE_LOAD = [
    (_LOADER, 3191, "load_model", "self.load_model_from_remote_instance_by_nccl("),
    (_LOADER, 3287, "load_model_from_remote_instance_by_nccl",
     "group=client._model_update_group,"),
]
_KV_CONFIGURE = ("sglang/srt/mem_cache/kv_cache_configurator.py", 476, "configure",
                 "config = self._resolve_memory_pool_config(pre_model_load_memory)")
SCHEDULER_FRAMES: dict[str, list[tuple[str, int, str, str]]] = {
    "launching": [*_RUNNER,
                  (_MR, 466, "__init__", "self.init_torch_distributed()"),
                  (_MR, 1262, "init_torch_distributed",
                   "self.pre_model_load_memory = bootstrap.measure_pre_model_load_memory("),
                  ("sglang/srt/distributed/bootstrap.py", 207, "measure_pre_model_load_memory",
                   "pre_model_load_memory = get_available_gpu_memory(")],
    "loading_weights": [*_RUNNER,
                        (_MR, 499, "__init__", "self.initialize()"),
                        (_MR, 715, "initialize", "self.load_model()"),
                        (_MR, 1312, "load_model", "loaded = load_model_with_memory_saver("),
                        ("sglang/srt/model_executor/model_runner_components/load_model_utils.py",
                         346, "load_model_with_memory_saver", "model = loader.load_model("),
                        (_LOADER, 1020, "load_model", "self.load_weights_and_postprocess("),
                        (_LOADER, 1029, "load_weights_and_postprocess",
                         "DefaultModelLoader.load_weights_only(model, weights, target_device)"),
                        (_LOADER, 1063, "load_weights_only", "model.load_weights(weights)")],
    "allocating_kv_cache": [*_INIT,
                            (_SCHED, 1137, "init_model_worker", "self.init_memory_pools()"),
                            (_SCHED, 1100, "init_memory_pools", "self.init_target_memory_pool()"),
                            (_SCHED, 1090, "init_target_memory_pool",
                             "self.tp_worker.alloc_memory_pool("),
                            (_TP, 409, "alloc_memory_pool", "self.model_runner.alloc_memory_pool("),
                            (_MR, 982, "alloc_memory_pool",
                             "result = self.kv_cache_configurator.configure("),
                            _KV_CONFIGURE],
    "capturing_cuda_graph": [*_INIT,
                             (_SCHED, 1146, "init_model_worker", "self.init_all_cuda_graphs()"),
                             (_SCHED, 1124, "init_all_cuda_graphs",
                              "self.tp_worker.init_cuda_graphs()"),
                             (_TP, 435, "init_cuda_graphs", "self.model_runner.init_cuda_graphs("),
                             (_MR, 1192, "init_cuda_graphs", "capture = capture_cuda_graphs(")],
}
REMOTE_INSTANCE_FRAMES = [*SCHEDULER_FRAMES["loading_weights"][:-3], *_REMOTE_LOAD]
# After start-up: run_scheduler_process -> run_event_loop -> dispatch_event_loop -> the overlap
# loop (the default) or, with --disable-overlap-schedule, the normal one -> run_batch's forward
# (no speculative decoding, no pipeline parallelism).
_EVENT_LOOP = [(_SCHED, 6368, "run_scheduler_process", "scheduler.run_event_loop()"),
               (_SCHED, 2010, "run_event_loop", "dispatch_event_loop(self)"),
               (_SCHED, 6215, "dispatch_event_loop",
                "return _dispatch_event_loop_once(scheduler)")]
SERVING_FRAMES = {
    True: [*_EVENT_LOOP,
           (_SCHED, 6231, "_dispatch_event_loop_once", "scheduler.event_loop_overlap()"),
           (_SCHED, 2109, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
           (_SCHED, 4704, "run_batch",
            "batch_result = self.model_worker.forward_batch_generation(")],
    False: [*_EVENT_LOOP,
            (_SCHED, 6233, "_dispatch_event_loop_once", "scheduler.event_loop_normal()"),
            (_SCHED, 2048, "event_loop_normal", "result = self.run_batch(batch)"),
            (_SCHED, 4870, "run_batch",
             "batch_result = self.model_worker.forward_batch_generation(")],
}


def phase_frames(phase: str, overlap: bool = True) -> list[tuple[str, int, str, str]]:
    """The frames of an exception in `phase` (overlap: the default overlap scheduler)."""
    if phase in ("warming_up", "serving"):
        return SERVING_FRAMES[overlap]
    return SCHEDULER_FRAMES.get(phase, [_RUN])


# 0.5.23's refusal of a pool the weights leave no memory for (kv_cache_configurator.py).
NO_KV_MEMORY_FRAMES = [*SCHEDULER_FRAMES["allocating_kv_cache"],
                       ("sglang/srt/mem_cache/kv_cache_configurator.py", 3182,
                        "_resolve_memory_pool_config",
                        "available_bytes = self._profile_available_bytes(pre_model_load_memory)"),
                       ("sglang/srt/mem_cache/kv_cache_configurator.py", 3050,
                        "_profile_available_bytes", "raise ValueError(")]
# The main process when a scheduler died during start-up: launch_server.py's top level down to
# engine.py _wait_for_scheduler_ready (node rank 0's path).
SCHEDULER_DIED_FRAMES = [
    ("sglang/launch_server.py", 84, "<module>", "run_server(server_args)"),
    ("sglang/launch_server.py", 67, "run_server", "launch_server(server_args)"),
    ("sglang/srt/entrypoints/http_server.py", 3156, "launch_server",
     ") = Engine._launch_subprocesses("),
    ("sglang/srt/entrypoints/engine.py", 1350, "_launch_subprocesses",
     "scheduler_init_result.wait_for_ready()"),
    ("sglang/srt/entrypoints/engine.py", 995, "wait_for_ready",
     "infos = _wait_for_scheduler_ready(scheduler_pipe_readers, scheduler_procs)"),
    ("sglang/srt/entrypoints/engine.py", 2029, "_wait_for_scheduler_ready",
     "raise _scheduler_died_error(i, scheduler_procs[i])"),
]
# The frames of every traceback the simulator prints as SGLang's (checked against the release).
ALL_FRAME_STACKS: list[list[tuple[str, int, str, str]]] = []


def no_kv_memory(mem_fraction_static: float, available_gb: float, pre_gb: float) -> str:
    """kv_cache_configurator.py _profile_available_bytes, when the weights take the budget."""
    minimum = 1 - available_gb / pre_gb
    suggested = math.ceil(minimum * 1000) / 1000
    return (f"Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={mem_fraction_static}. Raise --mem-fraction-static above "
            f"{suggested:.3f} (minimum viable = 1 - available/pre = {minimum:.4f}). If using "
            f"speculative decoding, draft weights are now counted.")


def exception_name(error: BaseException) -> str:
    """The name a traceback's final line gives an exception: builtins bare, others qualified
    (the stand-ins for torch's errors carry torch's module)."""
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == "builtins" else \
        f"{cls.__module__}.{cls.__qualname__}"


def scheduler_traceback(phase: str, error: BaseException, overlap: bool = True) -> str:
    """A scheduler's exception as SGLang's traceback: the frames of the phase it struck in,
    with the exception it was raised from first (`raise ... from`)."""
    if isinstance(error, SGLangError):
        return error.traceback_text()
    frames = phase_frames(phase, overlap)
    parts = []
    cause = error.__cause__
    if cause is not None:
        parts.append(frames_traceback(frames, cause) + "\n"
                     "The above exception was the direct cause of the following exception:\n\n")
    parts.append(frames_traceback(frames, error))
    return "".join(parts)


def frames_traceback(frames: list[tuple[str, int, str, str]], error: BaseException) -> str:
    text = str(error)
    final = f"{exception_name(error)}: {text}" if text else exception_name(error)
    return SGLangError(frames).traceback_text().rsplit("\n", 2)[0] + f"\n{final}\n"


# Where a scheduler waits for the other ranks: torch's TCP rendezvous at --dist-init-addr,
# reached from the scheduler's start through SGLang's distributed bootstrap (its files, 0.5.23)
# and torch.distributed's (the reference environment's torch 2.14.1, SGLang 0.5.23's pin).
RENDEZVOUS_FRAMES = [
    ("sglang/srt/managers/scheduler.py", 6362, "run_scheduler_process",
     "scheduler = Scheduler(server_args, port_args)"),
    ("sglang/srt/managers/scheduler.py", 536, "__init__", "bootstrap.init_parallel_runtime("),
    ("sglang/srt/distributed/bootstrap.py", 152, "init_parallel_runtime",
     "_init_parallel_groups("),
    ("sglang/srt/distributed/bootstrap.py", 322, "_init_parallel_groups",
     "init_distributed_environment("),
    ("sglang/srt/distributed/parallel_state.py", 2517, "init_distributed_environment",
     "torch.distributed.init_process_group("),
    ("torch/distributed/c10d_logger.py", 83, "wrapper", "return func(*args, **kwargs)"),
    ("torch/distributed/c10d_logger.py", 97, "wrapper", "func_return = func(*args, **kwargs)"),
    ("torch/distributed/distributed_c10d.py", 2546, "init_process_group",
     "store, rank, world_size = next(rendezvous_iterator)"),
    ("torch/distributed/rendezvous.py", 248, "_tcp_rendezvous_handler",
     "store = _create_c10d_store("),
    ("torch/distributed/rendezvous.py", 215, "_create_c10d_store", "return TCPStore("),
]


def store_wait_timeout(elapsed_s: int, joined: int, world: int) -> str:
    """TCPStore::waitForWorkers on the store's host (world rank 0)."""
    return (f"Timed out after {elapsed_s} seconds waiting for clients. "
            f"{joined}/{world} clients joined.")


def client_connect_timeout(timeout_ms: int, host: str, port: int) -> str:
    """c10d socket.cpp: a rank that never reached the store's host."""
    return (f"The client socket has timed out after {timeout_ms}ms while trying to connect to "
            f"({host}, {port}).")


def store_listen_failed(port: int, errno_: int) -> str:
    """c10d socket.cpp: the store's host cannot listen on --dist-init-addr's port (libuv's
    error name and message)."""
    names = {errno.EADDRINUSE: ("EADDRINUSE", "address already in use"),
             errno.EADDRNOTAVAIL: ("EADDRNOTAVAIL", "address not available"),
             errno.EACCES: ("EACCES", "permission denied")}
    name, message = names.get(errno_, (errno.errorcode.get(errno_, "EIO"),
                                       os.strerror(errno_).lower()))
    return (f"The server socket has failed to listen on any local network address. port: "
            f"{port}, useIpv6: false, code: -{errno_}, name: {name}, message: {message}")


def write_socket_timeout(message: str) -> None:
    """c10d's own log line of the connect timeout (glog, to stderr)."""
    sys.stderr.write(f"[E{_glog_stamp()} socket.cpp:1028] [c10d] {message}\n")
    sys.stderr.flush()


# A model whose attention heads the attention TP does not divide fails while the scheduler
# builds it (the frames between the scheduler and the attention layer are left out).
_BUILD = _RUN
HEADS_FRAMES = {
    "MLA": [_BUILD,
            ("sglang/srt/models/deepseek_v2.py", 2623, "__init__",
             "self.self_attn = DeepseekV2AttentionMLA("),
            ("sglang/srt/models/deepseek_v2.py", 2057, "__init__",
             "assert num_heads % attn_tp_size == 0")],
    "MHA": [_BUILD,
            ("sglang/srt/models/llama.py", 183, "__init__",
             "assert self.total_num_heads % tp_size == 0")],
}

ALL_FRAME_STACKS += [*SCHEDULER_FRAMES.values(), *SERVING_FRAMES.values(), NO_KV_MEMORY_FRAMES,
                     SCHEDULER_DIED_FRAMES, REMOTE_INSTANCE_FRAMES,
                     RENDEZVOUS_FRAMES, *HEADS_FRAMES.values()]
