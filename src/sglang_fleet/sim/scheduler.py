"""A simulated `sglang::scheduler[_DP<d>][_PP<p>][_TP<t>][_EP<e>]` worker.

Started by the simulated main process (or, with data parallelism, by the simulated
data-parallel controller), one per rank on this node. It holds its simulated GPU device open,
records its memory in the GPU ledger, prints SGLang 0.5.23's start-up lines with its rank
prefix (TP rank 0 also draws the tqdm bars), and fails where a fault or one of SGLang's known
bugs says.

Modelled on sglang/srt/managers/scheduler.py (run_scheduler_process: "Scheduler hit an
exception", SIGQUIT to the parent; Scheduler.__init__'s max_total_num_tokens line),
sglang/srt/model_executor/model_runner.py (load_model), model_loader/loader.py
(DefaultModelLoader._get_weights_iterator: the multi-thread loader is the default; the
single-threaded "Loading safetensors checkpoint shards" loader runs when
--model-loader-extra-config sets enable_multithread_load false, or when
--weight-loader-prefetch-checkpoints is on without enable_multithread_load/num_threads),
mem_cache/memory_pool.py (_finalize_allocation_log), mem_cache/kv_cache_configurator.py
("Memory pool end"), model_runner_components/cuda_graph_setup.py (capture_cuda_graphs:
prefill before decode) and the runners' capture loops (reversed sizes, TP rank 0's bar).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback

from setproctitle import setproctitle

from sglang_fleet.sglang_checks import resolved
from sglang_fleet.sim import failures
from sglang_fleet.sim.bars import Bar
from sglang_fleet.sim.graphs import CapturePlan
from sglang_fleet.sim.runtime import GB, Fault, SimRuntime, load_runtime, log
from sglang_fleet.sim.server_args import prepare_server_args
from sglang_fleet.sim.topology import SchedulerRank
from sglang_fleet_node import sglang_fleet_modelfit as modelfit
from sglang_fleet_node import sglang_fleet_simgpu as simgpu

PR_SET_PDEATHSIG = 1
PREFILL_CAPTURE_S = "capturing_prefill_cuda_graph"  # profile key, seconds


def die_with_parent(parent_pid: int) -> None:
    # SGLang's children set PR_SET_PDEATHSIG=SIGKILL (utils/common.py
    # kill_itself_when_parent_died); so do these.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def write_kmsg(rt: SimRuntime, line: str) -> None:
    """The node's simulated kernel log (<gpu dir>/../kmsg), read like /dev/kmsg."""
    kmsg = os.path.join(os.path.dirname(rt.gpu_dir.rstrip("/")), "kmsg")
    with open(kmsg, "a") as f:
        f.write(f"{time.time():.3f} {line}\n")


def loads_multithreaded(args) -> bool:
    """loader.py DefaultModelLoader._get_weights_iterator's choice for safetensors."""
    try:
        extra = json.loads(getattr(args, "model_loader_extra_config", None) or "{}")
    except ValueError:
        extra = {}
    use = bool(extra.get("enable_multithread_load", True))
    prefetching = bool(getattr(args, "weight_loader_prefetch_checkpoints", False))
    if (use and prefetching and not getattr(args, "weight_loader_disable_mmap", False)
            and not {"enable_multithread_load", "num_threads"} & set(extra)):
        use = False  # prefetch falls back to the single-threaded loader
    return use


class SimHang(Exception):
    pass


