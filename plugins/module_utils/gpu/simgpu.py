# -*- coding: utf-8 -*-
# Simulated GPUs for nodes without them: one folder per node holding device stand-in files that
# server processes keep open, a devices.json describing the cards, and a memory ledger.
# Pure Python without Ansible imports: the simulator (writer) and the GPU layer (reader) share it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import json
import os

DEVICES_FILE = "devices.json"
LEDGER_DIR = "alloc"


def device_path(gpu_dir, index):
    return os.path.join(gpu_dir, "nvidia%d" % index)


def read_devices(gpu_dir):
    with open(os.path.join(gpu_dir, DEVICES_FILE)) as f:
        return json.load(f)


def _pid_alive(pid):
    # A zombie has released its memory, as a dead CUDA process does.
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def record_allocation(gpu_dir, index, pid, used_bytes, held_after_exit=False):
    """Set (not add) what process `pid` holds on device `index`; written atomically."""
    ledger = os.path.join(gpu_dir, LEDGER_DIR)
    # All workers of a server record at once: creating the folder must tolerate the race.
    os.makedirs(ledger, exist_ok=True)
    path = os.path.join(ledger, "%d-%d.json" % (index, pid))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"index": index, "pid": pid, "bytes": int(used_bytes),
                   "held_after_exit": bool(held_after_exit)}, f)
    os.rename(tmp, path)


def read_allocations(gpu_dir):
    """Live allocations, plus those a dead process left held (the memory-not-released fault)."""
    ledger = os.path.join(gpu_dir, LEDGER_DIR)
    result = []
    if not os.path.isdir(ledger):
        return result
    for name in sorted(os.listdir(ledger)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(ledger, name)) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            continue
        alive = _pid_alive(entry["pid"])
        if alive or entry.get("held_after_exit"):
            entry["alive"] = alive
            result.append(entry)
        else:
            # Memory of an exited process is released, as the driver does; drop the record.
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(ledger, name))
    return result


def snapshot(gpu_dir):
    """Per device: static facts, memory used/free and the processes holding memory on it."""
    devices = read_devices(gpu_dir)
    allocations = read_allocations(gpu_dir)
    out = []
    for dev in devices:
        mine = [a for a in allocations if a["index"] == dev["index"]]
        used = sum(a["bytes"] for a in mine)
        out.append({
            "index": dev["index"],
            "name": dev["name"],
            "uuid": dev["uuid"],
            "compute_capability": "%d.%d" % tuple(dev["compute_capability"]),
            "memory_total": dev["memory_total"],
            "memory_used": used,
            "memory_free": max(dev["memory_total"] - used, 0),
            "processes": [{"pid": a["pid"], "used_memory": a["bytes"]}
                          for a in mine if a["alive"]],
        })
    return out
