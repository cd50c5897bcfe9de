# -*- coding: utf-8 -*-
# A node's side of staging: where a revision lives under the deployment's root, the disk check,
# starting (or finding) the node's staging agent, reading its status as a gate verdict, the node
# check of a published copy and pruning old revisions. Standard library only.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import inspect
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

from . import agent as agent_code
from . import manifest as mf

PHASE = "staging_weights"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Free space kept beyond what the copy needs (the journal, the manifest, the file system).
MARGIN_BYTES = 64 * 1024 * 1024


class StageError(Exception):
    pass


def safe_name(kind, value):
    """A model or revision name as one folder: letters, digits, '.', '_', '-'."""
    if not isinstance(value, str) or not NAME.match(value) or value in (".", ".."):
        raise StageError("%s %r is not a plain folder name (letters, digits, '.', '_', '-')"
                         % (kind, value))
    return value


def check_under(root, path):
    """Refuse a path outside root, or with a symlink anywhere from root down to it."""
    root = os.path.abspath(root)
    path = os.path.abspath(path)
    if os.path.commonpath([root, path]) != root:
        raise StageError("%s is outside the deployment's root %s" % (path, root))
    current = root
    for part in os.path.relpath(path, root).split(os.sep):
        if part == ".":
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise StageError("%s is a symlink: staging writes only real folders under %s"
                             % (current, root))
    return path


def layout(root, model, revision):
    safe_name("model", model)
    safe_name("revision", revision)
    if not os.path.isabs(root):
        raise StageError("the staging root %r is not an absolute path" % (root,))
    staging = os.path.join(root, ".staging", model, revision)
    # The revision's folder holds a folder named as the model: the server's model path, whose
    # last part is the name clients see and the name the toolkit knows the model by.
    places = {
        "root": root,
        "staging": staging,
        "publish": os.path.join(root, model, revision),
        "model_dir": os.path.join(root, model, revision, model),
        "files": os.path.join(staging, "files", model),
        "manifest_dest": os.path.join(root, model, ".manifests", revision + ".json"),
        "status": os.path.join(staging, "status.json"),
        "config": os.path.join(staging, "agent.json"),
        "pidfile": os.path.join(staging, "agent.pid"),
        "log": os.path.join(staging, "agent.log"),
        "agent_dir": os.path.join(staging, "agent"),
        "in_use": os.path.join(root, model, ".in_use"),
    }
    for key in ("staging", "model_dir", "manifest_dest"):
        check_under(root, places[key])
    return places


def published(places, manifest):
    """The revision is published with this manifest's content."""
    try:
        stored = mf.load(places["manifest_dest"])
    except (OSError, ValueError, mf.ManifestError):
        return False
    return os.path.isdir(places["publish"]) and stored["id"] == manifest["id"]


def held_bytes(places, manifest):
    """Bytes already verified in the staging folder (its journal), 0 when there is none."""
    try:
        with open(os.path.join(places["staging"], "journal"), "rb") as j:
            journal = j.read()
    except OSError:
        return 0
    pieces = mf.pieces(manifest)
    if len(journal) != len(pieces) or not same_manifest(places, manifest):
        return 0
    return sum(p[2] for i, p in enumerate(pieces) if journal[i])


def same_manifest(places, manifest):
    try:
        return mf.load(os.path.join(places["staging"], "manifest.json"))["id"] == manifest["id"]
    except (OSError, ValueError, mf.ManifestError):
        return False


def disk_need(places, manifest):
    """(need, free) in bytes on the file system that will hold the revision."""
    if published(places, manifest):
        return 0, free_bytes(places["root"])
    need = manifest["total_bytes"] - held_bytes(places, manifest) + MARGIN_BYTES
    return need, free_bytes(places["root"])


def free_bytes(path):
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def gb(n):
    return "%.1f GB" % (n / 1e9) if n >= 1e8 else "%.1f MB" % (n / 1e6)


def check_disk(places, manifest, node):
    need, free = disk_need(places, manifest)
    if need > free:
        raise StageError(
            "not enough disk on %s for %s: need %s (%d bytes), free %s (%d bytes) under %s; "
            "free space there, or set sglang_server_root to a larger file system (weights "
            "stage under its weights/ folder)"
            % (node, manifest["revision"], gb(need), need, gb(free), free, places["root"]))
    return need, free


