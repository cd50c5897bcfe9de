"""The stop sequence's safety rules and GPU verification, on real processes and a simulated
GPU ledger."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sglang_fleet.node.gpu import simgpu
from sglang_fleet.node.process import procs
from sglang_fleet.node.process.stop import (
    aggressive_targets,
    protected,
    reset_gpu,
    verify_released,
)
from sglang_fleet.testfleet.local import wait_for

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
        targets, _ = aggressive_targets(devices, marker="test:ours", uid=0)
        found = {t["pid"] for t in targets}
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


def test_memory_of_a_deployment_started_after_the_baseline_is_not_held(gpu_dir):
    later = start(sys.executable)
    try:
        simgpu.record_allocation(str(gpu_dir), 0, later.pid, 40 * GB)
        released, _, _ = verify_released("simulated", str(gpu_dir), set(), {"0": 0, "1": 0}, 1)
        assert released
        # Memory nobody alive accounts for is still held.
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        simgpu.record_allocation(str(gpu_dir), 1, dead.pid, 20 * GB, held_after_exit=True)
        released, _, held = verify_released("simulated", str(gpu_dir), set(),
                                             {"0": 0, "1": 0}, 0.3)
        assert not released and [h["index"] for h in held] == [1]
    finally:
        later.kill()
        later.wait()


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


@pytest.fixture
def unit_cgroup():
    """A cgroup named like another deployment's systemd unit (no systemd is started: only the
    name=systemd hierarchy's folder, as systemd would make it). Removed after the test."""
    base = Path("/sys/fs/cgroup/systemd")
    if not (base / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.skip("needs root and the name=systemd cgroup hierarchy")
    slice_dir = base / "system.slice"
    made_slice = not slice_dir.exists()
    path = slice_dir / f"sglang-other-{uuid.uuid4().hex[:8]}.service"
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup here: {exc}")
    yield path
    wait_for(lambda: not (path / "cgroup.procs").read_text().strip(), timeout=10)
    path.rmdir()
    if made_slice:
        slice_dir.rmdir()


def test_aggressive_sweep_never_crosses_into_another_deployment(gpu_dir, unit_cgroup):
    """Every process that carries another deployment's marker, runs in its supervisor session
    or in its unit, or runs as another user, is spared, however SGLang-like it looks; only
    unmarked processes of the service user are swept, each with why. The sweep reads every
    process of the machine; the test judges only the ones it started (others may run
    SGLang-titled processes beside it)."""
    devices = {str(gpu_dir / "nvidia0"), str(gpu_dir / "nvidia1")}
    env = {k: v for k, v in os.environ.items() if k != procs.MARKER_VAR}
    marked = subprocess.Popen([sys.executable, "-c", HOLD, *sorted(devices)],
                              stdout=subprocess.PIPE, text=True,
                              env=dict(env, **{procs.MARKER_VAR: "node:other-a"}))
    # A supervisor session whose leader keeps its marker; its worker lost it (setproctitle).
    session = subprocess.Popen(
        ["/bin/sh", "-c", 'env -u SGLANG_FLEET_DEPLOYMENT "$0" -c "$1" "$2"; sleep 600',
         sys.executable, HOLD, str(gpu_dir / "nvidia0")], stdout=subprocess.PIPE, text=True,
        env=dict(env, **{procs.MARKER_VAR: "node:other-b"}), start_new_session=True)
    in_unit = subprocess.Popen([sys.executable, "-c", HOLD, str(gpu_dir / "nvidia1")],
                               stdout=subprocess.PIPE, text=True, env=env)
    (unit_cgroup / "cgroup.procs").write_text(str(in_unit.pid))
    # Its own session: the shell's `sleep` child goes with it below.
    other_user = subprocess.Popen(["/bin/sh", "-c", "sleep 600", "sglang::scheduler_TP0"],
                                  user=65534, group=65534, env=env, start_new_session=True)
    decoy_name = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                   "sglang.launch_server"], env=env)
    decoy_holder = start(sys.executable, str(gpu_dir / "nvidia1"))
    everyone = [marked, session, in_unit, other_user, decoy_name, decoy_holder]
    try:
        for p in (marked, session, in_unit):
            assert p.stdout.readline().strip() == "ready"
        wait_for(lambda: "sglang" in procs.process_info(decoy_name.pid)["cmdline"]
                 and "sglang" in procs.process_info(other_user.pid)["cmdline"])
        worker = next(p for p in procs.all_pids() if p != session.pid
                      and (procs.process_info(p) or {}).get("sid") == session.pid
                      and "-c" in procs.process_info(p)["cmdline"])
        targets, spared = aggressive_targets(devices, marker="node:ours",
                                             unit="sglang-ours.service", uid=0)
        ours = {p.pid for p in everyone} | {worker}
        targets = [t for t in targets if t["pid"] in ours]
        assert {t["pid"] for t in targets} == {decoy_name.pid, decoy_holder.pid}
        assert {t["pid"]: t["why"] for t in targets} == {
            decoy_name.pid: "SGLang-looking command line", decoy_holder.pid: "holds a GPU device"}
        why = {s["pid"]: s["why"] for s in spared}
        assert why[marked.pid] == "carries the marker of node:other-a"
        assert why[worker] == "in the session of node:other-b"
        assert why[in_unit.pid] == f"in the unit {unit_cgroup.name}"
        assert why[other_user.pid] == "runs as uid 65534, not the service user"
    finally:
        for p in everyone:
            p.kill()
        os.killpg(session.pid, 9)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(other_user.pid, 9)
        for p in everyone:
            p.wait()
