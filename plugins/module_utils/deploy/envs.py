# -*- coding: utf-8 -*-
# Release environments on the node (<root>/envs/<id>, named on the controller by
# sglang_fleet.launch.envs): the marker file each holds, and which of them a keep count prunes.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil

from ..common.files import read_json, write_json_atomic

MARKER = "sglang-fleet-env.json"


def installed(marker_path, requirements):
    """Whether the environment holds exactly these requirements: its marker, written after a
    complete install, records them. A folder without one was never finished."""
    marker = read_json(marker_path)
    return isinstance(marker, dict) and \
        sorted(marker.get("requirements") or []) == sorted(requirements)


def record_installed(marker_path, requirements, now, check=False):
    """Write the marker after an install; True when it changed (nothing when it already
    records these requirements, so that a second deploy changes nothing)."""
    if installed(marker_path, requirements):
        return False
    if not check:
        write_json_atomic(marker_path, {"requirements": sorted(requirements),
                                        "installed_at": now, "ready_at": None})
    return True


def record_ready(marker_path, now, check=False):
    """The environment served ready at `now` (a server (re)started on it reached ready)."""
    marker = read_json(marker_path)
    if not isinstance(marker, dict):
        return False
    if not check:
        marker["ready_at"] = now
        write_json_atomic(marker_path, marker)
    return True


def environments(envs_dir):
    """{id: marker} of the finished environments under envs_dir."""
    found = {}
    try:
        names = sorted(os.listdir(envs_dir))
    except OSError:
        return found
    for name in names:
        marker = read_json(os.path.join(envs_dir, name, MARKER))
        if isinstance(marker, dict):
            found[name] = marker
    return found


def to_prune(envs, keep, protected):
    """The ids to remove so that at most `keep` remain, oldest first: by when each last
    served ready (one that never did is older than any that did), then by its install.
    `protected` ids (the serving one, the ledger's previous ready and last known good) are
    never removed, and count towards the kept ones."""
    def age(ident):
        m = envs[ident]
        return (m.get("ready_at") is not None, m.get("ready_at") or "",
                m.get("installed_at") or "", ident)

    candidates = sorted((i for i in envs if i not in protected), key=age)
    excess = len(envs) - keep
    return candidates[:max(0, excess)]


def prune(envs_dir, keep, protected, check=False):
    """Remove the environments to_prune names; returns their ids."""
    gone = to_prune(environments(envs_dir), keep, set(protected))
    if not check:
        for ident in gone:
            shutil.rmtree(os.path.join(envs_dir, ident))
    return gone
