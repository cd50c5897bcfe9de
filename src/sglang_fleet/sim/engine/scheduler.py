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
import subprocess
import sys
import threading
import time

from setproctitle import setproctitle

from sglang_fleet.known.sglang_checks import resolved
from sglang_fleet.node.gpu import modelfit, simgpu
from sglang_fleet.sim.engine import failures, rendezvous
from sglang_fleet.sim.engine.bars import Bar
from sglang_fleet.sim.engine.graphs import CapturePlan
from sglang_fleet.sim.engine.handoff import read_args
from sglang_fleet.sim.engine.runtime import GB, VERSION, Fault, SimRuntime, load_runtime, log
from sglang_fleet.sim.engine.topology import SchedulerRank
from sglang_fleet.sim.frontend.control import Channel
from sglang_fleet.sim.srt.distributed.parallel_state import GroupCoordinator
from sglang_fleet.sim.srt.layers.deep_gemm_wrapper.compile_utils import (
    _maybe_compile_deep_gemm_one_type_all,
    deep_gemm_cache_dir,
    wedge_compile_lock,
)
from sglang_fleet.sim.srt.managers.scheduler_components.request_receiver import (
    SchedulerRequestReceiver,
)
from sglang_fleet.sim.srt.model_executor.runner.decode_cuda_graph_runner import (
    DecodeCudaGraphRunner,
)
from sglang_fleet.sim.srt.model_executor.runner.prefill_cuda_graph_runner import (
    PrefillCudaGraphRunner,
)
from sglang_fleet.sim.srt.model_loader import remote_instance, weight_utils
from sglang_fleet.sim.srt.utils.common import get_available_gpu_memory

PR_SET_PDEATHSIG = 1
COMMUNICATOR_GB = 0.25  # NCCL and custom all-reduce buffers per rank (simulated)
# model_executor/graph_memory_usage.py GRAPH_MEMORY_USAGE_KEYS
GRAPH_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode",
                "draft_extend")
# scheduler_components/internal_state.py _DECODE_GRAPH_PHASES
DECODE_GRAPH_PHASES = ("decode", "target_verify", "draft_decode", "draft_extend")
PREFILL_CAPTURE_S = "capturing_prefill_cuda_graph"  # profile key, seconds
# A weight read from storage reads a piece this often (real-world seconds), so that the read
# counters climb through a slow load as a real one's do.
READ_PIECE_EVERY_S = 5.0
MIN_READ_PIECE_EVERY_S = 0.02  # wall seconds: a compressed load's reads stay cheap
# DeepGEMM's warm-up compiles one kernel per M of this list (compile_utils.py's m_list for a
# prefill node, shortened).
DEEP_GEMM_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def pyspy_dump(pid: int) -> list[str]:
    """utils/cudacore_pyspy_dump_utils.py pyspy_dump_schedulers(): the watchdog runs py-spy (a
    dependency of SGLang) on its own process, natively and then not, through the shell, and
    logs what came back. Run here for real: where py-spy is missing, the shell says so, as it
    does under SGLang."""
    out = []
    for attempt, native_flag in enumerate(["--native", ""]):
        cmd = f"py-spy dump {native_flag} --pid {pid}".strip()
        result = subprocess.run(cmd, shell=True, capture_output=True, text=True)  # noqa: S602
        if result.returncode == 0:
            out.append(f"Pyspy dump for PID {pid} ({cmd}):\n{result.stdout}")
            break
        out.append(f"Pyspy failed ({cmd}). Error: {result.stderr}")
        if attempt == 1:
            out.append(f"All pyspy dump attempts failed for PID {pid}.")
    return out


def watchdog_report(debug_info: str, pid: int, timeout: float, soft: bool) -> list[str]:
    """What WatchdogRaw._watchdog_once logs when it fires, in order: dump_info, py-spy's
    dump, the timeout line."""
    return [debug_info, *pyspy_dump(pid), failures.watchdog_timeout_lines("Scheduler", timeout,
                                                                          soft)]


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


