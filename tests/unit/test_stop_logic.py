"""The stop sequence's safety rules and GPU verification, on real processes and a simulated
GPU ledger."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_fleet.testfleet.local import wait_for
from sglang_fleet_node import sglang_fleet_procs as procs
from sglang_fleet_node import sglang_fleet_simgpu as simgpu
from sglang_fleet_node.sglang_fleet_stop import (
    aggressive_targets,
    protected,
    reset_gpu,
    verify_released,
)

GB = 1 << 30
HOLD = ("import sys, time\nf = [open(p, 'rb') for p in sys.argv[1:]]\n"
        "print('ready', flush=True)\ntime.sleep(60)\n")


@pytest.fixture
def gpu_dir(tmp_path):
    devices = [{"index": i, "name": "sim", "uuid": f"G{i}", "compute_capability": [12, 0],
                "memory_total": 96 * GB} for i in range(2)]
    (tmp_path / "devices.json").write_text(json.dumps(devices))
    for i in range(2):
        (tmp_path / f"nvidia{i}").touch()
    return tmp_path


def start(argv0, *args):
    proc = subprocess.Popen([argv0, "-c", HOLD, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("comm,cmdline,expected", [
    ("nvidia-persiste", "/usr/bin/nvidia-persistenced --user nvidia", True),
    ("nv-hostengine", "/usr/bin/nv-hostengine -n", True),
    ("dcgm-exporter", "/usr/bin/dcgm-exporter", True),
    ("python3", "python3 -m sglang.launch_server", False),
    ("nvidia-smi", "nvidia-smi -q", True),
])
def test_protected_agents(comm, cmdline, expected):
    assert protected({"comm": comm, "cmdline": cmdline}) is expected


def test_aggressive_sweep_spares_agents_bystanders_and_itself(gpu_dir, tmp_path):
    devices = {str(gpu_dir / "nvidia0"), str(gpu_dir / "nvidia1")}
    daemon_exe = tmp_path / "nvidia-persistenced"
    daemon_exe.symlink_to(sys.executable)
    daemon = start(str(daemon_exe), *sorted(devices))
    holder = start(sys.executable, str(gpu_dir / "nvidia1"))
    lookalike = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                  "sglang.launch_server"])
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_for(lambda: procs.process_info(lookalike.pid))
        found = {t["pid"] for t in aggressive_targets(devices)}
        assert holder.pid in found and lookalike.pid in found
        assert daemon.pid not in found and plain.pid not in found
        assert not procs.own_lineage() & found
    finally:
        for p in (daemon, holder, lookalike, plain):
            p.kill()
            p.wait()


def test_verify_waits_for_release_and_reports_holders(gpu_dir):
    holder = start(sys.executable)
    simgpu.record_allocation(str(gpu_dir), 0, holder.pid, 10 * GB)
    released, _, held = verify_released("simulated", str(gpu_dir), {holder.pid}, {}, 0.3)
    assert not released and held[0]["holders"][0]["pid"] == holder.pid
    assert held[0]["holders"][0]["state"] in ("S", "R")
    holder.kill()
    holder.wait()
    released, seconds, held = verify_released("simulated", str(gpu_dir), {holder.pid}, {}, 5)
    assert released and held == [] and seconds < 5


def test_memory_left_by_a_dead_process_needs_a_reset(gpu_dir):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    simgpu.record_allocation(str(gpu_dir), 1, dead.pid, 20 * GB, held_after_exit=True)
    released, _, held = verify_released("simulated", str(gpu_dir), set(), {}, 0.3)
    assert not released and held[0]["index"] == 1 and held[0]["holders"] == []
    ok, message = reset_gpu("simulated", str(gpu_dir), 1)
    assert ok and "reset" in message
    assert verify_released("simulated", str(gpu_dir), set(), {}, 1)[0]


def test_baseline_memory_of_others_does_not_count_as_held(gpu_dir):
    other = start(sys.executable)
    try:
        simgpu.record_allocation(str(gpu_dir), 0, other.pid, 30 * GB)
        released, _, _ = verify_released("simulated", str(gpu_dir), set(),
                                         {"0": 30 * GB, "1": 0}, 1)
        assert released
    finally:
        other.kill()
        other.wait()
