# -*- coding: utf-8 -*-
# One lock per deployment, taken by every run that changes it (deploy, recover, watch's
# recoveries, stop), alive or not.
#
# The lock file lives on the node beside the deployment's state. Its owner is the controller
# run that took it: the ansible-playbook process, which the sglang_lock action plugin reads on
# the controller (Ansible runs each task in a worker forked from ansible-playbook, so the
# worker's parent is the run). The run is named by a run id, unique to that process on that
# kernel (boot id, PID namespace, PID and start time, hashed), with the host name and PID kept
# for people to read.
#
# Whether the owner still runs is proven one of two ways, never guessed:
# - by its PID, only from a controller on the same kernel (boot id) and in the same PID
#   namespace, where that PID means the same process: the PID is dead, or is now another
#   process (another start time). A host name proves nothing: containers share it, and two
#   machines can have the same one. A run in another PID namespace of the same kernel (a
#   controller in a container) is checked from the kernel's initial PID namespace, as root:
#   there every process is visible with its PID in each namespace it belongs to (NSpid).
# - by its lease: the owner renews the lock (every lock step, every gate observation) and
#   declares for how long it may go silent (the lease). A lock not renewed for longer than its
#   lease is stale. The lease is timed on the node's own clocks: the boot-time clock while the
#   node has not rebooted (no clock step or time zone moves it), the wall clock after a reboot.
# A lock whose owner is proven gone is taken over by compare-and-swap on the exact record
# read (a renewal in between defeats it); every take-over is recorded in the ledger by the
# action plugin.
#
# The lock also records a recovery's progress (stage, failed config hash, chosen next
# overrides, evidence), so that the run that takes over a killed recovery can finish it.
#
# Every write is whole: the record goes to a temporary file, flushed, then linked (a new lock)
# or renamed (a change) into place, so no run of this code leaves an empty or half-written
# lock. An empty lock file was therefore left by something else (a crash of an older version
# between its create and its write, a full disk, a hand): after a short grace it names no
# owner and is taken over. A lock that is not empty but unreadable is refused with what it
# holds and the fix. Writers hold an flock on the file while they read, compare and write, and
# check that the file they locked is still the one at the path, so two runs taking over the
# same dead lock cannot both win. Used on the node by the modules sglang_lock, sglang_node and
# sglang_health, and on the controller by plugins/action/sglang_lock.py.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import hashlib
import json
import os
import socket
import time

# The lease of a run that declares none, and of records written before leases existed.
LEASE_S = 900.0
# How long an empty lock file may be a lock being created (by an older version, which
# created the file and then wrote it) before it counts as abandoned.
EMPTY_GRACE_S = 10.0
# Seconds added to the longest silence a run expects (see lease_for).
LEASE_MARGIN_S = 600.0
# The longest a stop waits for an owner it cannot check (another kernel or PID namespace) that
# has stopped renewing: a live run renews at each lock step and gate observation, and goes
# quiet longer only while it gates other hosts (its lease allows for that). A stop only ends
# the deployment, so it need not wait out a lease sized for a deploy's gates.
STOP_WAIT_S = 900.0
_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", getattr(time, "CLOCK_MONOTONIC", None))
# The kernel's initial PID namespace (PROC_PID_INIT_INO): from it every process is visible.
INIT_PID_NS = "pid:[4026531836]"


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