def quantization_log(config: dict) -> str | None:
    """configs/model_config.py get_quantization_config_log_str: the checkpoint's own
    quantization_config (config.json), never the flag: "quant=fp8, fmt=e4m3"."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or not quant:
        return None
    text = f"quant={quant.get('quant_method', 'quantized')}"
    for key in ("bits", "quant_algo", "fmt", "requantization_method"):
        if key in quant:
            text += f", {key}={quant[key]}"
    return text


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
        self.plan: CapturePlan = rt.capture_plan()
        self.channel: Channel | None = None
        self.store: object = None  # the rendezvous, held open for the rank's life
        # The event loop's state, as the watchdogs read it (scheduler.forward_ct and
        # cur_batch_for_debug): a batch runs while `in_batch`, the loop counts its turns.
        self.forward_ct = 0
        self.in_batch = False
        self.stick_next = False  # SIGUSR1's switch on the main process: the next batch hangs
        # The last batch's request: rid, input ids, max_new_tokens, temperature.
        self.batch: tuple[str, list[int], int, float] = ("", [], 1, 1.0)
        self.phase = "launching"  # where a Python exception's traceback says it was
        # What get_init_info and the internal state report (observability/startup_time.py
        # build_scheduler_startup_time; graph_memory_usage.py's phases).
        self.began = time.perf_counter()
        self.startup_available_gb = 0.0
        self.startup_time: dict = {"load_weight": 0.0, "kv_cache_allocation": 0.0,
                                   "scheduler_e2e": 0.0,
                                   "cuda_graph": dict.fromkeys(GRAPH_PHASES, 0.0)}
        self.graph_memory = dict.fromkeys(GRAPH_PHASES, 0.0)
        self.jit_warm = False  # DeepGEMM's kernels compiled (at the first captured forward)

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
            self.collective_hangs()
        if kind == "hang_generation":
            self.stuck()
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
        if fault.kind == "killed" and self.channel is not None:
            self.stuck()  # the peers of a killed rank wait in their next collective
        if fault.kind == "hang":
            self.hang_here()
        raise SimHang()

    def error_of(self, fault: Fault) -> BaseException | None:
        """The Python error SGLang (or torch under it) raises for a fault, logged first where
        SGLang logs it."""
        kind = fault.kind
        if kind == "oom":
            reserved = min(self.used, 1 << 28)
            return failures.OutOfMemoryError(failures.cuda_oom(
                self.rt.profile["kv_size_gb"] * GB, self.gpu, self.total,
                max(self.total - self.used, 0), self.used, self.used - reserved, reserved))
        if kind == "no_kv_memory":
            fraction = getattr(self.rt.args, "mem_fraction_static", None) or 0.8
            return failures.sglang_error("ValueError", failures.NO_KV_MEMORY_FRAMES,
                                         failures.no_kv_memory(fraction, self.avail_gb(),
                                                               self.startup_available_gb))
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

    def nccl_timeout_s(self) -> float:
        """The collective timeout: --dist-timeout, else torch's default for NCCL process
        groups (distributed_c10d default_pg_nccl_timeout: 10 minutes); SGLang leaves it
        unset by default."""
        return float(getattr(self.rt.args, "dist_timeout", None) or 600)

    def nccl_watchdog_abort(self) -> None:
        """A collective never completes: torch's NCCL watchdog aborts at the timeout."""
        timeout_s = self.nccl_timeout_s()
        time.sleep(timeout_s)
        world_rank = self.rank.pp_rank * self.rt.topology.tp + self.rank.tp_rank
        failures.write_nccl_watchdog_abort(world_rank, int(timeout_s * 1000),
                                           int(timeout_s * 1000) + 89, seq=1234)
        os.abort()  # std::terminate: SIGABRT, no Python exception handler runs

    def collective_hangs(self) -> None:
        """A collective never completes. Once the event loop runs (serving), the forward
        batch hangs with it and the scheduler's watchdog (--watchdog-timeout, 300 s) fires
        before torch's NCCL watchdog (10 min) unless the timeouts say otherwise; during
        start-up no scheduler watchdog runs yet and torch's aborts the process."""
        if self.channel is None:
            self.nccl_watchdog_abort()
        threading.Thread(target=self.nccl_watchdog_abort, daemon=True).start()
        self.stuck()

    def stuck(self) -> None:
        """A forward batch that never finishes (a hung kernel or collective): the event loop
        stops, nothing is acknowledged or answered, no tick is sent, and the watchdogs see a
        batch make no progress. Only the main process's SIGUSR1 switch ends it."""
        assert self.channel is not None
        self.in_batch = True
        self.channel.unstick.clear()
        self.channel.unstick.wait()
        self.in_batch = False
        self.stick_next = False

    def watchdog(self, timeout: float, soft: bool) -> None:
        """utils/watchdog.py WatchdogRaw over the event loop (create_scheduler_watchdog):
        active while a batch runs, fires when the loop's counter has not moved for
        `timeout` seconds (checked every timeout/2); a hard one SIGQUITs the parent 5 s
        after saying so. SGLang's timeouts run as configured, never compressed."""
        while True:
            last_counter, last_time = 0, time.perf_counter()
            while True:
                now = time.perf_counter()
                if self.in_batch:
                    if self.forward_ct == last_counter:
                        if now > last_time + timeout:
                            break
                    else:
                        last_counter, last_time = self.forward_ct, now
                time.sleep(timeout / 2)
            for line in watchdog_report(self.debug_info(), os.getpid(), timeout, soft):
                log(line, self.p)
            print(file=sys.stderr, flush=True)
            print(file=sys.stdout, flush=True)
            if not soft:
                time.sleep(5)  # "so that the parent process can print the error"
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.parent_pid, signal.SIGQUIT)

    def debug_info(self) -> str:
        """What the watchdog's dump_info says of the batch that stopped (no output yet)."""
        rid, input_ids, max_new_tokens, temperature = self.batch
        sampling = failures.sampling_params_repr(max_new_tokens, temperature)
        total = self.rt.kv_tokens()
        return failures.scheduler_debug_info(
            failures.req_repr(rid, input_ids, [], sampling),
            failures.full_pool_line(total, total - len(input_ids)))

    def hang_here(self) -> None:
        """A hang where the rank is, in SGLang's own frames (sim/srt), so that py-spy reads
        what it reads on a real rank: the group's barrier while launching, the all_reduce of
        get_available_gpu_memory while sizing the KV cache, a weight read that never returns
        (called inside weight_utils._load_file), and in graph capture (called inside
        capture_one_shape) TP rank 0 busy-waiting while its peers wait for it in all_reduce.
        Serving: TP rank 0 waits in the forward batch's all_reduce, its peers in
        recv_requests for the requests it broadcasts: a TP deadlock. Never returns."""
        group = GroupCoordinator()
        if self.phase == "launching":
            group.barrier()
        elif self.phase == "allocating_kv_cache":
            get_available_gpu_memory(group, distributed=True)
        elif self.phase == "serving" and self.rank.tp_rank != 0:
            SchedulerRequestReceiver(group).recv_requests()
        elif self.phase == "serving" or (self.phase == "capturing_cuda_graph"
                                         and self.rank.tp_rank != 0):
            group.all_reduce()
        self.hang()

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
            self.channel = Channel()
            self.status.write(f"ready {self.rank.dp_rank} {self.rank.pp_rank} "
                              f"{self.rank.tp_rank} {os.getpid()}\n")
            self.status.flush()
            self.serve()
        except SimHang:
            self.hang()
        except Exception as exc:
            # run_scheduler_process: get_exception_traceback(), SGLang's frames of the phase
            overlap = not getattr(self.rt.args, "disable_overlap_schedule", False)
            traceback = failures.scheduler_traceback(self.phase, exc, overlap)
            log(f"Scheduler hit an exception: {traceback}", self.p)
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
        self.init_parallel()
        self.strike("launching")
        self.phase = "loading_weights"
        self.load_weights()
        self.phase = "allocating_kv_cache"
        kv_began = time.perf_counter()
        time.sleep(rt.duration("allocating_kv_cache"))
        self.strike("allocating_kv_cache")
        self.allocate_kv_cache()
        self.startup_time["kv_cache_allocation"] = time.perf_counter() - kv_began
        self.phase = "capturing_cuda_graph"
        self.capture()
        self.phase = "serving"
        self.startup_time["scheduler_e2e"] = time.perf_counter() - self.began
        if self.rank.tp_rank == 0:
            log(f"max_total_num_tokens={rt.kv_tokens()}, "
                f"chunked_prefill_size={self.plan.chunked_prefill_size}, "
                f"max_prefill_tokens={getattr(rt.args, 'max_prefill_tokens', 16384)}, "
                f"max_running_requests={getattr(rt.args, 'max_running_requests', None) or 2048}, "
                f"context_len={rt.context_len()}, available_gpu_mem={self.avail_gb():.2f} GB",
                self.p)

    def init_parallel(self) -> None:
        """distributed/bootstrap.py init_parallel_runtime and measure_pre_model_load_memory:
        a multi-node server's ranks meet at --dist-init-addr first (sim/rendezvous.py); the
        communicators then take a little memory on each GPU."""
        rt, topo = self.rt, self.rt.topology
        began = time.perf_counter()
        log("Init parallel begin.", self.p)
        if topo.nnodes > 1:
            self.store = rendezvous.rendezvous(
                getattr(rt.args, "dist_init_addr", None) or "127.0.0.1:20000",
                topo.tp * topo.pp, rendezvous.world_rank(topo.tp, self.rank.pp_rank,
                                                         self.rank.tp_rank),
                getattr(rt.args, "dist_timeout", None))
        log(f"Init parallel ends. elapsed={time.perf_counter() - began:.2f} s", self.p)
        before = self.avail_gb()
        if topo.tp * topo.pp > 1:
            self.hold(COMMUNICATOR_GB * GB)
        log(f"Memory baseline taken. mem usage={before - self.avail_gb():.2f} GB", self.p)

    def load_weights(self) -> None:
        rt, p = self.rt, self.p
        self.startup_available_gb = self.avail_gb()
        log(f"Load weight begin. avail mem={self.avail_gb():.2f} GB", p)
        self.build_model()
        shards = int(rt.profile["weight_shards"])
        per_shard = rt.duration("loading_weights") / shards
        start = time.monotonic()
        if remote_instance.effective_load_format(
                rt.args, VERSION, p, quiet=not self.rank.loads_with_bar) \
                == remote_instance.LOAD_FORMAT:
            remote_instance.load_model_from_remote_instance(rt.args, self.rank.tp_rank, p,
                                                            per_shard)
        else:
            self.load_shards(shards, per_shard)
        before = self.avail_gb()
        self.hold(rt.profile["weights_gb_per_gpu"] * GB)
        self.startup_time["load_weight"] = time.monotonic() - start
        quant = quantization_log(rt.model_config)
        log(f"Load weight end. elapsed={time.monotonic() - start:.2f} s, type={rt.model_type}, "
            + (f"{quant}, " if quant else "")
            + f"avail mem={self.avail_gb():.2f} GB, mem usage={before - self.avail_gb():.2f} GB.",
            p)

    def load_shards(self, shards: int, per_shard: float) -> None:
        """DefaultModelLoader: the checkpoint's shards from the node's own files."""
        rt = self.rt
        model_path = rt.args.model_path
        files = sorted(f for f in os.listdir(model_path) if f.endswith(".safetensors"))
        desc = ("Multi-thread loading shards" if loads_multithreaded(rt.args)
                else "Loading safetensors checkpoint shards")
        bar = Bar(desc, shards, shards_format=True, enabled=self.rank.loads_with_bar)
        hang_at = shards // 2 + 1 if rt.fault_at("loading_weights") else None

        def on_shard(i: int):
            if i > 1:
                bar.update()
            return (lambda: self.strike("loading_weights")) if i == hang_at else None

        # Reading each shard makes the process's I/O counters climb, as real loads do.
        paths = [os.path.join(model_path, files[(i - 1) % len(files)]) if files else os.devnull
                 for i in range(1, shards + 1)]
        # A shard streams in pieces, at least every READ_PIECE_EVERY_S of real-world time,
        # however slow the storage (a slow shard takes more pieces, not longer gaps).
        piece_every = max(min(READ_PIECE_EVERY_S * rt.time_factor, per_shard / 16),
                          MIN_READ_PIECE_EVERY_S)
        weight_utils.buffered_multi_thread_safetensors_weights_iterator(
            paths, per_shard, piece_every, on_shard)
        bar.update()
        bar.close()

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
                plan.prefill_sizes, seconds, 0.31, fault if in_prefill else None, "prefill")
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
                fault if in_decode else None, "decode")

    def deep_gemm_warmup(self) -> None:
        """DeepGEMM's JIT warm-up (compile_utils.py, "DeepGEMM warmup"), at the first forward
        that uses its kernels (the first captured shape), when SGLANG_SIM_JIT_WARMUP_S
        (real-world seconds for a cold cache) asks for one: one NVCC child per kernel the
        cache lacks, minutes each, the rank's stack unchanged meanwhile; a kernel the cache
        holds is a hit. With the `jit_hang` fault the group's compile lock is never
        released: every rank waits for it, no compiler runs."""
        seconds = float(os.environ.get("SGLANG_SIM_JIT_WARMUP_S") or 0) * self.rt.time_factor
        hangs = self.rt.has("jit_hang")
        if seconds <= 0 and not hangs:
            return
        cache = deep_gemm_cache_dir()
        if hangs and cache is not None:  # load_runtime refuses the fault without a cache
            wedge_compile_lock(cache)
        bar = Bar("DeepGEMM warmup", len(DEEP_GEMM_M), shards_format=False,
                  enabled=self.rank.draws_bars)
        major, minor = self.rt.compute_capability
        _maybe_compile_deep_gemm_one_type_all(list(DEEP_GEMM_M), seconds / len(DEEP_GEMM_M),
                                              bar.update, arch=f"{major}{minor}")
        bar.close()

    def capture_loop(self, begin: str, step: str, end: str, sizes: list[int], seconds: float,
                     usage_gb: float, fault: Fault | None, graph: str) -> None:
        start, before = time.monotonic(), self.avail_gb()
        log(begin.format(avail=before), self.p)
        bar = Bar("", len(sizes), shards_format=False, enabled=self.rank.draws_bars)
        per_size = seconds / max(len(sizes), 1)
        runner = DecodeCudaGraphRunner() if graph == "decode" else PrefillCudaGraphRunner()
        for n, size in enumerate(reversed(sizes), start=1):
            bar.set_description(step.format(size=size, avail=self.avail_gb()))
            strikes = n == 2 and fault is not None

            def forward(strikes: bool = strikes) -> None:
                if not self.jit_warm:  # the first forward compiles the JIT's kernels
                    self.jit_warm = True
                    self.deep_gemm_warmup()
                if strikes:
                    self.play(fault)
                time.sleep(per_size)

            runner.capture_one_shape(size, forward)
            bar.update()
        bar.close()
        self.hold(usage_gb * GB)
        self.startup_time["cuda_graph"][graph] = time.monotonic() - start
        self.graph_memory[graph] = usage_gb
        log(end.format(elapsed=time.monotonic() - start, usage=before - self.avail_gb(),
                       avail=self.avail_gb()), self.p)

    # --- serving ----------------------------------------------------------------------------
    def serve(self) -> None:
        """The event loop (scheduler.py event_loop_normal): takes the batches and control
        requests the main process sends, ticks, and plays the fault of the phase a batch
        reaches. The hard watchdog starts here (init_watch_dog_memory_saver_input_blocker
        runs after the model runner's start-up), the soft one with --soft-watchdog-timeout."""
        args, channel = self.rt.args, self.channel
        assert channel is not None
        for timeout, soft in ((getattr(args, "watchdog_timeout", 300), False),
                              (getattr(args, "soft_watchdog_timeout", None), True)):
            if timeout is not None:
                threading.Thread(target=self.watchdog, args=(timeout, soft), daemon=True,
                                 name="watchdog").start()
        while True:
            message = channel.next()
            if message is not None:
                self.handle(message)
            self.forward_ct += 1
            channel.tick()

    def handle(self, message: str) -> None:
        assert self.channel is not None
        verb, _, rest = message.partition(" ")
        if verb == "batch":
            phase, ident, rid, max_new_tokens, temperature, input_ids = rest.split(" ", 5)
            self.batch = (rid, json.loads(input_ids), int(max_new_tokens),  # cur_batch_for_debug
                          float(temperature))
            self.take_batch(phase, ident)
        elif verb == "ask":
            ident, what = rest.split(" ", 1)
            self.channel.reply(ident, self.answer(what))
        elif verb == "stick":
            self.stick_next = True
            if rest == "now":  # requests are running: the batch running now hangs
                self.stuck()

    def take_batch(self, phase: str, ident: str) -> None:
        """A batch reached this rank: it runs (acknowledged), or plays this phase's fault
        first. A fault that ends or hangs the rank never acknowledges."""
        assert self.channel is not None
        if self.stick_next:
            self.stuck()
        fault = self.fault(phase)
        if fault is not None and fault.kind == "decode_oom":
            self.channel.ack(ident)
            time.sleep(0.3)  # a few tokens out before the pool runs dry
        if fault is not None:
            self.play(fault)
        self.channel.ack(ident)

    def answer(self, what: str) -> dict:
        """A control request's answer, from the event loop."""
        if what == "internal_state":
            return self.internal_state()
        if what == "init_info":
            return self.init_info()
        return {"success": True}

    def init_info(self) -> dict:
        """Scheduler.get_init_info: what the handshake tells the main process
        (max_req_input_len as tp_worker.py derives it from the context and the pool)."""
        rt = self.rt
        max_req_len = min(rt.context_len() - 1, rt.kv_tokens() - 1)
        return {"status": "ready", "max_total_num_tokens": rt.kv_tokens(),
                "max_req_input_len": max_req_len - 5, "startup_time": self.startup_time,
                # hicache_storage.py disabled_l3_layout: no hierarchical cache here
                "hicache_object_layout": {
                    "enabled": False, "backend": None,
                    "page_size": getattr(rt.args, "page_size", None) or 1,
                    "hicache_object_layout": {"pools": []},
                    "reason": "Hierarchical cache is disabled"}}

    def internal_state(self) -> dict:
        """scheduler_components/internal_state.py get_internal_state's own fields (the
        resolved server arguments are the main process's to add): topology, memory
        (memory_usage.py build_memory_usage) and the disaggregation role, which every
        scheduler has ("null" without disaggregation) with its captured decode graphs
        (tp_worker.py get_decode_cuda_graph_bs)."""
        rt, topo = self.rt, self.rt.topology
        return {
            "world_size": topo.dp * topo.tp * topo.pp,
            "startup_time": self.startup_time,
            "effective_max_running_requests_per_dp":
                getattr(rt.args, "max_running_requests", None) or 2048,
            "memory_usage": {
                "weight": round(float(rt.profile["weights_gb_per_gpu"]), 3),
                "kvcache": round(float(rt.profile["kv_size_gb"]), 3),
                "startup_available": round(self.startup_available_gb, 3),
                "token_capacity": rt.kv_tokens(), "token_capacity_swa": None,
                "graph": {k: round(v, 3) for k, v in self.graph_memory.items()}},
            "disaggregation_mode": getattr(rt.args, "disaggregation_mode", None) or "null",
            "decode_cuda_graph_bs": list(self.plan.decode_sizes) if self.plan.decode else [],
            "decode_cuda_graph_memory_gb": round(
                sum(round(self.graph_memory[p], 3) for p in DECODE_GRAPH_PHASES), 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(prog="sglang-sim-scheduler")
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--dp-rank", type=int, default=-1)
    parser.add_argument("--pp-rank", type=int, required=True)
    parser.add_argument("--tp-rank", type=int, required=True)
    parser.add_argument("--args-fd", type=int, required=True)
    ns = parser.parse_args()
    rt = load_runtime(read_args(ns.args_fd))
    dp = None if ns.dp_rank < 0 else ns.dp_rank
    rank = next(r for r in rt.topology.schedulers(dp if not rt.topology.attention_dp else None)
                if r.pp_rank == ns.pp_rank and r.tp_rank == ns.tp_rank)
    setproctitle(rank.title)
    if not rt.has("orphan_workers"):
        die_with_parent(ns.parent_pid)
    Scheduler(rt, rank, ns.status_fd, ns.parent_pid).run()


if __name__ == "__main__":
    main()
