# -*- coding: utf-8 -*-
# Shared-memory segments a killed server leaked (SIGKILL skips SGLang's cleanup; leaked segments
# have crashed the next start with "Bus error"), removed without touching anyone else's: a
# shared-memory folder is often shared (/dev/shm: every user and container of the node).
#
# A segment is this deployment's only when something binds it to the deployment's last run,
# never by its name's family alone (another user's `psm_*`, another deployment's `sgl_shm_*`
# look the same):
# - its name carries the PID of one of that run's processes, where SGLang and torch put the
#   creator's PID: `sgl_shm_<kind>_<pid>_<rand>` and `multi_tokenizer_args_<pid>` (SGLang
#   0.5.23, srt/utils/stale_shm_cleanup.py make_shm_name and _creator_pid), `torch_<pid>_...`
#   (torch's shared-memory file names); the run's PIDs are the state file's main PID and the
#   processes the gate and the stop found by the deployment's membership;
# - or one of that run's processes had it open or mapped when the gate observed it (recorded
#   then: names without a PID, such as `psm_<hex>` or `nccl-*`).
# The record (<run dir>/<deployment>.shm.json) belongs to one run (its start time) and starts
# afresh with the next. On top of that binding, as before: owned by the service user, dated
# since the run's start, open or mapped by no live process, and only while none of the
# deployment's processes runs. What is not bound stays: a leak is recoverable, a bystander's
# deleted segment is not.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import os
import re
import stat

from ..common.files import read_json, write_json_atomic
from .procs import deployment_processes, recorded_session

# The families of names SGLang, torch, NCCL and CUDA give their segments; a narrowing filter
# only: a name must also be bound to the run (see above).
PATTERNS = ("sgl_shm_*", "multi_tokenizer_args_*", "torch_*", "psm_*", "sglang*", "nccl-*",
            "cuda.shm.*")
# Where a segment's name carries its creator's PID.
_PID_IN_NAME = (re.compile(r"^sgl_shm_.+_(\d+)_[0-9a-f]+$"),
                re.compile(r"^multi_tokenizer_args_(\d+)$"),
                re.compile(r"^torch_(\d+)_"))


def record_path(state_file):
    """The run's segment record, beside its state file."""
    base = state_file[:-4] if state_file.endswith(".pid") else state_file
    return base + ".shm.json"


def creator_pid(name):
    """The PID a segment's name gives its creator, or None."""
    for pattern in _PID_IN_NAME:
        found = pattern.match(name)
        if found:
            return int(found.group(1))
    return None


def _paths_in_use(shm_dir, pids=None):
    """Segments some live process (of `pids`, default every one) has open (fd) or mapped."""
    used = set()
    prefix = shm_dir.rstrip("/") + "/"
    for pid in pids if pids is not None else (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if target.startswith(prefix):
                    used.add(target.replace(" (deleted)", ""))
            with open("/proc/%s/maps" % pid) as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith(prefix):
                        used.add(parts[5].strip().replace(" (deleted)", ""))
        except (OSError, IOError):
            continue
    return used


def _last_start(state_file):
    try:
        return float((read_json(state_file) or {})["started_at"])
    except (KeyError, TypeError, ValueError):
        return None


def record_run(state_file, pids, shm_dir=None):
    """Bind to the deployment's current run the processes `pids` (found by its membership)
    and, given `shm_dir`, the segments there they have open or mapped. Returns the record;
    None when the deployment has no recorded start."""
    started = _last_start(state_file)
    if started is None:
        return None
    path = record_path(state_file)
    record = read_json(path) or {}
    if record.get("started_at") != started:
        record = {"started_at": started, "pids": [], "segments": []}
    pids = sorted(set(record["pids"]) | set(int(p) for p in pids))
    segments = set(record["segments"])
    if shm_dir and pids and os.path.isdir(shm_dir):
        segments |= set(os.path.basename(p) for p in _paths_in_use(shm_dir, pids))
    if pids != record["pids"] or sorted(segments) != record["segments"]:
        record.update(pids=pids, segments=sorted(segments))
        write_json_atomic(path, record)
    return record


def _bound(name, bound_pids, bound_names):
    return name in bound_names or creator_pid(name) in bound_pids


def leaked_segments(shm_dir, state_file, marker, owner, by_user=True, patterns=PATTERNS):
    """(to remove, kept because in use): segments bound to the deployment's last run, when that
    run is over."""
    state = read_json(state_file) or {}
    since = _last_start(state_file)
    if since is None or not os.path.isdir(shm_dir) or \
            deployment_processes(marker, uid=owner if by_user else None,
                                 **recorded_session(state)):
        return [], []
    record = read_json(record_path(state_file)) or {}
    if record.get("started_at") != since:
        record = {}
    bound_pids = set(record.get("pids") or [])
    if state.get("pid") is not None:
        bound_pids.add(int(state["pid"]))
    bound_names = set(record.get("segments") or [])
    in_use = _paths_in_use(shm_dir)
    remove, kept = [], []
    for name in sorted(os.listdir(shm_dir)):
        path = os.path.join(shm_dir, name)
        if not any(fnmatch.fnmatch(name, pat) for pat in patterns) or \
                not _bound(name, bound_pids, bound_names):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mtime < since:
            continue
        (kept if path in in_use else remove).append(path)
    return remove, kept
