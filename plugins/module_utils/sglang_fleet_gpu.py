# -*- coding: utf-8 -*-
# GPU observation with two backends of one shape: NVML (nvidia-ml-py) on real nodes, the
# simulated ledger elsewhere. NVML can hang on a sick GPU, so every NVML query runs in a worker
# thread under a timeout and a timeout is reported as a finding, not raised.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import threading

try:
    from ansible.module_utils import sglang_fleet_simgpu as simgpu
except ImportError:  # imported by the controller package, outside Ansible
    from sglang_fleet_node import sglang_fleet_simgpu as simgpu


class GpuQueryTimeout(Exception):
    pass


class GpuUnavailable(Exception):
    pass


def _with_timeout(func, timeout):
    box = {}

    def target():
        try:
            box["value"] = func()
        except Exception as exc:  # reported to the caller, whatever NVML raised
            box["error"] = exc

    worker = threading.Thread(target=target, name="nvml-query")
    worker.daemon = True  # a driver hang must not keep the module from exiting
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise GpuQueryTimeout("NVML did not answer within %ss (driver hung?)" % timeout)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _nvml_snapshot():
    try:
        import pynvml
    except ImportError:
        raise GpuUnavailable("nvidia-ml-py (module pynvml) is not installed on this node") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise GpuUnavailable("NVML init failed: %s (driver not loaded?)" % exc) from exc
    try:
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            out.append({
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "compute_capability": "%d.%d" % (major, minor),
                "memory_total": int(mem.total),
                "memory_used": int(mem.used),
                "memory_free": int(mem.free),
                "processes": [{"pid": int(p.pid), "used_memory": int(p.usedGpuMemory or 0)}
                              for p in procs],
            })
        return out
    finally:
        pynvml.nvmlShutdown()


def gpu_snapshot(backend, sim_dir=None, timeout=10.0):
    """List of devices: index, name, uuid, compute_capability, memory_*, processes."""
    if backend == "simulated":
        if not sim_dir:
            raise GpuUnavailable("the simulated backend needs sim_dir")
        try:
            return simgpu.snapshot(sim_dir)
        except (OSError, ValueError) as exc:
            raise GpuUnavailable("simulated GPUs unreadable in %s: %s" % (sim_dir, exc)) from exc
    if backend == "nvml":
        return _with_timeout(_nvml_snapshot, timeout)
    raise GpuUnavailable("unknown GPU backend %r (use nvml or simulated)" % backend)
