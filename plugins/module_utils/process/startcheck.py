# -*- coding: utf-8 -*-
# Check before you stop: what a new server needs from its node, checked before a running one is
# stopped for a change, so that a start that cannot succeed leaves the old server serving.
# - free space in the log, run and shm folders (a full log filesystem kills the new server
#   with nothing in its log to say why);
# - the HTTP port (and a prefill's KV bootstrap port) free, or held by the server being
#   replaced (found by membership), or by another node of the same multi-node server sharing
#   this machine (the simulated fleet);
# - the model path present, with its config.json;
# - no other deployment of the same inventory host still running under the same root (a change
#   of port or name would orphan it on the same GPUs);
# - no symbolic link where the server writes (its log and run folders, its log file): the start
#   would write through it, outside the deployment's root.
# Read-only; pure Python on statvfs and /proc.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shlex
import socket
import struct

from . import procs

MIB = 1 << 20
_LISTEN = "0A"


def _existing(path):
    """The path, or its nearest existing parent (a folder a first deploy has not made yet)."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or "/"


def free_bytes(path):
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize, st.f_favail


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%d %s" % (n, unit) if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1024.0
    return "%d" % n


def space_problems(folders, min_free_bytes):
    """folders: [(what, path, fix)]. A message per folder with too little space or no inodes."""
    problems = []
    for what, path, fix in folders:
        if not path:
            continue
        try:
            free, inodes = free_bytes(path)
        except OSError as exc:
            problems.append("%s %s cannot be checked: %s" % (what, path, exc))
            continue
        if free < min_free_bytes or inodes == 0:
            problems.append(
                "%s %s has %s free (%s needed%s): the new server's writes would fail with "
                "'No space left on device'. Fix: %s"
                % (what, path, _size(free), _size(min_free_bytes),
                   ", and no free inodes" if inodes == 0 else "", fix))
    return problems


def _addr4(hexaddr):
    return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(hexaddr, 16)))


def _addr6(hexaddr):
    words = [struct.pack("<I", int(hexaddr[i:i + 8], 16)) for i in range(0, 32, 8)]
    return socket.inet_ntop(socket.AF_INET6, b"".join(words))


def listening_inodes(port, host=None):
    """Socket inodes listening on `port` at an address that overlaps `host`."""
    wildcard = ("0.0.0.0", "::", "", None)
    inodes = set()
    for table, decode in (("/proc/net/tcp", _addr4), ("/proc/net/tcp6", _addr6)):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except (OSError, IOError):
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            addr, _, hexport = fields[1].partition(":")
            if int(hexport, 16) != port:
                continue
            local = decode(addr)
            if local.startswith("::ffff:"):
                local = local[7:]
            if host in wildcard or local in wildcard or local == host:
                inodes.add(fields[9])
    return inodes


def socket_holders(inodes):
    """Pids holding any of the socket inodes open."""
    wanted = set("socket:[%s]" % i for i in inodes)
    holders = set()
    for pid in procs.all_pids():
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    if os.readlink("/proc/%d/fd/%s" % (pid, fd)) in wanted:
                        holders.add(pid)
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return holders


def port_holders(host, port, member_pids=(), allowed_markers=()):
    """(whether anything listens on the port at an address that overlaps `host`, whether one
    of `member_pids` or `allowed_markers` holds it, the others that hold it as 'pid (command)'
    as far as /proc shows them)."""
    inodes = listening_inodes(int(port), host)
    if not inodes:
        return False, False, []
    ours, others = False, []
    for pid in sorted(socket_holders(inodes)):
        if pid in member_pids or procs.marker_of(pid) in allowed_markers:
            ours = True
            continue
        info = procs.process_info(pid)
        others.append("%d (%s)" % (pid, (info or {}).get("cmdline", "?")[:160]))
    return True, ours, others


# What each port a server binds is for: how a refusal names it, what a bind failure costs,
# and the setting that moves it.
HTTP_PORT = ("port", "the new server would load its weights and then die on bind",
             "sglang_server_port")
BOOTSTRAP_PORT = ("the prefill's KV bootstrap port", "the new prefill would serve without its "
                  "bootstrap server, and no decode could fetch its KV cache",
                  "sglang_server_disaggregation_bootstrap_port")


def port_problems(host, port, member_pids, allowed_markers=(), what=HTTP_PORT):
    """A message when the port is held by a process that is not the server being replaced."""
    if not port:
        return []
    listening, ours, others = port_holders(host, port, member_pids, allowed_markers)
    if not listening or (ours and not others):
        return []
    who = ", ".join(others) if others else "a process this check cannot see"
    name, cost, setting = what
    return ["%s %s:%d is held by %s, not by the server being replaced: %s. Fix: stop that "
            "program, or set %s to a free port" % (name, host or "*", int(port), who, cost,
                                                   setting)]


def model_problems(model_path):
    """A message when a local model path is missing or has no config.json. A path that is not
    a local path (a Hugging Face hub id) is left to SGLang, which downloads it."""
    if not model_path or not (model_path.startswith("/") or model_path.startswith(".")
                              or model_path.startswith("~")):
        return []
    path = os.path.expanduser(model_path)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return []
    if not os.path.isdir(path):
        return ["model path %s does not exist on the node. Fix: copy the model there, or set "
                "sglang_server_model_path to where it is" % model_path]
    if not os.path.isfile(os.path.join(path, "config.json")):
        return ["model path %s has no config.json: SGLang cannot load it. Fix: point "
                "sglang_server_model_path at the model's folder (the one with config.json)"
                % model_path]
    return []


def link_problems(paths):
    """A message per folder or file the server writes that is a symbolic link: the start would
    write through it, outside the deployment's root."""
    return ["%s is a symbolic link (to %s): the server would write through it, outside the "
            "deployment's root. Fix: replace the link by a real %s, or set sglang_server_root to "
            "a path without links" % (path, os.readlink(path), what)
            for what, path in paths if path and os.path.islink(path)]


