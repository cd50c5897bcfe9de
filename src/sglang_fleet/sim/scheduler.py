"""A simulated `sglang::scheduler_TP<i>` worker: loads weights, allocates KV, captures graphs.

Started by the simulated main process, one per TP rank on this node. It holds its simulated GPU
device open, records its memory in the GPU ledger, prints SGLang's lines with the rank prefix
(rank 0 also draws the tqdm bars, redrawn with carriage returns as in 0.5.23), and fails where a
fault or a matching Rule says so.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import sys
import time

from setproctitle import setproctitle

from sglang_fleet.sim.runtime import GB, SimRuntime, clock, load_runtime, log
from sglang_fleet.sim.server_args import cuda_graph_enabled, prepare_server_args
from sglang_fleet_node import sglang_fleet_simgpu as simgpu

PR_SET_PDEATHSIG = 1
CAPTURE_BATCH_SIZES = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112,
                       120, 128, 136, 144, 152, 160]


def _die_with_parent(parent_pid: int) -> None:
    # SGLang's children set PR_SET_PDEATHSIG=SIGKILL; so do these.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


class Scheduler:
    def __init__(self, rt: SimRuntime, rank: int, status_fd: int):
        self.rt = rt
        self.rank = rank
        self.status = os.fdopen(status_fd, "w", buffering=1)
        self.prefix = f" TP{rank}"
        self.gpu = rt.gpu_index(rank)
        self.total = rt.devices[self.gpu]["memory_total"]
        self.used = 0
        self.leak = rt.has("leak_memory")
        # Held open for the process's life, as a CUDA process holds /dev/nvidiaN.
        self.device = open(simgpu.device_path(rt.gpu_dir, self.gpu), "rb")  # noqa: SIM115

    def avail_gb(self) -> float:
        return (self.total - self.used) / GB

    def hold(self, extra_bytes: float) -> None:
        self.used += int(extra_bytes)
        simgpu.record_allocation(self.rt.gpu_dir, self.gpu, os.getpid(), self.used,
                                 held_after_exit=self.leak)

    def bar(self, text: str, last: bool) -> None:
        if self.rank == 0:
            sys.stderr.write(("\r" if not last else "\r") + text + ("\n" if last else ""))
            sys.stderr.flush()

    def check_fault(self, phase: str) -> None:
        fault = self.rt.fault_at(phase)
        if fault is None:
            return
        if fault.kind == "xid":
            if self.rank == 0:
                kmsg = os.path.join(os.path.dirname(self.rt.gpu_dir.rstrip("/")), "kmsg")
                with open(kmsg, "a") as f:
                    f.write(f"{time.time():.3f} NVRM: Xid (PCI:0000:{self.gpu + 1:02x}:00): "
                            f"{fault.xid}, pid={os.getpid()}, name=sglang::scheduler_TP0, "
                            f"GPU has fallen off the bus.\n")
            self.hang(phase)
        if fault.kind == "hang":
            self.hang(phase)
        if fault.kind == "oom":
            need = self.rt.profile["kv_size_gb"]
            log("Scheduler hit an exception: Traceback (most recent call last):", self.prefix)
            sys.stdout.write(
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need:.2f} GiB. "
                f"GPU {self.gpu} has a total capacity of {self.total / GB:.2f} GiB of which "
                f"{self.avail_gb() * 0.1:.2f} GiB is free.\n")
            sys.stdout.flush()
            self.fail("CUDA out of memory")
        if fault.kind == "crash":
            message = fault.message or f"RuntimeError: simulated crash in {phase}"
            log("Scheduler hit an exception: Traceback (most recent call last):", self.prefix)
            sys.stdout.write(f'  File "sglang/srt/managers/scheduler.py", line 3012, in '
                             f"run_scheduler_process\n{message}\n")
            sys.stdout.flush()
            self.fail(message)

    def fail(self, message: str) -> None:
        self.status.write(f"failed {self.rank} {message}\n")
        self.status.flush()
        sys.exit(1)

    def hang(self, phase: str) -> None:
        """The incident's signature: alive, spinning, one byte to an event pipe a second."""
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        while True:
            if self.rank == 0:
                os.write(write_end, b"\x01")
                with contextlib.suppress(BlockingIOError):
                    os.read(read_end, 64)
                spin_until = time.monotonic() + 0.03
                while time.monotonic() < spin_until:
                    pass
            time.sleep(1.0 if self.rank == 0 else 5.0)

    def run(self) -> None:
        rt, p = self.rt, self.prefix
        time.sleep(rt.duration("launching"))
        self.check_fault("launching")

        log(f"Load weight begin. avail mem={self.avail_gb():.2f} GB", p)
        shards = int(rt.profile["weight_shards"])
        per_shard = rt.duration("loading_weights") / shards
        shard_files = sorted(f for f in os.listdir(rt.args.model_path)
                             if f.endswith(".safetensors"))
        start = time.monotonic()
        hang_at = shards // 2 if rt.fault_at("loading_weights") else None
        for i in range(1, shards + 1):
            if shard_files:
                # Reading the shard makes the process's I/O counters climb, as real loads do.
                with open(os.path.join(rt.args.model_path,
                                       shard_files[(i - 1) % len(shard_files)]), "rb") as f:
                    f.read()
            time.sleep(per_shard)
            elapsed = time.monotonic() - start
            remaining = per_shard * (shards - i)
            rate = elapsed / i if i else 0.0
            self.bar(f"Loading safetensors checkpoint shards: {100 * i / shards:3.0f}% Completed "
                     f"| {i}/{shards} [{clock(elapsed)}<{clock(remaining)}, {rate:5.2f}s/it]",
                     last=i == shards)
            if hang_at is not None and i == hang_at:
                self.check_fault("loading_weights")
        before = self.avail_gb()
        self.hold(rt.profile["weights_gb_per_gpu"] * GB)
        log(f"Load weight end. elapsed={time.monotonic() - start:.2f} s, type={rt.model_type}, "
            f"avail mem={self.avail_gb():.2f} GB, mem usage={before - self.avail_gb():.2f} GB.", p)

        time.sleep(rt.duration("allocating_kv_cache"))
        self.check_fault("allocating_kv_cache")
        self.hold(rt.profile["kv_size_gb"] * GB)
        log(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {rt.profile['kv_tokens']}, "
            f"KV size: {rt.profile['kv_size_gb']:.2f} GB", p)
        log(f"Memory pool end. avail mem={self.avail_gb():.2f} GB", p)

        if cuda_graph_enabled(rt.args):
            avail = self.avail_gb()
            log(f"Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                f"avail mem={avail:.2f} GB", p)
            sizes = CAPTURE_BATCH_SIZES
            if rt.args.cuda_graph_max_bs_decode:
                sizes = [b for b in sizes if b <= rt.args.cuda_graph_max_bs_decode] or [1]
            per_batch = rt.duration("capturing_cuda_graph") / len(sizes)
            start = time.monotonic()
            for n, bs in enumerate(reversed(sizes), start=1):
                elapsed = time.monotonic() - start
                done, total = n - 1, len(sizes)
                rate = done / elapsed if elapsed > 0 else 0.0
                eta = clock(per_batch * (total - done))
                self.bar(f"Capturing batches (bs={bs} avail_mem={avail:.2f} GB): "
                         f"{100 * done / total:3.0f}%|{'█' * (done * 10 // total):<10}| "
                         f"{done}/{total} [{clock(elapsed)}<{eta}, {rate:5.2f}it/s]", last=False)
                if n == 2:
                    self.check_fault("capturing_cuda_graph")
                time.sleep(per_batch)
            self.bar(f"Capturing batches (bs=1 avail_mem={avail:.2f} GB): 100%|{'█' * 10}| "
                     f"{len(sizes)}/{len(sizes)} [{clock(time.monotonic() - start)}<00:00]",
                     last=True)
            self.hold(0.95 * GB)
            log(f"Capture target decode CUDA graph end. bs={sorted(sizes)}, "
                f"elapsed={time.monotonic() - start:.2f} s, mem usage=0.95 GB, "
                f"avail mem={self.avail_gb():.2f} GB.", p)
        if self.rank == 0:
            log(f"max_total_num_tokens={rt.profile['kv_tokens']}, chunked_prefill_size=8192, "
                f"max_prefill_tokens={rt.args.max_prefill_tokens}, max_running_requests=2048, "
                f"context_len=262144, available_gpu_mem={self.avail_gb():.2f} GB", p)
        self.status.write(f"ready {self.rank}\n")
        self.status.flush()
        while True:  # serve forever; exits with the main process (PDEATHSIG) or on a signal
            signal.pause()


def main() -> None:
    parser = argparse.ArgumentParser(prog="sglang-sim-scheduler")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("server_argv", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    args = prepare_server_args(ns.server_argv[1:] if ns.server_argv[:1] == ["--"]
                               else ns.server_argv)
    title = f"sglang::scheduler_TP{ns.rank}" if args.tp_size > 1 else "sglang::scheduler"
    setproctitle(title)
    runtime = load_runtime(args)
    if not runtime.has("orphan_workers"):
        _die_with_parent(ns.parent_pid)
    Scheduler(runtime, ns.rank, ns.status_fd).run()


if __name__ == "__main__":
    main()
