# -*- coding: utf-8 -*-
# Shared-memory segments a killed server leaked (SIGKILL skips SGLang's cleanup; leaked segments
# have crashed the next start with "Bus error"): those of this deployment's last run, owned by
# its user, dated since its start, open or mapped by no live process, and only while none of
# its processes runs.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import os

try:
    from ansible.module_utils.sglang_fleet_files import read_json
    from ansible.module_utils.sglang_fleet_procs import deployment_processes, recorded_session
except ImportError:  # imported by the controller package or its tests, outside Ansible
    from sglang_fleet_node.sglang_fleet_files import read_json
    from sglang_fleet_node.sglang_fleet_procs import deployment_processes, recorded_session

PATTERNS = ("psm_*", "sglang*", "nccl-*", "torch_*", "cuda.shm.*")


def _paths_in_use(shm_dir):
    """Segments some live process has open (fd) or mapped (maps)."""
    used = set()
    prefix = shm_dir.rstrip("/") + "/"
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if target.startswith(prefix):
                    used.add(target)
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


def leaked_segments(shm_dir, state_file, marker, owner, by_user=True, patterns=PATTERNS):
    """(to remove, kept because in use): segments of the deployment's last run, when that run
    is over."""
    state = read_json(state_file) or {}
    since = _last_start(state_file)
    if since is None or not os.path.isdir(shm_dir) or \
            deployment_processes(marker, uid=owner if by_user else None,
                                 **recorded_session(state)):
        return [], []
    in_use = _paths_in_use(shm_dir)
    remove, kept = [], []
    for name in sorted(os.listdir(shm_dir)):
        path = os.path.join(shm_dir, name)
        if not any(fnmatch.fnmatch(name, pat) for pat in patterns):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != owner or st.st_mtime < since:
            continue
        (kept if path in in_use else remove).append(path)
    return remove, kept
