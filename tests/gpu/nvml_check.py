"""Real-GPU check of the NVML backend, for a machine with an NVIDIA GPU (not collected by pytest).

    ./bootstrap && .venv/bin/python tests/gpu/nvml_check.py

Reads every GPU through module_utils/gpu/gpu's NVML backend (count, names, compute capability,
memory), then starts a process that allocates 1 GiB through the CUDA driver API (libcuda via
ctypes, no framework needed) and carries a deployment marker, checks that NVML lists it with
that memory, kills it through the stop logic recovery uses (membership, SIGKILL) and verifies
the release by polling NVML. Prints what it saw; exit 1 on a miss.
"""

from __future__ import annotations

import os
import subprocess
import sys

from sglang_fleet.node.gpu import gpu
from sglang_fleet.node.process.stop import kill_members, verify_released

MARKER = "gpu-check:nvml-holder"

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
    env = dict(os.environ, SGLANG_FLEET_DEPLOYMENT=MARKER)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                              env=env)
    assert holder.stdout.readline().strip() == "holding"
    seen = next((p for p in gpu.gpu_snapshot("nvml")[0]["processes"]
                 if p["pid"] == holder.pid), None)
    print(f"holder pid {holder.pid} seen by NVML: {seen}")
    report = kill_members(MARKER, None, None, hung=True, term_timeout=0)
    holder.wait()
    released, seconds, held = verify_released("nvml", None, {holder.pid}, {}, timeout=30)
    print(f"killed {[t['pid'] for t in report['targets']]} by membership; "
          f"released={released} after {seconds:.2f} s; held={held}")
    ok = seen is not None and seen["used_memory"] >= 1 << 30 and released
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
