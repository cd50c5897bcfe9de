"""The simulator's command line: SGLang's own parser, rebuilt from the pinned release's catalogue.

SGLang builds an `argparse.ArgumentParser(prog="sglang serve")` with default abbreviation, so
`--tp 8` works as a prefix and an unknown flag ends with argparse's "unrecognized arguments"
error and exit status 2. The catalogue (sglang_fleet.known.catalogue, generated from the real
package) carries every option with its aliases, types, choices and defaults, so this parser
accepts and refuses exactly what the real one does (tests/reference checks it against the real
parser).
The release is SGLANG_SIM_VERSION (the deploy sets it to the pinned release), default 0.5.23.

After the parser, the release itself decides: the controller ran its resolution pipeline on
this server's command line before the deploy (known.release_check), and the server reads that
verdict by its configuration hash (SGLANG_FLEET_CONFIG) from the controller's cache on this
machine. Where there is none (a server started by hand, a cache elsewhere) or the release's
resolution could not run there, the simulator says so once and runs its own copies of some
of 0.5.23's checks (known.sglang_checks).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from sglang_fleet.known.catalogue import Catalogue, catalogue
from sglang_fleet.known.release_check import config_verdict, needs_gpu_build
from sglang_fleet.known.sglang_checks import CHECKS, refusals
from sglang_fleet.sim.args.config_file import FLAG, ConfigMerger
from sglang_fleet.sim.args.version import VERSION
from sglang_fleet.sim.engine.failures import refusal_error, verdict_error
from sglang_fleet.sim.engine.logline import log

# The configuration hash a deploy gives each server (launch.spec.CONFIG_VAR): not imported,
# since the LaunchSpec builder is much more than a server's start needs.
CONFIG_VAR = "SGLANG_FLEET_CONFIG"


def build_parser() -> argparse.ArgumentParser:
    # A release only the controller's cache holds: the deploy names its catalogue's file.
    path = os.environ.get("SGLANG_SIM_CATALOGUE")
    if path:
        return Catalogue(json.loads(Path(path).read_text(encoding="utf-8"))).build_parser()
    return catalogue(VERSION).build_parser()


def release_verdict() -> dict[str, Any] | None:
    """The pinned release's verdict on this server's command line, where the release decided
    its resolution; else None, said once in the log with the reason."""
    verdict, missing = config_verdict(VERSION, os.environ.get(CONFIG_VAR))
    if verdict is None:
        pass
    elif verdict["ok"] and verdict["parse_only"]:
        missing = (f"SGLang {VERSION} ran only its parser on the controller (it had no "
                   f"config.json for the model)")
    elif needs_gpu_build(verdict):
        missing = (f"SGLang {VERSION}'s resolution could not run on the controller "
                   f"({' '.join(verdict['error'])})")
    else:
        return verdict
    copies = len(CHECKS.get(VERSION, ()))
    log(f"No verdict of SGLang {VERSION}'s own checks for this command line: {missing}. " + (
        f"The simulator runs its own copies of {copies} of them instead." if copies else
        f"The simulator has no copy of SGLang {VERSION}'s checks after its parser."))
    return None


class SimServerArgs(argparse.Namespace):
    """The parsed arguments, with ServerArgs' two steps that refuse a configuration before any
    worker starts: resolve_once (argument resolution) and check_server_args, which here also
    holds the parallel-topology check that SGLang's publish makes right after it. The release's
    own verdict decides (release_verdict); without one, each step raises the error, message
    and traceback of the simulator's copy of SGLang's check (known.sglang_checks)."""

    _verdict: dict[str, Any] | None = None
    _asked = False

    def _refuse(self, stages: tuple[str, ...]) -> None:
        if not self._asked:
            self._asked, self._verdict = True, release_verdict()
        if self._verdict is not None:
            # SGLang stops at its first refusal: resolution comes first.
            if not self._verdict["ok"] and "resolve" in stages:
                raise verdict_error(self._verdict)
            return
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