def _uptime():
    """Seconds on the boot-time clock: steps of the wall clock do not move it."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else None


def _pid_namespace():
    """This process's PID namespace, when /proc shows that namespace's PIDs (else a PID read
    there names another process and proves nothing)."""
    try:
        if int(os.readlink("/proc/self")) != os.getpid():
            return None
        return os.readlink("/proc/self/ns/pid")
    except (OSError, ValueError):
        return None


def _run_id(identity):
    blob = json.dumps([identity.get(k) for k in ("boot_id", "pid_ns", "pid", "start_ticks")])
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


def run_identity(pid):
    """The identity of a run of this machine's namespace: host name and pid (for people),
    start time, boot, PID namespace, and the run id they make."""
    identity = {"host": socket.gethostname(), "pid": pid, "start_ticks": _start_ticks(pid),
                "boot_id": _boot_id(), "pid_ns": _pid_namespace()}
    identity["run_id"] = _run_id(identity)
    return identity


def controller_run():
    """The ansible-playbook process this task belongs to. Action plugins run in a worker
    forked from it; when there is no such parent (a task run in the main process), this
    process is the run."""
    parent = os.getppid()
    cmdline = (_read("/proc/%d/cmdline" % parent) or "").replace("\0", " ")
    return run_identity(parent if "ansible" in cmdline else os.getpid())


def stamped(entry, run):
    """A ledger entry naming the run that writes it (`run`: a run_identity), so that the
    ledgers of runs made in parallel (slices of one inventory) merge and each entry says whose
    it is."""
    return dict(entry, run={"id": run.get("run_id"), "controller": run.get("host"),
                            "pid": run.get("pid")})


def lease_for(gate_budget_s, hosts=1, forks=1):
    """The lease a deploy or recovery declares: the longest it may go without renewing. A host
    renews at each gate observation, but waits unrenewed while the play gates the other hosts:
    their gates run `forks` at a time, each up to the gate's budget."""
    try:
        batches = -(-max(1, int(hosts)) // max(1, int(forks)))
        return float(gate_budget_s) * batches + LEASE_MARGIN_S
    except (TypeError, ValueError):
        return LEASE_S


def stamp(record, lease=None):
    """Mark `record` renewed now, on this node's clocks, with `lease` if given."""
    record["renewed"] = time.time()
    record["renewed_boot"] = _boot_id()
    record["renewed_uptime"] = _uptime()
    if lease:
        record["lease_s"] = float(lease)
    return record


def lock_record(name, purpose, run, owner=None, lease=None):
    """What a run writes into the lock it takes."""
    return stamp({"owner": owner or "%s of %s" % (purpose, name), "purpose": purpose,
                  "name": name, "since": time.time(), "run": run,
                  "lease_s": float(lease or LEASE_S)})


def silence(record):
    """Seconds since the lock's owner last renewed it, on this node's clocks."""
    uptime = record.get("renewed_uptime")
    if uptime is not None and record.get("renewed_boot") and \
            record.get("renewed_boot") == _boot_id() and _uptime() is not None:
        return max(0.0, _uptime() - float(uptime))
    return max(0.0, time.time() - float(record.get("renewed") or record.get("since") or 0))


def stale_reason(record):
    """Why the lock in `record` is held by nobody, judged on the node: it is empty (after a
    grace), or its owner stopped renewing it for longer than its lease. None otherwise (an
    unreadable lock is never judged stale: see describe)."""
    if record.get("empty"):
        age = time.time() - float(record.get("written") or 0)
        if age >= EMPTY_GRACE_S:
            return ("the lock file is empty (for %.0f s): it names no owner; sglang-fleet writes "
                    "a lock whole, so an empty one was left by a crash, a full disk or a hand"
                    % age)
        return None
    if record.get("unreadable") or not record.get("run"):
        return None
    lease = float(record.get("lease_s") or LEASE_S)
    quiet = silence(record)
    if quiet > lease:
        return "its run has not renewed the lock for %.0f s, longer than its lease (%.0f s)" % (
            quiet, lease)
    return None


def stop_may_take_over(held, silence_s, checkable):
    """Why a stop may take over a lock whose owner it cannot check (`checkable` False) and
    whose lease has not run out: the owner has been silent for longer than STOP_WAIT_S, on
    the node's clocks (`silence_s`). None otherwise."""
    if checkable or silence_s is None or not held.get("run") or held.get("unreadable"):
        return None
    if float(silence_s) > STOP_WAIT_S:
        return ("its run cannot be checked from here and has not renewed the lock for %.0f s; "
                "a stop waits at most %.0f s for such a run, not its whole lease (%.0f s)" % (
                    float(silence_s), STOP_WAIT_S, float(held.get("lease_s") or LEASE_S)))
    return None


def same_run(a, b):
    if not (a and b):
        return False
    if a.get("run_id") and b.get("run_id"):
        return a["run_id"] == b["run_id"]
    return all(a.get(k) == b.get(k) for k in ("host", "pid", "start_ticks", "boot_id"))


def pid_checkable(owner, here):
    """Whether the owner's PID means the same process here: same kernel, same PID namespace."""
    return bool(owner and here and owner.get("pid") and owner.get("boot_id")
                and owner.get("pid_ns") and owner.get("boot_id") == here.get("boot_id")
                and owner.get("pid_ns") == here.get("pid_ns"))


def namespace_checkable(owner, here):
    """Whether the owner, in another PID namespace of this kernel, can be found from here: a
    root controller in the kernel's initial PID namespace sees every process of the kernel,
    with its PID in each namespace it belongs to."""
    return bool(owner and here and owner.get("pid") and owner.get("pid_ns")
                and owner.get("boot_id") and owner.get("boot_id") == here.get("boot_id")
                and here.get("pid_ns") == INIT_PID_NS and os.geteuid() == 0)


def owner_checkable(owner, here):
    """Whether the owner's PID proves it alive or gone from here (see owner_gone)."""
    return pid_checkable(owner, here) or namespace_checkable(owner, here)


def _in_namespace(pid_ns, pid):
    """Start ticks of the process that is PID `pid` in PID namespace `pid_ns`, None when no
    process is. Raises OSError when a process's namespace cannot be read (nothing is proven)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        nspid = _nspid(name)
        try:
            ns = os.readlink("/proc/%s/ns/pid" % name)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ESRCH):
                continue  # exited meanwhile (a zombie has no namespace left)
            if nspid is not None and len(nspid) == 1:
                continue  # unreadable, but a member of the initial namespace only
            raise
        if ns == pid_ns and nspid and nspid[-1] == str(pid):
            return _start_ticks(int(name))
    return None


def _nspid(pid):
    """The process's PID in each PID namespace it is a member of, outermost first."""
    for line in (_read("/proc/%s/status" % pid) or "").splitlines():
        if line.startswith("NSpid:"):
            return line.split()[1:]
    return None


def _gone_from_init_namespace(owner):
    try:
        ticks = _in_namespace(owner["pid_ns"], int(owner["pid"]))
    except OSError:
        return None
    where = "pid %s of PID namespace %s on %s" % (owner["pid"], owner["pid_ns"],
                                                   owner.get("host"))
    if ticks is None:
        return ("%s is gone (no process of its kernel is that run: checked from the initial "
                "PID namespace, which sees them all)" % where)
    if owner.get("start_ticks") is not None and ticks != owner["start_ticks"]:
        return "%s is now another process (checked from the initial PID namespace)" % where
    return None


def owner_gone(owner, here):
    """Why the run that owns a lock is proven gone by its PID, judged from `here` (the
    controller asking); None while it is alive, or when its PID cannot be checked from here
    (another kernel, or another PID namespace not visible from here: its lease decides, see
    stale_reason)."""
    if not pid_checkable(owner, here):
        return _gone_from_init_namespace(owner) if namespace_checkable(owner, here) else None
    ticks = _start_ticks(int(owner["pid"]))
    if ticks is None:
        return "pid %s on %s is gone (checked on its kernel, in its PID namespace)" % (
            owner["pid"], owner.get("host"))
    if owner.get("start_ticks") is not None and ticks != owner["start_ticks"]:
        return ("pid %s on %s is now another process (checked on its kernel, in its PID "
                "namespace)" % (owner["pid"], owner.get("host")))
    return None


def describe(record):
    """One line naming who holds a lock, for messages."""
    if record.get("empty"):
        return "an empty lock file (no owner written)"
    if record.get("unreadable"):
        return "an unreadable lock file (it holds %r)" % record.get("raw", "")[:120]
    run = record.get("run") or {}
    since = record.get("since")
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?")
    text = "%s (ansible-playbook pid %s on %s, since %s, %.0f s ago" % (
        record.get("owner") or record.get("purpose") or "unknown run", run.get("pid", "?"),
        run.get("host", "?"), when, time.time() - since if since else 0)
    if record.get("renewed") or record.get("since"):
        text += "; renewed %.0f s ago, lease %.0f s" % (
            silence(record), float(record.get("lease_s") or LEASE_S))
    text += ")"
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
        path (a release or a write may have replaced it meanwhile). None when there is no
        lock file."""
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return None
                if exc.errno == errno.ELOOP:
                    raise LockError("%s is a symbolic link: a lock is a plain file. Fix: "
                                    "remove the link" % self.path) from None
                if exc.errno == errno.EISDIR:
                    raise LockError(
                        "%s is a folder: a lock is a plain file. Fix: if no deploy, recover or "
                        "stop of this deployment is running, remove the folder (rmdir %s)"
                        % (self.path, self.path)) from None
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
        st = os.fstat(fd)
        if not raw.strip():
            return {"empty": True, "raw": raw.decode("utf-8", "replace"),
                    "written": st.st_mtime, "ino": st.st_ino}
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:
            record = None
        if isinstance(record, dict):
            return record
        return {"unreadable": True, "raw": raw[:200].decode("utf-8", "replace"),
                "written": st.st_mtime, "ino": st.st_ino}

    def _temp(self, record):
        """The whole record in a new file beside the lock (0600), flushed."""
        folder = os.path.dirname(self.path) or "."
        tmp = os.path.join(folder, ".%s.%d.%s" % (os.path.basename(self.path), os.getpid(),
                                                  os.urandom(4).hex()))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            data = json.dumps(record, sort_keys=True).encode("utf-8")
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def _create(self, record):
        """Put `record` in place as a new lock; False when a lock file exists."""
        tmp = self._temp(record)
        try:
            os.link(tmp, self.path)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
            return False
        finally:
            os.unlink(tmp)
        self._sync_dir()
        return True

    def _store(self, record):
        """Replace the lock (whose flock the caller holds) by `record`, whole."""
        tmp = self._temp(record)
        try:
            os.rename(tmp, self.path)
        except OSError:
            os.unlink(tmp)
            raise
        self._sync_dir()

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
        'acquired' (it was free), 'reentered' (this run holds it already: renewed, with the
        lease `record` declares), 'taken_over' (held was exactly `take_over`, replaced), or
        'held' (someone else holds it: held, with 'stale' saying why nobody does when the
        node can tell: see stale_reason)."""
        deadline = time.time() + EMPTY_GRACE_S + 5
        while True:
            if self._create(record):
                return "acquired", None
            fd = self._open_locked()
            if fd is None:  # released meanwhile: try to create it again
                if time.time() > deadline:
                    raise LockError("could not take the lock %s: other runs keep taking and "
                                    "releasing it" % self.path)
                continue
            try:
                held = self._load(fd)
                if same_run(held.get("run"), record.get("run")):
                    stamp(held, record.get("lease_s"))
                    self._store(held)
                    return "reentered", held
                if take_over is not None and _same_record(held, take_over):
                    self._store(record)
                    return "taken_over", held
                stale = stale_reason(held)
                # An empty lock may be one an older version is creating: give it its grace.
                if not (held.get("empty") and stale is None and time.time() < deadline):
                    if stale:
                        held["stale"] = stale
                    return "held", held
            finally:
                os.close(fd)
            time.sleep(0.2)

    def renew(self, run, lease=None):
        """Renew the lease of the lock this run holds; False when it does not hold it."""
        fd = self._open_locked()
        if fd is None:
            return False
        try:
            held = self._load(fd)
            if not same_run(held.get("run"), run):
                return False
            self._store(stamp(held, lease))
            return True
        finally:
            os.close(fd)

    def update(self, run, recovery):
        """Record a recovery's progress in the lock this run holds (which renews it)."""
        fd = self._open_locked()
        if fd is None:
            raise LockError("the lock %s is not held (it was removed)" % self.path)
        try:
            held = self._load(fd)
            if not same_run(held.get("run"), run):
                raise LockError("the lock %s is held by %s, not this run"
                                % (self.path, describe(held)))
            held["recovery"] = dict(held.get("recovery") or {}, **recovery)
            self._store(stamp(held))
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
    """Whether lock record `a` is exactly `b` as read before (a renewal changes it)."""
    if a.get("empty") or a.get("unreadable"):
        return all(a.get(k) == b.get(k) for k in ("empty", "unreadable", "raw", "written",
                                                  "ino"))
    return same_run(a.get("run"), b.get("run")) and all(
        a.get(k) == b.get(k) for k in ("since", "renewed", "renewed_uptime"))