def agent_pid(places):
    """The pid of this revision's agent when it still runs, else None."""
    try:
        with open(places["pidfile"]) as f:
            pid = int(f.read().strip())
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if places["config"].encode() in cmdline else None


def prepare_staging(places, manifest):
    """The staging folder for this manifest: kept when it is for the same content (resume),
    emptied when it was for another."""
    staging = places["staging"]
    if os.path.isdir(staging) and not same_manifest(places, manifest):
        shutil.rmtree(staging)
    os.makedirs(places["files"], exist_ok=True)
    os.makedirs(places["agent_dir"], exist_ok=True)
    mf.dump(manifest, os.path.join(staging, "manifest.json"))
    for module in (agent_code, mf):
        target = os.path.join(places["agent_dir"], module.__name__.rsplit(".", 1)[-1] + ".py")
        with open(target, "w") as f:
            f.write(inspect.getsource(module))


def start_agent(places, manifest, listen, sources, options, seed_folder=None, python=None):
    """Start the agent (detached, its own session) unless it runs already or the revision is
    published with this manifest: (its pid or None, whether it was started now)."""
    pid = agent_pid(places)
    if pid:
        return pid, False
    if seed_folder is None and published(places, manifest):
        return None, False
    stop_agents_on_port(places, listen)
    prepare_staging(places, manifest)
    cfg = dict(options)
    cfg.update({
        "mode": "seed" if seed_folder else "node", "folder": seed_folder,
        "manifest": os.path.join(places["staging"], "manifest.json"),
        "staging": places["staging"], "files": places["files"],
        "publish": places["publish"],
        "manifest_dest": places["manifest_dest"], "status": places["status"],
        "listen": [listen[0], int(listen[1])], "sources": list(sources),
    })
    os.makedirs(os.path.dirname(places["manifest_dest"]), exist_ok=True)
    with open(places["config"], "w") as f:
        json.dump(cfg, f)
    if os.path.exists(places["status"]):
        os.unlink(places["status"])
    script = os.path.join(places["agent_dir"], "agent.py")
    with open(places["log"], "ab") as log:
        proc = subprocess.Popen([python or sys.executable, script, places["config"]],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)
    with open(places["pidfile"], "w") as f:
        f.write(str(proc.pid))
    return proc.pid, True


def read_status(places, timeout=5.0):
    """The agent's status file; waits up to timeout for a just-started agent's first one."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(places["status"]) as f:
                return json.load(f)
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)


def progress_text(status):
    """'120/163 files, 310 GB of 612, 1.2 GB/s'"""
    total = status["bytes_total"]
    unit, div = ("GB", 1e9) if total >= 1e9 else ("MB", 1e6)
    return "%d/%d files, %.0f %s of %.0f, %.1f %s/s" % (
        status["files_have"], status["files_total"], status["bytes_have"] / div, unit,
        total / div, status["rate"] / div, unit)


def judge(status, stall_window, published_now=False, now=None, phase=PHASE):
    """The gate's verdict on a node's staging: ready once published, progressing while the
    pieces arrive, stalled when nothing arrived for the stall window, failed when the agent
    gave up or died. `phase` names what is staged (weights or a kernel cache)."""
    now = time.time() if now is None else now
    if published_now and (status is None or status.get("state") != "fetching"):
        return {"verdict": "ready", "phase": phase, "progress_text": "published"}
    if status is None:
        return {"verdict": "crashed", "phase": phase,
                "progress_text": "the staging agent left no status"}
    text = progress_text(status)
    corrupt = ["%s piece %d from %s" % (c["file"], c["piece"], c["source"])
               for c in status.get("corrupt", [])]
    verdict = {"phase": phase, "progress_text": text, "status": status, "corrupt": corrupt}
    state = status["state"]
    if state in ("incomplete", "failed", "stopped"):
        missing = status.get("missing", [])
        verdict.update(verdict="crashed", message="%s: %s; missing %d file(s): %s" % (
            state, status.get("error") or "the agent stopped", len(missing),
            ", ".join(missing[:10])))
    elif now - status["last_progress"] > stall_window:
        verdict.update(verdict="stalled", message="no piece arrived for %d s (stall window %d s)"
                       % (now - status["last_progress"], stall_window))
    elif state == "fetching" and now - status.get("updated", now) > stall_window:
        verdict.update(verdict="crashed", message="the staging agent stopped writing status")
    else:
        verdict["verdict"] = "progressing"
    verdict["headline"] = "%s: %s %s" % (verdict["verdict"], phase, text)
    return verdict


def verify_published(places, manifest):
    """The node check: the node's copy read against the manifest; problems as text."""
    check_under(places["root"], places["publish"])
    if not published(places, manifest):
        return ["%s is not published with manifest %s" % (places["publish"], manifest["id"])]
    for dirpath, dirnames, filenames in os.walk(places["publish"]):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                return ["%s is a symlink" % os.path.join(dirpath, name)]
    return mf.verify_copy(places["model_dir"], manifest)


