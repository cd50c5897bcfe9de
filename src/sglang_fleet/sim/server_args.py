"""The simulator's command line: SGLang 0.5.23's flags, parsed by argparse as SGLang does.

SGLang builds its parser with `argparse.ArgumentParser(prog="sglang serve")` and default
abbreviation, so `--tp 8` works as a prefix and an unknown flag ends with argparse's
"unrecognized arguments" error and exit status 2. This parser covers the flags fleets set;
a flag SGLang has but this list lacks is rejected, which errs on the side of a loud failure.
"""

from __future__ import annotations

import argparse

from sglang_fleet.catalog import sglang_versions

VERSION = "0.5.23"


def build_parser() -> argparse.ArgumentParser:
    release = sglang_versions()[VERSION]
    p = argparse.ArgumentParser(prog="sglang serve")
    a = p.add_argument
    a("--model-path", "--model", dest="model_path", type=str, required=True)
    a("--tokenizer-path", type=str)
    a("--served-model-name", type=str)
    a("--trust-remote-code", action="store_true")
    a("--revision", type=str)
    a("--context-length", type=int)
    a("--quantization", type=str)
    a("--kv-cache-dtype", type=str, default="auto",
      choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"])
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--tp-size", type=int, default=1)
    a("--dp-size", type=int, default=1)
    a("--ep-size", type=int, default=1)
    a("--pp-size", type=int, default=1)
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", type=str)
    a("--dist-timeout", type=int)
    a("--base-gpu-id", type=int, default=0)
    a("--attention-backend", type=str, choices=release["attention_backends"])
    a("--prefill-attention-backend", type=str, choices=release["attention_backends"])
    a("--decode-attention-backend", type=str, choices=release["attention_backends"])
    a("--sampling-backend", type=str, choices=["flashinfer", "pytorch"])
    a("--num-continuous-decode-steps", type=int, default=1)
    a("--disable-custom-all-reduce", action="store_true")
    a("--enable-dp-attention", action="store_true")
    a("--mem-fraction-static", type=float)
    a("--max-running-requests", type=int)
    a("--max-total-tokens", type=int)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--chunked-prefill-size", type=int)
    a("--schedule-policy", type=str, default="fcfs")
    a("--cuda-graph-max-bs-decode", type=int)
    a("--cuda-graph-max-bs-prefill", type=int)
    a("--cuda-graph-backend-decode", type=str, choices=["full", "piecewise", "disabled"])
    a("--disable-decode-cuda-graph", action="store_true")
    # Deprecated in 0.5.23 but still accepted.
    a("--disable-cuda-graph", action="store_true")
    a("--disable-radix-cache", action="store_true")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int)
    a("--api-key", type=str)
    a("--enable-metrics", action="store_true")
    a("--log-level", type=str, default="info")
    a("--log-requests", action="store_true")
    a("--watchdog-timeout", type=float, default=300)
    a("--skip-server-warmup", action="store_true")
    a("--random-seed", type=int)
    a("--reasoning-parser", type=str)
    a("--tool-call-parser", type=str)
    a("--speculative-algorithm", type=str)
    a("--speculative-num-steps", type=int)
    a("--speculative-eagle-topk", type=int)
    a("--speculative-num-draft-tokens", type=int)
    a("--moe-runner-backend", type=str)
    a("--show-time-cost", action="store_true")
    # Added for the simulator's fidelity to 0.5.23 (same dests and defaults as SGLang's).
    a("--cuda-graph-backend-prefill", type=str, choices=["full", "breakable", "disabled"])
    a("--disable-prefill-cuda-graph", action="store_true")
    a("--model-loader-extra-config", type=str, default="{}")
    a("--weight-loader-prefetch-checkpoints", action="store_true")
    a("--soft-watchdog-timeout", type=float)
    return p


def prepare_server_args(argv: list[str]) -> argparse.Namespace:
    """Same name and contract as sglang.srt.server_args.prepare_server_args."""
    args = build_parser().parse_args(argv)
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.nnodes > 1 and not args.dist_init_addr:
        build_parser().error("--dist-init-addr is required when --nnodes > 1")
    return args


def cuda_graph_enabled(args: argparse.Namespace) -> bool:
    return not (args.disable_cuda_graph or args.disable_decode_cuda_graph
                or args.cuda_graph_backend_decode == "disabled")
