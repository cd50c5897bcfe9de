# -*- coding: utf-8 -*-
# Stopping a deployment precisely and proving its GPUs free: the kill sequence the incident did
# with pkill/fuser and fixed sleeps, restricted to the deployment's members, escalating
# TERM -> KILL (straight to KILL for a server judged hung), then polling the GPUs until none of
# its processes is on them and memory is back to the pre-deploy baseline.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import signal
import subprocess
import time

try:
    from ansible.module_utils import sglang_fleet_gpu as gpu
    from ansible.module_utils import sglang_fleet_procs as procs
    from ansible.module_utils import sglang_fleet_simgpu as simgpu
except ImportError:  # imported by the controller package or its tests, outside Ansible
    from sglang_fleet_node import sglang_fleet_gpu as gpu
    from sglang_fleet_node import sglang_fleet_procs as procs
    from sglang_fleet_node import sglang_fleet_simgpu as simgpu

# Never signalled, whatever mode: GPU node agents. A SIGKILL of dcgm-exporter once froze an A100.
PROTECTED_NAMES = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "dcgmi",
                   "nvidia-smi", "nvidia-dcgm")
# What SGLang's own killall_sglang matches; used only in aggressive mode.
SGLANG_PATTERN = re.compile(r"sglang::|sglang\.launch_server|sglang serve|"
                            r"sglang_fleet\.sim\.launch_server")
# Memory a GPU may hold above its baseline and still count as released (driver bookkeeping).
RELEASE_SLACK_BYTES = 512 << 20


def protected(info):
    comm = info["comm"]
    exe = os.path.basename(info["cmdline"].split(" ", 1)[0])
    # The kernel cuts comm to 15 characters: "nvidia-persistenced" shows as "nvidia-persiste".
    return any(exe.startswith(p) or comm.startswith(p) or (len(comm) == 15 and p.startswith(comm))
               for p in PROTECTED_NAMES)


def aggressive_targets(device_paths):
    """Dedicated-node sweep: every SGLang-looking process and every holder of a GPU device,
    except the protected agents and this module's own lineage."""
    skip = procs.own_lineage()
    targets = []
    for pid in procs.all_pids():
        if pid in skip:
            continue
        info = procs.process_info(pid)
        if info is None or info["state"] in ("Z", "X") or protected(info):
            continue
        if SGLANG_PATTERN.search(info["cmdline"]) or holds_device(pid, device_paths):
            targets.append(info)
    return targets


def holds_device(pid, device_paths):
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) in device_paths:
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def device_paths(backend, sim_dir, count):
    if backend == "simulated":
        return set(simgpu.device_path(sim_dir, i) for i in range(count))
    return set("/dev/nvidia%d" % i for i in range(count))


def kill_members(marker, session_id, unit, hung, term_timeout, extra_targets=()):
    """Signal the deployment's members (and, in aggressive mode, extra targets); report each
    step with the pids, and what survived SIGKILL."""
    members = procs.deployment_processes(marker, session_id, unit)
    spared = [m for m in members if protected(m)]
    targets = dict((m["pid"], m) for m in members if not protected(m))
    for extra in extra_targets:
        targets.setdefault(extra["pid"], extra)
    report = {"term_sent": [], "kill_sent": [], "spared_protected": spared, "remaining": [],
              "targets": sorted(targets.values(), key=lambda x: x["pid"])}
    if not targets:
        return report
    pids = sorted(targets)
    if not hung:
        report["term_sent"] = procs.signal_pids(pids, signal.SIGTERM)
        pids = _wait_dead(pids, term_timeout)
    if pids:
        report["kill_sent"] = procs.signal_pids(pids, signal.SIGKILL)
        pids = _wait_dead(pids, 10.0)
    report["remaining"] = [procs.process_info(p) for p in pids if procs.process_info(p)]
    return report


def _alive(pid):
    info = procs.process_info(pid)
    return info is not None and info["state"] not in ("Z", "X")


def _wait_dead(pids, timeout, poll=0.05):
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(poll)
        left = [p for p in left if _alive(p)]
    return left


def verify_released(backend, sim_dir, member_pids, baseline, timeout, poll=0.1, gpu_timeout=10):
    """Poll until no member is on any GPU and each GPU is back to its baseline memory.

    Returns (released, seconds, held) where held lists the devices still held, with the
    holders' process states (D, Z) where known."""
    start = time.monotonic()
    while True:
        devices = gpu.gpu_snapshot(backend, sim_dir, gpu_timeout)
        held = []
        for d in devices:
            ours = [p for p in d["processes"] if p["pid"] in member_pids]
            base = (baseline or {}).get(str(d["index"]), 0)
            if ours or d["memory_used"] > base + RELEASE_SLACK_BYTES:
                held.append({"index": d["index"], "memory_used": d["memory_used"],
                             "baseline": base, "holders": [_holder(p) for p in d["processes"]]})
        elapsed = time.monotonic() - start
        if not held or elapsed >= timeout:
            return not held, elapsed, held
        time.sleep(poll)


def _holder(proc):
    info = procs.process_info(proc["pid"])
    return {"pid": proc["pid"], "used_memory": proc["used_memory"],
            "state": info["state"] if info else "gone",
            "cmdline": info["cmdline"] if info else ""}


def reset_gpu(backend, sim_dir, index):
    """Reset one GPU. Only called when nothing else is on it. Returns (ok, message)."""
    if backend == "simulated":
        ledger = os.path.join(sim_dir, simgpu.LEDGER_DIR)
        for name in os.listdir(ledger) if os.path.isdir(ledger) else []:
            if name.startswith("%d-" % index):
                os.unlink(os.path.join(ledger, name))
        return True, "simulated GPU %d reset" % index
    try:
        proc = subprocess.run(["nvidia-smi", "--gpu-reset", "-i", str(index)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, "nvidia-smi --gpu-reset -i %d failed: %s" % (index, exc)
    out = proc.stdout.decode("utf-8", "replace").strip()
    return proc.returncode == 0, out
