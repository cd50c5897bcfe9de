"""A simulated `sglang::data_parallel_controller`, started when dp_size > 1.

Modelled on sglang/srt/managers/data_parallel_controller.py
(run_data_parallel_controller_process, launch_dp_schedulers, launch_tensor_parallel_group):
it launches each data-parallel replica's schedulers as its own children ("Launch DP{d}
starting at GPU #{base}."), then sits in its event loop. SGLang 0.5.23's controller installs
no SIGQUIT handler, so a scheduler's SIGQUIT (sent after "Scheduler hit an exception") ends it,
and it does not watch its schedulers: one that dies without that signal (a native abort, the
kernel's OOM killer) leaves the controller, and the main process, running. With attention
data parallelism the main process starts the schedulers itself and the controller only routes.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
from typing import Any

from setproctitle import setproctitle

from sglang_fleet.sim.engine.handoff import read_args, spawn_with_args
from sglang_fleet.sim.engine.runtime import load_runtime, log
from sglang_fleet.sim.engine.scheduler import die_with_parent


def spawn_scheduler(parent_pid: int, status_fd: int, dp_rank: int | None, pp_rank: int,
                    tp_rank: int, args: Any) -> subprocess.Popen:
    return spawn_with_args(
        "sglang_fleet.sim.engine.scheduler",
        ["--status-fd", str(status_fd), "--parent-pid", str(parent_pid),
         "--dp-rank", str(-1 if dp_rank is None else dp_rank), "--pp-rank", str(pp_rank),
         "--tp-rank", str(tp_rank)], args, (status_fd,))


def main() -> None:
    parser = argparse.ArgumentParser(prog="sglang-sim-dp-controller")
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--args-fd", type=int, required=True)
    ns = parser.parse_args()
    args = read_args(ns.args_fd)
    setproctitle("sglang::data_parallel_controller")
    die_with_parent(ns.parent_pid)
    # SIGQUIT keeps its default action (terminate); no core file from the simulator.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    topology = load_runtime(args).topology
    children = []
    if not topology.attention_dp:
        for dp_rank in range(topology.dp):
            ranks = topology.schedulers(dp_rank)
            log(f"Launch DP{dp_rank} starting at GPU #{dp_rank * topology.tp * topology.pp}.")
            children += [spawn_scheduler(os.getpid(), ns.status_fd, dp_rank, r.pp_rank,
                                         r.tp_rank, args) for r in ranks]
    os.close(ns.status_fd)
    while True:  # the event loop: routes requests, never looks at its schedulers
        signal.pause()


if __name__ == "__main__":
    main()
