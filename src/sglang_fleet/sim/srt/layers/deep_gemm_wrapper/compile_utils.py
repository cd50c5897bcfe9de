"""sglang/srt/layers/deep_gemm_wrapper/compile_utils.py: DeepGEMM's JIT warm-up compiles one
kernel per M ("DeepGEMM warmup" bar), each by an NVCC child process: minutes per kernel on a
cold cache, the rank's stack unchanged meanwhile, the compiler working.

The cache is DeepGEMM's own layout (csrc/jit/compiler.hpp): SGLang points DG_JIT_CACHE_DIR at
SGLANG_DG_CACHE_DIR (0.5.23: <SGLANG_CACHE_DIR>/deep_gemm unless set); a kernel is the folder
cache/kernel.<name>.<32 hex digits>/ holding kernel.cu and kernel.cubin, compiled into
tmp/<uuid>/ and renamed into place. A kernel whose cubin is there is a cache hit: no compiler,
no compile time (the warm-up still walks every M, as SGLang's does). The ranks of a node take
turns per kernel group under a lock in <cache>/locks (_local_rank_compile_lock), as 0.5.23
does, so the first compiles and the others find the cubins. DG_JIT_PRINT_COMPILER_COMMAND=1
prints each compile's command line, as DeepGEMM does.

A simulator limit: when neither SGLANG_DG_CACHE_DIR nor SGLANG_CACHE_DIR is set, the real
release caches under the service user's home; the simulator writes nothing there and compiles
every time."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

# The compiler child: a process titled `nvcc` that works for the kernel's time and exits.
_NVCC = ("import sys, time; from setproctitle import setproctitle; "
         "setproctitle('nvcc -O3 --ptxas-options=--register-usage-level=10 kernel.cu'); "
         "time.sleep(float(sys.argv[1]))")
KERNEL_NAME = "sm{arch}_fp8_gemm_1d2d"
GROUP = "GEMM_NT_F8F8BF16"
_WEDGED: list = []  # the `jit_hang` fault's lock, held for the process's life


def deep_gemm_cache_dir(env: dict[str, str] | None = None) -> Path | None:
    """DeepGEMM's cache folder as SGLang sets it, or None when neither variable is set."""
    env = os.environ if env is None else env
    if env.get("SGLANG_DG_CACHE_DIR"):
        return Path(env["SGLANG_DG_CACHE_DIR"])
    if env.get("SGLANG_CACHE_DIR"):
        return Path(env["SGLANG_CACHE_DIR"]) / "deep_gemm"
    return None


def kernel_dir(cache: Path, arch: str, m: int) -> Path:
    """cache/kernel.<name>.<digest>: the digest of what DeepGEMM hashes (name, compiler,
    flags, code), which here is the kernel's name and its shape."""
    name = KERNEL_NAME.format(arch=arch)
    digest = hashlib.sha256(f"{name}$$nvcc$$sm_{arch}$$m={m}".encode()).hexdigest()[:32]
    return cache / "cache" / f"kernel.{name}.{digest}"


def _lock_path(cache: Path) -> Path:
    locks = cache / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return locks / f"{GROUP}.lock"


@contextlib.contextmanager
def _local_rank_compile_lock(cache: Path) -> Iterator[None]:
    """The node's ranks take turns per kernel group (0.5.23's flock in <cache>/locks)."""
    with open(_lock_path(cache), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def wedge_compile_lock(cache: Path) -> None:
    """The `jit_hang` fault: the group's compile lock held by a compile that never lets go
    (wedged on its file system, or a lock on a network file system that a killed node's
    compile left), and no compiler running. The lock is taken on a file description of its
    own, kept for the process's life: flock locks belong to open file descriptions, so this
    rank's own _local_rank_compile_lock then waits for it as its peers do. The first rank
    to get here takes it; the others find it taken."""
    holder = open(_lock_path(cache), "w")  # noqa: SIM115 (held until the process ends)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder.close()  # a peer rank holds it already
        return
    _WEDGED.append(holder)


def _compile_one(cache: Path | None, arch: str, m: int, seconds: float) -> None:
    """The NVCC child for one kernel; with a cache, its folder written aside and renamed in."""
    if cache is None:
        subprocess.run([sys.executable, "-c", _NVCC, str(seconds)], check=False)
        return
    tmp = cache / "tmp" / uuid.uuid4().hex
    tmp.mkdir(parents=True)
    target = kernel_dir(cache, arch, m)
    if os.environ.get("DG_JIT_PRINT_COMPILER_COMMAND") == "1":
        print(f"Running NVCC command: cd {cache / 'tmp'} && nvcc {tmp / 'kernel.cu'} -cubin -o "
              f"{tmp / 'kernel.cubin'} --gpu-architecture=sm_{arch} -O3", flush=True)
    (tmp / "kernel.cu").write_text(f"// simulated DeepGEMM kernel {target.name}, M={m}\n")
    subprocess.run([sys.executable, "-c", _NVCC, str(seconds)], check=False)
    # 256 KiB, a small real cubin's size.
    (tmp / "kernel.cubin").write_bytes(hashlib.sha256(target.name.encode()).digest() * 8192)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(target)
    except OSError:  # another rank's copy is there already
        shutil.rmtree(tmp, ignore_errors=True)


def _maybe_compile_deep_gemm_one_type_all(m_list: list[int], seconds_each: float,
                                          step: Callable[[], None], arch: str = "120") -> None:
    """The group's compile under the node's lock (when there is a cache to share)."""
    cache = deep_gemm_cache_dir()
    with _local_rank_compile_lock(cache) if cache is not None else contextlib.nullcontext():
        _compile_deep_gemm_one_type_all(cache, m_list, seconds_each, step, arch)


def _compile_deep_gemm_one_type_all(cache: Path | None, m_list: list[int], seconds_each: float,
                                    step: Callable[[], None], arch: str = "120") -> None:
    for m in m_list:
        if cache is None or not (kernel_dir(cache, arch, m) / "kernel.cubin").is_file():
            _compile_one(cache, arch, m, seconds_each)
        step()
