# -*- coding: utf-8 -*-
# GPU observation with two backends of one shape: NVML (nvidia-ml-py) on real nodes, the
# simulated ledger elsewhere. NVML can hang on a sick GPU, so every NVML query runs in a worker
# thread under a timeout and a timeout is reported as a finding, not raised.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys
import threading

from . import simgpu


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
        raise GpuQueryTimeout("NVML did not answer within %ss (driver hung?)" % timeout) from None
    if "error" in box:
        raise box["error"]
    return box["value"]


# The NVML query as source, so that it runs the same in this interpreter or, for a module that
# runs outside the server's environment (which brings nvidia-ml-py), in that environment's
# Python: `python -c` with this source plus a print (gpu_snapshot's `python` argument).
_NVML_SOURCE = r"""
def nvml_devices():
    import pynvml
    pynvml.nvmlInit()
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
"""
_nvml_namespace = {}
exec(_NVML_SOURCE, _nvml_namespace)  # noqa: S102 - our own source, see above


def _nvml_snapshot():
    try:
        import pynvml  # noqa: F401 - only whether it is there
    except ImportError:
        raise GpuUnavailable("nvidia-ml-py (module pynvml) is not installed on this node") from None
    try:
        return _nvml_namespace["nvml_devices"]()
    except Exception as exc:
        if type(exc).__name__.startswith("NVMLError"):
            raise GpuUnavailable("NVML init failed: %s (driver not loaded?)" % exc) from exc
        raise


def _nvml_snapshot_in(python, timeout):
    """The NVML query run by another interpreter (the server's environment)."""
    code = (_NVML_SOURCE + "\nimport json, sys\ntry:\n    json.dump(nvml_devices(), sys.stdout)"
            "\nexcept ImportError:\n    sys.exit(3)\n")
    try:
        proc = subprocess.run([python, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GpuQueryTimeout("NVML did not answer within %ss (driver hung?)" % timeout) from None
    except OSError as exc:
        raise GpuUnavailable("cannot run %s for NVML: %s" % (python, exc)) from exc
    if proc.returncode == 3:
        raise GpuUnavailable("nvidia-ml-py (module pynvml) is not installed in %s" % python)
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise GpuUnavailable("NVML init failed: %s (driver not loaded?)" % " ".join(tail))
    return json.loads(proc.stdout.decode())


def gpu_snapshot(backend, sim_dir=None, timeout=10.0, python=None):
    """List of devices: index, name, uuid, compute_capability, memory_*, processes. With
    `python`, NVML is queried by that interpreter (when it is not this one)."""
    if backend == "simulated":
        if not sim_dir:
            raise GpuUnavailable("the simulated backend needs sim_dir")
        try:
            return simgpu.snapshot(sim_dir)
        except (OSError, ValueError) as exc:
            raise GpuUnavailable("simulated GPUs unreadable in %s: %s" % (sim_dir, exc)) from exc
    if backend == "nvml":
        if python and os.path.realpath(python) != os.path.realpath(sys.executable):
            return _nvml_snapshot_in(python, timeout)
        return _with_timeout(_nvml_snapshot, timeout)
    raise GpuUnavailable("unknown GPU backend %r (use nvml or simulated)" % backend)


def baseline(devices):
    """The memory each GPU holds before a server starts, by index: what recovery's stop
    verifies the GPUs are back to (module_utils/process/stop.verify_released)."""
    return dict((str(d["index"]), d["memory_used"]) for d in devices)
