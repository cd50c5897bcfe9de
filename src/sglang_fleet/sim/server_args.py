"""The simulator's command line: SGLang's own parser, rebuilt from the pinned release's catalogue.

SGLang builds an `argparse.ArgumentParser(prog="sglang serve")` with default abbreviation, so
`--tp 8` works as a prefix and an unknown flag ends with argparse's "unrecognized arguments"
error and exit status 2. The catalogue (sglang_fleet.catalogue, generated from the real package)
carries every option with its aliases, types, choices and defaults, so this parser accepts and
refuses exactly what the real one does (tests/reference checks it against the real parser).
The release is SGLANG_SIM_VERSION (the deploy sets it to the pinned release), default 0.5.23.
"""

from __future__ import annotations

import argparse
import os

from sglang_fleet.catalogue import catalogue

DEFAULT_VERSION = "0.5.23"
VERSION = os.environ.get("SGLANG_SIM_VERSION") or DEFAULT_VERSION


def build_parser() -> argparse.ArgumentParser:
    return catalogue(VERSION).build_parser()


def prepare_server_args(argv: list[str]) -> argparse.Namespace:
    """Same name and contract as sglang.srt.server_args.prepare_server_args: parse, then fill
    the defaults SGLang derives after parsing that the simulator relies on."""
    args = build_parser().parse_args(argv)
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    return args


def _phase_backend(args: argparse.Namespace, phase: str) -> str | None:
    config = getattr(args, "cuda_graph_config", None) or {}
    return getattr(args, f"cuda_graph_backend_{phase}", None) or (
        config.get(phase) or {}).get("backend")


def decode_cuda_graph_enabled(args: argparse.Namespace) -> bool:
    """Decode graphs are captured unless some spelling of the release turns them off
    (sglang/srt/model_executor/cuda_graph_config.py: decode defaults to "full")."""
    return not (getattr(args, "disable_cuda_graph", False)
                or getattr(args, "disable_decode_cuda_graph", False)
                or _phase_backend(args, "decode") == "disabled")


def prefill_cuda_graph_enabled(args: argparse.Namespace) -> bool:
    """0.5.23 also captures prefill graphs on CUDA by default ("breakable"); releases without
    the prefill options (0.5.4) capture decode graphs only."""
    if not hasattr(args, "cuda_graph_backend_prefill"):
        return False
    return not (getattr(args, "disable_cuda_graph", False)
                or getattr(args, "disable_prefill_cuda_graph", False)
                or _phase_backend(args, "prefill") == "disabled")


def cuda_graph_enabled(args: argparse.Namespace) -> bool:
    """Whether decode graphs are captured: the capture Rules are about."""
    return decode_cuda_graph_enabled(args)
