# -*- coding: utf-8 -*-
# Stopping a deployment precisely and proving its GPUs free: the kill sequence the incident did
# with pkill/fuser and fixed sleeps, restricted to the deployment's members, escalating
# TERM -> KILL (straight to KILL for a server judged hung), then polling the GPUs until none of
# its processes is on them and memory is back to the pre-deploy baseline.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import subprocess
import time

from ..gpu import gpu, simgpu
from . import procs

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


def _other_deployment(info, marker, unit):
    """What ties a process to another deployment (its marker, its session leader's marker, or
    another sglang-fleet unit's cgroup), or None."""
    theirs = procs.marker_of(info["pid"])
    if theirs and theirs != marker:
        return "carries the marker of %s" % theirs
    if info["sid"] != info["pid"]:
        leader = procs.marker_of(info["sid"])
        if leader and leader != marker:
            return "in the session of %s" % leader
    for other in procs.units_of(info["pid"]):
        if other != unit and other.startswith("sglang-") and other.endswith(".service"):
            return "in the unit %s" % other
    return None


def aggressive_targets(device_paths, marker=None, unit=None, uid=None):
    """Dedicated-node sweep: every SGLang-looking process and every holder of a GPU device.

    Spared, whatever they look like: the protected GPU agents, this module's own lineage,
    processes of other users than `uid`, and every process that belongs to another deployment
    (its marker, session or unit). Returns (targets, spared), each process with `why`."""
    skip = procs.own_lineage()
    targets, spared = [], []
    for pid in procs.all_pids():
        if pid in skip:
            continue
        info = procs.process_info(pid)
        if info is None or info["state"] in ("Z", "X") or protected(info):
            continue
        if SGLANG_PATTERN.search(info["cmdline"]):
            why = "SGLang-looking command line"
        elif holds_device(pid, device_paths):
            why = "holds a GPU device"
        else:
            continue
        other = _other_deployment(info, marker, unit) if marker else None
        if other:
            spared.append(dict(info, why=other))
        elif uid is not None and info["uid"] != uid:
            spared.append(dict(info, why="runs as uid %s, not the service user" % info["uid"]))
        else:
            targets.append(dict(info, why=why))
    return targets, spared


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


def kill_members(marker, session, unit, hung, term_timeout, extra_targets=(), uid=None,
                 node_rank=0, log_file=None):
    """Signal the deployment's members (and, in aggressive mode, extra targets); report each
    step with the pids, and what survived SIGKILL. `session` is procs.recorded_session(state)
    (a recorded session is used only while its leader is the process recorded at start), or a
    bare session id, trusted only while its leader carries the marker."""
    if session is not None and not isinstance(session, dict):
        session = {"session_id": int(session)}
    found = procs.membership(marker, unit=unit, uid=uid, **(session or {}))
    members = found["members"]
    spared = [m for m in members if protected(m)]
    targets = dict((m["pid"], m) for m in members if not protected(m))
    for extra in extra_targets:
        targets.setdefault(extra["pid"], extra)
    report = {"term_sent": [], "kill_sent": [], "spared_protected": spared, "remaining": [],
              "targets": sorted(targets.values(), key=lambda x: x["pid"]),
              "foreign": found["foreign"], "escalated": None}
    if not targets:
        return report
    step = procs.terminate(list(targets.values()), hung, term_timeout, 10.0, node_rank,
                           log_file)
    for key in ("term_sent", "kill_sent", "remaining", "escalated"):
        report[key] = step[key]
    return report


def verify_released(backend, sim_dir, member_pids, baseline, timeout, poll=0.1, gpu_timeout=10):
    """Poll until no member is on any GPU and each GPU is back to its baseline memory.

    Memory that live processes outside the deployment hold is theirs: another deployment that
    started on the node after the baseline was recorded does not make a GPU 'held'. What is
    held is memory above the baseline that no live process accounts for.

    Returns (released, seconds, held) where held lists the devices still held, with the
    holders' process states (D, Z) where known."""
    start = time.monotonic()
    while True:
        devices = gpu.gpu_snapshot(backend, sim_dir, gpu_timeout)
        held = []
        for d in devices:
            ours = [p for p in d["processes"] if p["pid"] in member_pids]
            others = sum(p["used_memory"] or 0 for p in d["processes"]
                         if p["pid"] not in member_pids and _alive(p["pid"]))
            base = (baseline or {}).get(str(d["index"]), 0)
            unaccounted = d["memory_used"] - others
            if ours or (d["memory_used"] > base + RELEASE_SLACK_BYTES
                        and unaccounted > RELEASE_SLACK_BYTES):
                held.append({"index": d["index"], "memory_used": d["memory_used"],
                             "baseline": base, "holders": [_holder(p) for p in d["processes"]]})
        elapsed = time.monotonic() - start
        if not held or elapsed >= timeout:
            return not held, elapsed, held
        time.sleep(poll)


def _alive(pid):
    info = procs.process_info(pid)
    return info is not None and info["state"] not in ("Z", "X")


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
