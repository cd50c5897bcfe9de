# -*- coding: utf-8 -*-
# What a simulated node is made of, written on the node: its GPUs (devices.json and one device
# file per GPU, which the simulated workers hold open) and a stand-in model folder. Idempotent:
# reports what it wrote, writes nothing in check mode.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

SHARDS = 8
SHARD_SIZE = 262144


class _Writer(object):
    def __init__(self, check_mode):
        self.check_mode = check_mode
        self.written = []

    def folder(self, path):
        if not os.path.isdir(path):
            self.written.append(path)
            if not self.check_mode:
                os.makedirs(path, exist_ok=True)

    def text(self, path, content):
        try:
            with open(path) as f:
                if f.read() == content:
                    return
        except (OSError, IOError):
            pass
        self.written.append(path)
        if not self.check_mode:
            # Nodes of a simulated group may provision a shared model folder at once.
            tmp = "%s.%d.tmp" % (path, os.getpid())
            with open(tmp, "w") as f:
                f.write(content)
            os.rename(tmp, path)

    def sparse(self, path, size, mode=None):
        if os.path.exists(path):
            return
        self.written.append(path)
        if not self.check_mode:
            with open(path, "ab") as f:  # append mode: a concurrent creator loses nothing
                f.truncate(size)
            if mode is not None:
                os.chmod(path, mode)


def provision(gpu_dir, devices, model_dir, model_files, shm_dir, check_mode,
              shards=SHARDS, shard_size=SHARD_SIZE):
    """Write the simulated node's GPUs and model; the paths written (or to be written)."""
    w = _Writer(check_mode)
    for folder in (gpu_dir, model_dir, shm_dir):
        w.folder(folder)
    w.text(os.path.join(gpu_dir, "devices.json"),
           json.dumps(devices, indent=2, sort_keys=True) + "\n")
    for dev in devices:
        w.sparse(os.path.join(gpu_dir, "nvidia%d" % int(dev["index"])), 0, 0o666)
    for name in sorted(model_files):
        w.text(os.path.join(model_dir, name),
               json.dumps(model_files[name], indent=2, sort_keys=True) + "\n")
    for i in range(1, shards + 1):
        w.sparse(os.path.join(model_dir, "model-%05d-of-%05d.safetensors" % (i, shards)),
                 shard_size)
    return w.written