def start_blockers(folders, min_free_bytes, host, port, member_pids, allowed_markers,
                   model_path, bootstrap_port=None):
    """Everything that would make the next start fail, as messages (empty: go ahead)."""
    # The shm folder is the node's (often /dev/shm, a link on some systems), not the deploy's.
    return (link_problems([("folder", path) for what, path, _ in folders if what != "shm folder"])
            + space_problems(folders, min_free_bytes)
            + port_problems(host, port, set(member_pids), tuple(allowed_markers))
            + port_problems(host, bootstrap_port, set(member_pids), tuple(allowed_markers),
                            BOOTSTRAP_PORT)
            + model_problems(model_path))


def server_start_blockers(p, member_pids):
    """start_blockers for one deployment, from sglang_service's options (log_file, state_file,
    shm_dir, min_free_mb, host, port, group_markers, model_path; a prefill's bootstrap_port):
    the folders its server writes to, its ports and its model."""
    log_dir = os.path.dirname(p["log_file"]) if p["log_file"] else None
    folders = [
        ("log folder", log_dir, "free space there (or move sglang_server_root)"),
        ("run folder", os.path.dirname(p["state_file"]),
         "free space there (or move sglang_server_root)"),
        ("shm folder", p["shm_dir"], "free shared memory there (or set sglang_server_shm_dir)"),
    ]
    return (link_problems([("file", p["log_file"])])
            + start_blockers(folders, p["min_free_mb"] * MIB, p["host"], p["port"],
                             member_pids, p["group_markers"], p["model_path"],
                             p.get("bootstrap_port")))


def _state_files(run_dir):
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return []
    return [os.path.join(run_dir, n) for n in names if n.endswith(".pid")]


def other_deployments_running(state_file, marker):
    """The other deployments of this inventory host under this root (state files beside this
    one's whose marker is `<host>:<another name>`) whose server still runs: a change of port or
    of deployment name renames the files and would leave that server running, unmanaged, on
    the same GPUs. Each: its marker, deployment, port (from its running spec) and processes."""
    host = marker.partition(":")[0]
    run_dir = os.path.dirname(state_file)
    found = []
    for path in _state_files(run_dir):
        state = _read_state(path)
        other = str(state.get("marker") or "")
        if path == state_file or other == marker or other.partition(":")[0] != host:
            continue
        members = procs.deployment_processes(other, **procs.recorded_session(state))
        if not members:
            continue
        deployment = other.partition(":")[2]
        spec = _read_state(os.path.join(run_dir, deployment + ".running-spec.json"))
        found.append({"marker": other, "deployment": deployment,
                      "port": (spec.get("http") or {}).get("port"),
                      "pids": [m["pid"] for m in members], "state_file": path})
    return found


def _read_state(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, IOError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def orphan_refusal(marker, running, root=None):
    """The refusal naming each other deployment of this host that still runs, and the exact
    command that stops it (stop.yml addressed to that deployment's name and port, and to the
    root it runs under when that is not the deployment's root now)."""
    host, _, deployment = marker.partition(":")
    parts = []
    for other in running:
        stop = ("ansible-playbook playbooks/stop.yml --limit %s "
                "-e sglang_server_deployment_name=%s" % (host, other["deployment"]))
        if other["port"]:
            stop += " -e sglang_server_port=%s" % other["port"]
        if root:
            stop += " -e sglang_server_root=%s" % shlex.quote(root)
        parts.append("%s (port %s, %d process(es), pids %s; state %s). Fix: stop it first: %s"
                     % (other["marker"], other["port"] or "unknown", len(other["pids"]),
                        ", ".join(str(p) for p in other["pids"][:8]), other["state_file"],
                        stop))
    if root:
        return ("another deployment of %s still runs under its previous root %s: %s. "
                "Deploying %s under the new root would leave it running, unmanaged, on the "
                "same GPUs (a change of root, with the port or deployment name, moves and "
                "renames the deployment's files). Nothing was changed"
                % (host, root, "; ".join(parts), deployment))
    return ("another deployment of %s still runs under the same root: %s. Deploying %s beside "
            "it would leave it running, unmanaged, on the same GPUs (a change of port or "
            "deployment name renames the deployment's files). Nothing was changed"
            % (host, "; ".join(parts), deployment))


def port_owner(host, port, marker):
    """Who serves `port` on this node, for a removal from a router: {owner: own | other | free,
    holder: a description of another holder}. `own` when the processes that listen on it carry
    the deployment's marker; when they cannot be seen (another user's, without root), when
    the deployment has processes running. A router lists servers by URL only: a URL this
    host's server was configured for may be served by another host's server."""
    inodes = listening_inodes(int(port), host)
    if not inodes:
        return {"owner": "free", "holder": None}
    holders = socket_holders(inodes)
    if not holders:
        own = procs.deployment_processes(marker)
        return {"owner": "own" if own else "other",
                "holder": None if own else "a process this check cannot see"}
    others = [pid for pid in sorted(holders) if procs.marker_of(pid) != marker]
    if not others:
        return {"owner": "own", "holder": None}
    pid = others[0]
    info = procs.process_info(pid) or {}
    other_marker = procs.marker_of(pid)
    return {"owner": "other",
            "holder": "pid %d (%s%s)" % (pid, ("deployment %s, " % other_marker)
                                         if other_marker else "",
                                         str(info.get("cmdline", "?"))[:120])}