def prune(root, model, keep, protect):
    """Remove published revisions beyond the newest `keep`, never one in `protect` (the one
    in use, the one being staged). The removed revisions' names."""
    folder = os.path.join(root, safe_name("model", model))
    if not os.path.isdir(folder):
        return []
    revisions = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.startswith(".") or not stat.S_ISDIR(os.lstat(path).st_mode):
            continue
        revisions.append((os.lstat(path).st_mtime, name))
    revisions.sort(reverse=True)
    removed = []
    for _, name in revisions[max(0, int(keep)):]:
        if name in protect:
            continue
        shutil.rmtree(os.path.join(folder, name))
        for leftover in (os.path.join(folder, ".manifests", name + ".json"),):
            if os.path.exists(leftover):
                os.unlink(leftover)
        removed.append(name)
    return removed


def in_use(places):
    try:
        with open(places["in_use"]) as f:
            return f.read().strip()
    except OSError:
        return ""


def stop_agent(places, timeout=10.0):
    """SIGTERM this revision's agent (found by its pid file and its own config path on its
    command line, never by name) and wait for it to go; whether one was running."""
    pid = agent_pid(places)
    if not pid:
        return False
    os.kill(pid, 15)
    deadline = time.monotonic() + timeout
    while agent_pid(places) == pid and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    return True


def stop_agents_on_port(places, listen):
    """Stop the agents of other revisions (of any model under this root) that still linger on
    the address and port the new one needs (each found by its own pid file and config, never
    by name): the new revision's nodes would otherwise reach the old one's pieces, or the new
    agent could not listen."""
    stopped = []
    staging_root = os.path.dirname(os.path.dirname(places["staging"]))
    for model in sorted(os.listdir(staging_root)) if os.path.isdir(staging_root) else []:
        revisions = os.path.join(staging_root, model)
        for revision in sorted(os.listdir(revisions)) if os.path.isdir(revisions) else []:
            try:
                other = layout(places["root"], model, revision)
            except StageError:
                continue
            if other["staging"] == places["staging"]:
                continue
            try:
                with open(other["config"]) as f:
                    held = json.load(f).get("listen")
            except (OSError, ValueError):
                continue
            # Port 0 is any free port: such an agent (the controller's harvest) blocks none.
            if int(listen[1]) and held == [listen[0], int(listen[1])] and stop_agent(other):
                stopped.append(revision)
    return stopped


def _reap(pid):
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def check_sizes(places, manifest):
    """The quick node check: published with this manifest, each file of its size, no
    symlink; problems as text."""
    check_under(places["root"], places["publish"])
    if not published(places, manifest):
        return ["%s is not published with manifest %s" % (places["publish"], manifest["id"])]
    problems = []
    for f in manifest["files"]:
        path = os.path.join(places["model_dir"], f["path"])
        if os.path.islink(path) or not os.path.isfile(path):
            problems.append("%s is missing or not a plain file" % f["path"])
        elif os.path.getsize(path) != f["size"]:
            problems.append("%s: %d bytes, the manifest says %d"
                            % (f["path"], os.path.getsize(path), f["size"]))
    return problems


def mark_in_use(places, revision):
    """Record the revision the server runs (pruning never removes it)."""
    tmp = places["in_use"] + ".tmp"
    with open(tmp, "w") as f:
        f.write(revision + "\n")
    os.rename(tmp, places["in_use"])