class Scheduler:
    def __init__(self, rt: SimRuntime, rank: SchedulerRank, status_fd: int, parent_pid: int):
        self.rt = rt
        self.rank = rank
        self.p = rank.prefix
        self.status = os.fdopen(status_fd, "w", buffering=1)
        self.parent_pid = parent_pid
        self.gpu = rank.gpu_id
        self.total = 0
        self.used = 0
        self.leak = rt.has("leak_memory")
        self.device = None
        self.request = threading.Event()
        self.plan: CapturePlan = rt.capture_plan()

    # --- memory ---------------------------------------------------------------------------
    def avail_gb(self) -> float:
        return (self.total - self.used) / GB

    def hold(self, extra_bytes: float) -> None:
        self.used += int(extra_bytes)
        simgpu.record_allocation(self.rt.gpu_dir, self.gpu, os.getpid(), self.used,
                                 held_after_exit=self.leak)

    # --- faults ---------------------------------------------------------------------------
    def fault(self, phase: str) -> Fault | None:
        """The fault striking this rank in `phase`; most strike TP rank 0's replica only."""
        fault = self.rt.fault_at(phase)
        if fault is None:
            return None
        if self.rank.dp_rank not in (None, 0) and phase in ("warming_up", "serving"):
            return None  # with data parallelism a request-time fault strikes DP0
        return fault

    def strike(self, phase: str) -> None:
        """Play the start-up fault of `phase`, if any (raises for Python-level failures)."""
        fault = self.fault(phase)
        if fault is not None:
            self.play(fault)

    def play(self, fault: Fault) -> None:
        kind = fault.kind
        if kind in ("hang", "xid", "killed"):
            self.stop_dead(fault)
        if kind == "nccl_timeout":
            self.nccl_watchdog_abort()
        if kind == "scheduler_watchdog":
            self.scheduler_watchdog()
        error = self.error_of(fault)
        if error is not None:
            raise error

    def stop_dead(self, fault: Fault) -> None:
        """Faults that leave no Python error: a hang, a GPU off the bus, the OOM killer."""
        if fault.kind == "xid" and self.rank.tp_rank == 0:
            write_kmsg(self.rt, f"NVRM: Xid (PCI:0000:{self.gpu + 1:02x}:00): {fault.xid}, "
                                f"pid={os.getpid()}, name={self.rank.title[:15]}, GPU has "
                                f"fallen off the bus.")
        if fault.kind == "killed" and self.rank.tp_rank == 0:
            # The kernel's OOM killer: SIGKILL, nothing printed by the process itself.
            write_kmsg(self.rt, f"Out of memory: Killed process {os.getpid()} "
                                f"({self.rank.title[:15]}) total-vm:412345678kB, "
                                f"anon-rss:98765432kB, file-rss:0kB, shmem-rss:0kB, UID:0 "
                                f"pgtables:234567kB oom_score_adj:0")
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimHang()

    def error_of(self, fault: Fault) -> BaseException | None:
        """The Python error SGLang (or torch under it) raises for a fault, logged first where
        SGLang logs it."""
        kind = fault.kind
        if kind == "oom":
            need = self.rt.profile["kv_size_gb"]
            return failures.OutOfMemoryError(failures.cuda_oom(
                need, self.gpu, self.total / GB, max(self.avail_gb() * 0.1, 0.0)))
        if kind == "nccl_error":
            return failures.DistBackendError(failures.nccl_error())
        if kind == "not_enough_memory":
            return RuntimeError(failures.not_enough_memory(
                getattr(self.rt.args, "mem_fraction_static", None)))
        if kind in ("prefill_oom", "decode_oom"):
            stage = "Prefill" if kind == "prefill_oom" else "Decode"
            msg = failures.allocation_oom(stage, 8192 if stage == "Prefill" else 1, 0)
            log(msg, self.p)
            return RuntimeError(msg)
        if kind == "capture_failed":
            try:
                raise RuntimeError(fault.message or "CUDA error: out of memory")
            except RuntimeError as exc:
                error = Exception(f"Capture cuda graph failed: {exc}\n"
                                  f"{failures.CUDA_GRAPH_CAPTURE_FAILED_MSG}")
                error.__cause__ = exc  # `raise ... from exc`, as the capture runner does
                return error
        if kind == "prefill_capture_failed":
            exc = RuntimeError(fault.message or "CUDA error: out of memory")
            log(f"{type(exc).__name__}: {exc}\n"
                + failures.PREFILL_CUDA_GRAPH_CAPTURE_FAILED_MSG.format(
                    backend="breakable", suggestions=failures.BCG_FAILURE_HINT), self.p)
            return exc
        if kind == "crash":
            return RuntimeError((fault.message or f"simulated crash ({fault.source})")
                                .removeprefix("RuntimeError: "))
        return None

    def nccl_watchdog_abort(self) -> None:
        """A collective never completes: torch's watchdog aborts after --dist-timeout."""
        timeout_s = getattr(self.rt.args, "dist_timeout", None) or 600
        time.sleep(self.rt.scaled(timeout_s))
        world_rank = self.rank.pp_rank * self.rt.topology.tp + self.rank.tp_rank
        failures.write_nccl_watchdog_abort(world_rank, int(timeout_s * 1000),
                                           int(timeout_s * 1000) + 89, seq=1234)
        os.abort()  # std::terminate: SIGABRT, no Python exception handler runs

    def scheduler_watchdog(self) -> None:
        """A forward batch never finishes: utils/watchdog.py WatchdogRaw fires."""
        timeout = getattr(self.rt.args, "watchdog_timeout", 300)
        time.sleep(self.rt.scaled(timeout))
        log(failures.scheduler_debug_info("f3a1c2d4e5b6", [1000, 8919, 16838], []), self.p)
        log(failures.watchdog_timeout_lines("Scheduler", timeout, False), self.p)
        print(file=sys.stderr, flush=True)
        print(file=sys.stdout, flush=True)
        time.sleep(5)  # "so that the parent process can print the error"
        os.kill(self.parent_pid, signal.SIGQUIT)
        raise SimHang()

    def hang(self) -> None:
        """The incident's signature: alive, spinning, one byte to an event pipe a second."""
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        while True:
            if self.rank.tp_rank == 0:
                os.write(write_end, b"\x01")
                with contextlib.suppress(BlockingIOError):
                    os.read(read_end, 64)
                spin_until = time.monotonic() + 0.03
                while time.monotonic() < spin_until:
                    pass
            time.sleep(1.0 if self.rank.tp_rank == 0 else 5.0)

    # --- start-up ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.start_up()
            self.status.write(f"ready {self.rank.dp_rank} {self.rank.pp_rank} "
                              f"{self.rank.tp_rank} {os.getpid()}\n")
            self.status.flush()
            self.serve()
        except SimHang:
            self.hang()
        except Exception as exc:
            text = (exc.traceback_text() if isinstance(exc, failures.SGLangError)
                    else traceback.format_exc())
            log(f"Scheduler hit an exception: {text}", self.p)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.parent_pid, signal.SIGQUIT)

    def start_up(self) -> None:
        rt = self.rt
        time.sleep(rt.duration("launching"))
        if self.gpu >= len(rt.devices):
            raise RuntimeError(f"CUDA error: invalid device ordinal (GPU {self.gpu} of "
                               f"{len(rt.devices)} visible)")
        self.total = rt.devices[self.gpu]["memory_total"]
        # Held open for the process's life, as a CUDA process holds /dev/nvidiaN.
        self.device = open(simgpu.device_path(rt.gpu_dir, self.gpu), "rb")  # noqa: SIM115
        self.strike("launching")
        self.load_weights()
        time.sleep(rt.duration("allocating_kv_cache"))
        self.strike("allocating_kv_cache")
        self.allocate_kv_cache()
        self.capture()
        if self.rank.tp_rank == 0:
            log(f"max_total_num_tokens={rt.kv_tokens()}, "
                f"chunked_prefill_size={self.plan.chunked_prefill_size}, "
                f"max_prefill_tokens={getattr(rt.args, 'max_prefill_tokens', 16384)}, "
                f"max_running_requests={getattr(rt.args, 'max_running_requests', None) or 2048}, "
                f"context_len={rt.context_len()}, available_gpu_mem={self.avail_gb():.2f} GB",
                self.p)

    def load_weights(self) -> None:
        rt, p = self.rt, self.p
        log(f"Load weight begin. avail mem={self.avail_gb():.2f} GB", p)
        self.build_model()
        shards = int(rt.profile["weight_shards"])
        per_shard = rt.duration("loading_weights") / shards
        model_path = rt.args.model_path
        files = sorted(f for f in os.listdir(model_path) if f.endswith(".safetensors"))
        desc = ("Multi-thread loading shards" if loads_multithreaded(rt.args)
                else "Loading safetensors checkpoint shards")
        bar = Bar(desc, shards, shards_format=True, enabled=self.rank.loads_with_bar)
        start = time.monotonic()
        hang_at = shards // 2 if rt.fault_at("loading_weights") else None
        for i in range(1, shards + 1):
            if files:
                # Reading the shard makes the process's I/O counters climb, as real loads do.
                with open(os.path.join(model_path, files[(i - 1) % len(files)]), "rb") as f:
                    f.read()
            time.sleep(per_shard)
            bar.update()
            if hang_at is not None and i == hang_at:
                self.strike("loading_weights")
        bar.close()
        before = self.avail_gb()
        self.hold(rt.profile["weights_gb_per_gpu"] * GB)
        quant = getattr(rt.args, "quantization", None)
        log(f"Load weight end. elapsed={time.monotonic() - start:.2f} s, type={rt.model_type}, "
            + (f"quant={quant}, " if quant else "")
            + f"avail mem={self.avail_gb():.2f} GB, mem usage={before - self.avail_gb():.2f} GB.",
            p)

    def build_model(self) -> None:
        """The model's layers are built before its weights load: an attention layer whose
        heads the attention TP does not divide fails there, as SGLang's does."""
        shape = modelfit.model_shape(self.rt.model_config)
        values = resolved(vars(self.rt.args))
        attn_tp = values["tp_size"] // max(values.get("attn_dp_size", 1), 1)
        heads = shape["num_attention_heads"]
        if heads and attn_tp and heads % attn_tp:
            raise failures.sglang_error("AssertionError",
                                        failures.HEADS_FRAMES[shape["attention"]])

    def allocate_kv_cache(self) -> None:
        rt = self.rt
        size = float(rt.profile["kv_size_gb"])
        self.hold(size * GB)
        dtype, _ = rt.kv_dtype()
        if rt.model_family == "MLA":  # one latent buffer per layer
            sizes = f"KV size: {size:.2f} GB"
        else:
            sizes = f"K size: {size / 2:.2f} GB, V size: {size / 2:.2f} GB"
        log(f"KV Cache is allocated. dtype: {dtype}, #tokens: {rt.kv_tokens()}, {sizes}", self.p)
        log(f"Memory pool end. avail mem={self.avail_gb():.2f} GB", self.p)

    def capture(self) -> None:
        plan, rt = self.plan, self.rt
        fault = self.fault("capturing_cuda_graph")
        # A capture fault strikes decode capture (the incident's "Capturing batches"), or
        # prefill capture when only that runs; prefill_capture_failed strikes prefill capture.
        in_prefill = fault is not None and (fault.kind == "prefill_capture_failed"
                                             or not plan.decode)
        in_decode = fault is not None and fault.kind != "prefill_capture_failed"
        if plan.prefill:
            seconds = float(rt.profile.get(PREFILL_CAPTURE_S, 0.0)) * rt.time_factor
            self.capture_loop(
                "Capture target prefill CUDA graph begin. "
                f"backend={plan.prefill_backend}, num_tokens={plan.prefill_sizes}, "
                "avail mem={avail:.2f} GB",
                "Capturing prefill shape (num_tokens={size} avail_mem={avail:.2f} GB)",
                "Capture target prefill CUDA graph end. elapsed={elapsed:.2f} s, "
                "mem usage={usage:.2f} GB, avail mem={avail:.2f} GB.",
                plan.prefill_sizes, seconds, 0.31, fault if in_prefill else None)
        else:
            log("Disable prefill CUDA graph because cuda_graph_config resolved "
                "prefill.backend='disabled' (e.g. via --cuda-graph-backend-prefill=disabled or "
                "auto-disable rules).", self.p)
        if plan.decode:
            self.capture_loop(
                "Capture target decode CUDA graph begin. "
                f"backend={plan.decode_backend}, num_tokens_per_req=1, "
                "avail mem={avail:.2f} GB",
                "Capturing batches (bs={size} avail_mem={avail:.2f} GB)",
                f"Capture target decode CUDA graph end. bs={plan.decode_sizes}, "
                "elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB, avail mem={avail:.2f} GB.",
                plan.decode_sizes, rt.duration("capturing_cuda_graph"), 0.95,
                fault if in_decode else None)

    def capture_loop(self, begin: str, step: str, end: str, sizes: list[int], seconds: float,
                     usage_gb: float, fault: Fault | None) -> None:
        start, before = time.monotonic(), self.avail_gb()
        log(begin.format(avail=before), self.p)
        bar = Bar("", len(sizes), shards_format=False, enabled=self.rank.draws_bars)
        per_size = seconds / max(len(sizes), 1)
        for n, size in enumerate(reversed(sizes), start=1):
            bar.set_description(step.format(size=size, avail=self.avail_gb()))
            if n == 2 and fault is not None:
                self.play(fault)
            time.sleep(per_size)
            bar.update()
        bar.close()
        self.hold(usage_gb * GB)
        log(end.format(elapsed=time.monotonic() - start, usage=before - self.avail_gb(),
                       avail=self.avail_gb()), self.p)

    # --- serving ----------------------------------------------------------------------------
    def serve(self) -> None:
        """Idle until the main process says a batch reached this replica: SIGUSR1 during
        the warm-up, SIGUSR2 once serving; then play that phase's fault."""
        phases: list[str] = []

        def arrived(phase: str) -> None:
            phases.append(phase)
            self.request.set()

        signal.signal(signal.SIGUSR1, lambda *_: arrived("warming_up"))
        signal.signal(signal.SIGUSR2, lambda *_: arrived("serving"))
        while True:
            if not self.request.wait(3600):
                continue
            self.request.clear()
            while phases:
                fault = self.fault(phases.pop(0))
                if fault is not None:
                    if fault.kind == "decode_oom":
                        time.sleep(0.3)  # a few tokens out before the pool runs dry
                    self.play(fault)


def main() -> None:
    parser = argparse.ArgumentParser(prog="sglang-sim-scheduler")
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--dp-rank", type=int, default=-1)
    parser.add_argument("--pp-rank", type=int, required=True)
    parser.add_argument("--tp-rank", type=int, required=True)
    parser.add_argument("server_argv", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    argv = ns.server_argv[1:] if ns.server_argv[:1] == ["--"] else ns.server_argv
    rt = load_runtime(prepare_server_args(argv))
    dp = None if ns.dp_rank < 0 else ns.dp_rank
    rank = next(r for r in rt.topology.schedulers(dp if not rt.topology.attention_dp else None)
                if r.pp_rank == ns.pp_rank and r.tp_rank == ns.tp_rank)
    setproctitle(rank.title)
    if not rt.has("orphan_workers"):
        die_with_parent(ns.parent_pid)
    Scheduler(rt, rank, ns.status_fd, ns.parent_pid).run()


if __name__ == "__main__":
    main()
