"""Real-GPU check of the NVML backend, for a machine with an NVIDIA GPU (not collected by pytest).

    python tests/gpu/nvml_check.py

Reads every GPU through sglang_fleet_gpu's NVML backend (count, names, compute capability,
memory), then starts a process that allocates 1 GiB through the CUDA driver API (libcuda via
ctypes, no framework needed) and checks that NVML lists that process with that memory, and
that the memory is released after the process is killed. Prints what it saw; exit 1 on a miss.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "module_utils"))
import sglang_fleet_gpu as gpu  # noqa: E402

HOLDER = r"""
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 30) == 0
print("holding", flush=True)
time.sleep(600)
"""


def main() -> int:
    devices = gpu.gpu_snapshot("nvml", timeout=20)
    for d in devices:
        print(f"GPU {d['index']}: {d['name']} cc {d['compute_capability']} "
              f"{d['memory_used'] / 2**30:.1f}/{d['memory_total'] / 2**30:.1f} GiB, "
              f"{len(d['processes'])} processes")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        seen = next((p for p in gpu.gpu_snapshot("nvml")[0]["processes"]
                     if p["pid"] == holder.pid), None)
        print(f"holder pid {holder.pid} seen by NVML: {seen}")
        if not seen or seen["used_memory"] < 1 << 30:
            return 1
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # release is asynchronous: poll, never a fixed sleep
        if all(p["pid"] != holder.pid for p in gpu.gpu_snapshot("nvml")[0]["processes"]):
            print("released after kill")
            return 0
        time.sleep(0.2)
    print("memory still held 30 s after kill")
    return 1


if __name__ == "__main__":
    sys.exit(main())
