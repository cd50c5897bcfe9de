"""sglang/srt/layers/deep_gemm_wrapper/compile_utils.py: DeepGEMM's JIT warm-up compiles one
kernel per M ("DeepGEMM warmup" bar), each by an NVCC child process: minutes per kernel on a
cold cache, the rank's stack unchanged meanwhile, the compiler working."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

# The compiler child: a process titled `nvcc` that works for the kernel's time and exits.
_NVCC = ("import sys, time; from setproctitle import setproctitle; "
         "setproctitle('nvcc -O3 --ptxas-options=--register-usage-level=10 kernel.cu'); "
         "time.sleep(float(sys.argv[1]))")


def _compile_deep_gemm_one_type_all(m_list: list[int], seconds_each: float,
                                    step: Callable[[], None]) -> None:
    for _m in m_list:
        subprocess.run([sys.executable, "-c", _NVCC, str(seconds_each)], check=False)
        step()
