"""Where a server's JIT kernel caches live when sglang_server_kernel_cache is on: one folder per
key (SGLang release, GPU architecture, TP) under the deployment's root, which staging fills
from the controller before the server starts and harvests from a ready server after
(docs/weights.md, "Kernel caches"). The key is made here and only here.

What the releases read (their own source): 0.5.23 takes SGLANG_CACHE_DIR as the root of every
cache (sglang/srt/environ.py third_party_cache_defaults: Triton, inductor, CUDA's, TileLang,
FlashInfer's workspace base) and DeepGEMM's SGLANG_DG_CACHE_DIR defaults to <root>/deep_gemm;
its JIT kernel builds (SGLANG_JIT_CACHE_DIR) stay in ~/.cache/sglang/jit unless set.
0.5.4.post3 reads SGLANG_CACHE_DIR for torch.compile only and DeepGEMM's folder defaults to
~/.cache/deep_gemm. Every variable is therefore set explicitly, at 0.5.23's own layout, so that
both releases write into the one folder."""

from __future__ import annotations

import re

_KEY_PART = re.compile(r"[^A-Za-z0-9._-]")


def cache_key(version: str, compute_capability: str, tp: int) -> str:
    """'0.5.23-sm120-tp8': kernels compiled by one release for one GPU architecture at one TP
    size are the same kernels (each cache names its entries by their content within that)."""
    arch = str(compute_capability).replace(".", "")
    return f"{_KEY_PART.sub('_', str(version))}-sm{_KEY_PART.sub('_', arch)}-tp{int(tp)}"


def kernel_cache_view(root: str, version: str, compute_capability: str, tp: int
                      ) -> dict[str, object]:
    """The LaunchSpec's kernel_cache entry: the key, the node folders and the server's
    environment."""
    key = cache_key(version, compute_capability, tp)
    live = f"{root}/kernel-cache/{key}/live"
    env = {
        "SGLANG_CACHE_DIR": live,
        # 0.5.4.post3 does not derive DeepGEMM's folder from SGLANG_CACHE_DIR.
        "SGLANG_DG_CACHE_DIR": f"{live}/deep_gemm",
        "SGLANG_JIT_CACHE_DIR": f"{live}/jit",
        "TRITON_CACHE_DIR": f"{live}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{live}/inductor",
        "CUDA_CACHE_PATH": f"{live}/nv",
        "TILELANG_CACHE_DIR": f"{live}/tilelang",
        # FlashInfer appends .cache/flashinfer itself.
        "FLASHINFER_WORKSPACE_BASE": live,
    }
    return {"key": key, "live": live, "snapshots": f"{root}/kernel-cache/snapshots",
            "env": env}
