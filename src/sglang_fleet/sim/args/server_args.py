"""The simulator's command line: SGLang's own parser, rebuilt from the pinned release's catalogue.

SGLang builds an `argparse.ArgumentParser(prog="sglang serve")` with default abbreviation, so
`--tp 8` works as a prefix and an unknown flag ends with argparse's "unrecognized arguments"
error and exit status 2. The catalogue (sglang_fleet.known.catalogue, generated from the real
package) carries every option with its aliases, types, choices and defaults, so this parser
accepts and refuses exactly what the real one does (tests/reference checks it against the real
parser).
The release is SGLANG_SIM_VERSION (the deploy sets it to the pinned release), default 0.5.23.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from sglang_fleet.known.catalogue import Catalogue, catalogue
from sglang_fleet.known.sglang_checks import refusals
from sglang_fleet.sim.args.config_file import FLAG, ConfigMerger
from sglang_fleet.sim.engine.failures import refusal_error

DEFAULT_VERSION = "0.5.23"
VERSION = os.environ.get("SGLANG_SIM_VERSION") or DEFAULT_VERSION


def build_parser() -> argparse.ArgumentParser:
    # A release only the controller's cache holds: the deploy names its catalogue's file.
    path = os.environ.get("SGLANG_SIM_CATALOGUE")
    if path:
        return Catalogue(json.loads(Path(path).read_text(encoding="utf-8"))).build_parser()
    return catalogue(VERSION).build_parser()


class SimServerArgs(argparse.Namespace):
    """The parsed arguments, with ServerArgs' two steps that refuse a configuration before any
    worker starts: resolve_once (argument resolution) and check_server_args, which here also
    holds the parallel-topology check that SGLang's publish makes right after it. Each raises
    SGLang's own error, message and traceback (sglang_fleet.known.sglang_checks)."""

    def _refuse(self, stages: tuple[str, ...]) -> None:
        for refusal in refusals(VERSION, vars(self)):
            if refusal.stage in stages:
                raise refusal_error(refusal)

    def resolve_once(self) -> None:
        self._refuse(("resolve",))

    def check_server_args(self) -> None:
        self._refuse(("check", "publish"))


def prepare_server_args(argv: list[str]) -> SimServerArgs:
    """Same name and contract as sglang.srt.server_args.prepare_server_args: parse, then fill
    the defaults SGLang derives after parsing that the simulator relies on. A `--config` YAML
file is merged first, by SGLang's rules (sglang_fleet.sim.args.config_file). Which CUDA graphs
    the flags leave on is sglang_fleet.sim.engine.graphs' business."""
    parser = build_parser()
    if FLAG in argv:  # SGLang merges only on the exact word; `--config=FILE` is ignored
        argv = ConfigMerger(parser).merge(argv)
    args = parser.parse_args(argv, namespace=SimServerArgs())
    # Older releases (0.5.4.post3) parse the long names and copy them over in
    # ServerArgs.from_cli_args: tp_size = tensor_parallel_size, and so on.
    for field, long_name in (("tp_size", "tensor_parallel_size"),
                             ("pp_size", "pipeline_parallel_size"),
                             ("dp_size", "data_parallel_size"),
                             ("ep_size", "expert_parallel_size")):
        if not hasattr(args, field) and hasattr(args, long_name):
            setattr(args, field, getattr(args, long_name))
    # As SGLang's `_launch_command`: the merged words, the config file's included.
    args._launch_command = " ".join(argv)
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    return args
