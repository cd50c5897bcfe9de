"""The GPU layer: the simulated ledger and the NVML backend's failure handling."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from sglang_fleet.node.gpu import gpu, simgpu

GB = 1024**3


@pytest.fixture
def gpu_dir(tmp_path):
    import json
    devices = [{"index": i, "name": "sim", "uuid": f"GPU-{i}", "compute_capability": [12, 0],
                "memory_total": 96 * GB} for i in range(2)]
    (tmp_path / "devices.json").write_text(json.dumps(devices))
    return str(tmp_path)


def test_live_allocation_is_listed_and_released_when_the_process_exits(gpu_dir):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        simgpu.record_allocation(gpu_dir, 1, holder.pid, 10 * GB)
        snap = gpu.gpu_snapshot("simulated", gpu_dir)
        assert snap[1]["memory_used"] == 10 * GB
        assert snap[1]["processes"] == [{"pid": holder.pid, "used_memory": 10 * GB}]
        assert snap[0]["memory_used"] == 0 and snap[0]["compute_capability"] == "12.0"
    finally:
        holder.kill()
        holder.wait()
    assert gpu.gpu_snapshot("simulated", gpu_dir)[1]["memory_used"] == 0


def test_memory_held_after_exit_stays_without_a_process(gpu_dir):
    holder = subprocess.Popen([sys.executable, "-c", "pass"])
    holder.wait()
    simgpu.record_allocation(gpu_dir, 0, holder.pid, 5 * GB, held_after_exit=True)
    snap = gpu.gpu_snapshot("simulated", gpu_dir)
    assert snap[0]["memory_used"] == 5 * GB and snap[0]["processes"] == []


def test_missing_simulated_gpus_are_a_clear_error(tmp_path):
    with pytest.raises(gpu.GpuUnavailable, match="simulated GPUs unreadable"):
        gpu.gpu_snapshot("simulated", str(tmp_path / "none"))


def test_a_hung_query_times_out_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(gpu.GpuQueryTimeout, match="did not answer"):
        gpu._with_timeout(lambda: time.sleep(5), timeout=0.2)
    assert time.monotonic() - start < 2


def test_nvml_without_a_driver_is_reported_not_raised_raw():
    # This machine has no NVIDIA driver: NVML init fails and says so.
    with pytest.raises(gpu.GpuUnavailable, match="NVML"):
        gpu.gpu_snapshot("nvml", timeout=10)
