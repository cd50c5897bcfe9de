"""Kernel caches through real ansible-playbook runs on the simulated fleet (sglang_server_kernel_
cache on, the simulated DeepGEMM warm-up asked for by SGLANG_SIM_JIT_WARMUP_S): the first node
compiles its kernels and its live folder is harvested to the controller; the second node gets
the snapshot staged before its server starts and its warm-up finds every kernel in the cache
(no compiler run, measurably faster); a re-run moves nothing and changes nothing."""

from __future__ import annotations

import re

import pytest

from sglang_fleet.launch.kernel_cache import cache_key
from sglang_fleet.node.staging import kernel_cache as kc
from sglang_fleet.testfleet.staging import staging_fleet, stop_agents_under

pytestmark = pytest.mark.integration

KERNELS = 16  # the simulated warm-up's Ms
KEY = cache_key("0.5.23", "12.0", 8)  # the local inventory's release, GPUs and TP
COMPILE = "Running NVCC command:"
# tqdm's last redraw of the warm-up's bar: "DeepGEMM warmup: 100%|...| 16/16 [00:04<00:00,
# 3.85it/s]" (or "s/it" when slower than one kernel a second).
BAR = re.compile(r"DeepGEMM warmup: 100%\|[^|]*\| 16/16 \[[^,]*, *([\d.]+)(it/s|s/it)\]")


@pytest.fixture(scope="module")
def kc_fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kernel-cache")
    fleet, origin_port = staging_fleet(tmp, "sglang_stage_kernel_cache_port")
    fleet.extra.update({
        "sglang_server_kernel_cache": True,
        # 400 s of compiling on a cold cache (4 s at the fleet's time factor of 0.01), each
        # compile's command printed as DeepGEMM does with this variable.
        "sglang_server_extra_env": {"SGLANG_SIM_JIT_WARMUP_S": 400,
                                    "DG_JIT_PRINT_COMPILER_COMMAND": 1},
        "sglang_stage_kernel_cache_origin_port": origin_port,
        "sglang_stage_kernel_cache_dir": str(tmp / "kernel-caches"),
        # 4 MiB of simulated cubins at 1 MB/s: a few gate polls of progress.
        "sglang_stage_rate_limit": 1_000_000, "sglang_stage_piece_size": 65536,
        "sglang_stage_poll_interval": 1, "sglang_stage_stall_window": 30,
        "sglang_stage_linger": 3})
    fleet.store = tmp / "kernel-caches"
    yield fleet
    fleet.stop()
    fleet.kill_leftovers()
    stop_agents_under(tmp)


def _warmup_seconds(log: str) -> float:
    rate, unit = BAR.findall(log)[-1]
    return KERNELS / float(rate) if unit == "it/s" else KERNELS * float(rate)


def _live(fleet, host):
    return fleet.host_root(host) / "kernel-cache" / KEY / "live"


def _cubins(fleet, host):
    return sorted(p.parent.name for p in
                  (_live(fleet, host) / "deep_gemm" / "cache").glob("kernel.*/kernel.cubin"))


def test_the_first_node_compiles_and_its_cache_is_harvested(kc_fleet):
    fleet = kc_fleet
    run = fleet.deploy("--limit", "sim-node-1")
    assert run.rc == 0, run.output[-4000:]
    log = fleet.log_file("sim-node-1").read_text()
    assert log.count(COMPILE) == KERNELS, log[-3000:]
    assert len(_cubins(fleet, "sim-node-1")) == KERNELS
    assert re.search(r"GATE \[sim-node-1\]: progressing: harvesting_kernel_cache \d+/\d+ "
                     r"files", run.output), run.output[-4000:]
    snapshot = kc.latest(str(fleet.store), KEY)
    assert snapshot is not None
    assert sum(f["path"].endswith("kernel.cubin") for f in snapshot["files"]) == KERNELS


def test_the_second_node_gets_the_cache_staged_and_compiles_nothing(kc_fleet):
    fleet = kc_fleet
    run = fleet.deploy("--limit", "sim-node-2")
    assert run.rc == 0, run.output[-4000:]
    assert re.search(r"GATE \[sim-node-2\]: progressing: staging_kernel_cache \d+/\d+ files",
                     run.output), run.output[-4000:]
    assert run.output.index("staging_kernel_cache") < run.output.index(
        "GATE [sim-node-2]: ready")
    log = fleet.log_file("sim-node-2").read_text()
    assert COMPILE not in log, log[-3000:]
    assert _cubins(fleet, "sim-node-2") == _cubins(fleet, "sim-node-1")
    cold = _warmup_seconds(fleet.log_file("sim-node-1").read_text())
    warm = _warmup_seconds(log)
    assert warm < cold / 4, (warm, cold)
    assert "harvesting_kernel_cache" not in run.output  # nothing new compiled


def test_a_rerun_moves_nothing_and_changes_nothing(kc_fleet):
    fleet = kc_fleet
    before = kc.latest(str(fleet.store), KEY)
    run = fleet.deploy()
    assert run.rc == 0, run.output[-4000:]
    assert run.changed_hosts() == set(), run.output[-4000:]
    assert "staging_kernel_cache" not in run.output
    assert "harvesting_kernel_cache" not in run.output
    assert kc.latest(str(fleet.store), KEY) == before
