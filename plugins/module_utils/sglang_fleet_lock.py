# -*- coding: utf-8 -*-
# One lock per deployment, taken by every run that changes it (deploy, recover, watch's
# recoveries, stop), alive or not.
#
# The lock file lives on the node beside the deployment's state. Its owner is the controller
# run that took it: the ansible-playbook process (host name, PID, start time in clock ticks
# after boot, boot id), which the sglang_lock action plugin reads on the controller: Ansible
# runs each task in a worker forked from ansible-playbook, so the worker's parent is the run.
# A lock whose owner is gone (that PID dead, or now another process, or the controller
# rebooted) is taken over by the next run from the same controller, with a line saying so; no
# fixed expiry. A lock held from another controller cannot be checked from here: the run is
# refused, naming the owner.
#
# The lock also records a recovery's progress (stage, failed config hash, chosen next
# overrides, evidence), so that the run that takes over a killed recovery can finish it.
#
# Writers hold an flock on the file while they read, compare and write, and check that the
# file they locked is still the one at the path, so two runs taking over the same dead lock
# cannot both win. Used on the node by library/sglang_lock.py and on the controller by
# plugins/action/sglang_lock.py.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import json
import os
import socket
import time


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, IOError):
        return None


def _start_ticks(pid):
    stat = _read("/proc/%d/stat" % pid)
    if stat is None:
        return None
    fields = stat.rpartition(")")[2].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _boot_id():
    return (_read("/proc/sys/kernel/random/boot_id") or "").strip() or None


def run_identity(pid):
    """The identity of a run on this machine: host name, pid, start time, boot."""
    return {"host": socket.gethostname(), "pid": pid, "start_ticks": _start_ticks(pid),
            "boot_id": _boot_id()}


def controller_run():
    """The ansible-playbook process this task belongs to. Action plugins run in a worker
    forked from it; when there is no such parent (a task run in the main process), this
    process is the run."""
    parent = os.getppid()
    cmdline = (_read("/proc/%d/cmdline" % parent) or "").replace("\0", " ")
    return run_identity(parent if "ansible" in cmdline else os.getpid())


def lock_record(name, purpose, run, owner=None):
    """What a run writes into the lock it takes."""
    return {"owner": owner or "%s of %s" % (purpose, name), "purpose": purpose, "name": name,
            "since": time.time(), "run": run}


def same_run(a, b):
    return bool(a and b) and all(a.get(k) == b.get(k) for k in ("host", "pid", "start_ticks",
                                                                 "boot_id"))


def owner_gone(owner, here):
    """Why the run that owns a lock is gone, judged from the machine `here` describes; None
    while it is alive, or when it ran on another machine (it cannot be checked from here)."""
    if not owner or owner.get("host") != here.get("host"):
        return None
    if owner.get("boot_id") and here.get("boot_id") and owner["boot_id"] != here["boot_id"]:
        return "its controller %s has rebooted since" % owner["host"]
    ticks = _start_ticks(int(owner.get("pid") or 0)) if owner.get("pid") else None
    if ticks is None:
        return "pid %s on %s is gone" % (owner.get("pid"), owner["host"])
    if owner.get("start_ticks") is not None and ticks != owner["start_ticks"]:
        return "pid %s on %s is now another process" % (owner["pid"], owner["host"])
    return None


def describe(record):
    """One line naming who holds a lock, for messages."""
    run = record.get("run") or {}
    since = record.get("since")
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?")
    text = "%s (ansible-playbook pid %s on %s, since %s, %.0f s ago)" % (
        record.get("owner") or record.get("purpose") or "unknown run", run.get("pid", "?"),
        run.get("host", "?"), when, time.time() - since if since else 0)
    stage = (record.get("recovery") or {}).get("stage")
    if stage:
        text += "; it records an unfinished recovery (stage %s)" % stage
    return text


class LockError(Exception):
    pass


class LockFile(object):
    def __init__(self, path):
        self.path = path

    def _open_locked(self):
        """Open the existing lock file and flock it, making sure it is still the file at the
        path (a release may have removed it meanwhile). None when there is no lock file."""
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_RDWR)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return None
                raise
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except OSError:
                same = False
            if same:
                return fd
            os.close(fd)
        raise LockError("the lock file %s keeps changing" % self.path)

    @staticmethod
    def _load(fd):
        os.lseek(fd, 0, os.SEEK_SET)
        raw = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            raw += chunk
        try:
            record = json.loads(raw.decode("utf-8") or "null")
        except ValueError:
            record = None
        return record if isinstance(record, dict) else {"owner": "unreadable lock file",
                                                         "raw": raw[:200].decode("utf-8",
                                                                                 "replace")}

    @staticmethod
    def _store(fd, record):
        data = json.dumps(record, sort_keys=True).encode("utf-8")
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, data)
        os.fsync(fd)

    def read(self):
        fd = self._open_locked()
        if fd is None:
            return None
        try:
            return self._load(fd)
        finally:
            os.close(fd)

    def acquire(self, record, take_over=None):
        """Take the lock for `record` (which names its run). Returns (outcome, held):
        'acquired' (it was free), 'reentered' (this run holds it already), 'taken_over' (held
        was exactly `take_over`, replaced), or 'held' (someone else holds it: held)."""
        for _ in range(20):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
            else:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    self._store(fd, record)
                    self._sync_dir()
                finally:
                    os.close(fd)
                return "acquired", None
            fd = self._open_locked()
            if fd is None:
                continue  # released meanwhile: try to create it again
            try:
                held = self._load(fd)
                if held.get("raw") == "":  # its creator has not written it yet
                    time.sleep(0.05)
                    continue
                if same_run(held.get("run"), record.get("run")):
                    return "reentered", held
                if take_over is not None and _same_record(held, take_over):
                    self._store(fd, record)
                    return "taken_over", held
                return "held", held
            finally:
                os.close(fd)
        raise LockError("could not take the lock %s: it keeps appearing and disappearing"
                        % self.path)

    def update(self, run, recovery):
        """Record a recovery's progress in the lock this run holds."""
        fd = self._open_locked()
        if fd is None:
            raise LockError("the lock %s is not held (it was removed)" % self.path)
        try:
            held = self._load(fd)
            if not same_run(held.get("run"), run):
                raise LockError("the lock %s is held by %s, not this run"
                                % (self.path, describe(held)))
            held["recovery"] = dict(held.get("recovery") or {}, **recovery)
            self._store(fd, held)
            return held
        finally:
            os.close(fd)

    def release(self, run):
        """Remove the lock if this run holds it; returns whether it did."""
        fd = self._open_locked()
        if fd is None:
            return False
        try:
            if not same_run(self._load(fd).get("run"), run):
                return False
            os.unlink(self.path)
            self._sync_dir()
            return True
        finally:
            os.close(fd)

    def _sync_dir(self):
        try:
            dfd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)


def _same_record(a, b):
    return same_run(a.get("run"), b.get("run")) and a.get("since") == b.get("since")
