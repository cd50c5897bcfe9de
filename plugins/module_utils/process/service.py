# -*- coding: utf-8 -*-
# Two service managers behind one interface (status / start / stop):
# - systemd for real nodes: a unit per server, KillMode=control-group, Restart=no;
# - a supervisor for machines without systemd (CI, containers, the simulated fleet): the launch
#   script runs in its own session as the service user, a JSON state file records the session
#   leader's identity (pid, start time, boot) and the configuration, and output is appended to
#   the log so the log of a failed run survives a restart.
# Both record the digest of the files the server was started from (internal: "started"
# restarts a server exactly when its rendered files changed) and the LaunchSpec's config hash
# (the configuration's one public name, also printed in the log's run separator).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import grp
import hashlib
import json
import os
import pwd
import subprocess
import time

from ..common.files import read_json, write_json_atomic
from . import procs

# The state file's format (the service's record of what runs; recovery and evidence read it):
#   pid, pid_start, boot_id  supervisor: the session leader's pid, its start time (clock ticks
#                            after boot, /proc/PID/stat field 22) and the boot id; null pid
#                            once stopped. A pid is trusted only with all three.
#   config_hash              the LaunchSpec's 12-hex config hash of the running configuration
#   digest                   digest of the launch files (internal, for restart decisions)
#   started_at, stopped_at   epoch seconds
#   stopped_by               who stopped it (stop.yml, a recovery), with stopped_at
#   log_offset               the log's size just before the start: the run's lines follow it
#   marker, user, manager    deployment marker, service user, service manager
# The LaunchSpec that was started is kept beside it (running_spec_file, mode 0600).
# After the server exits, the supervisor's wrapper writes one newline to the log with bash, so
# that a log that can no longer be written (a full disk) is named with bash's own error, e.g.
# "printf: write error: No space left on device", in a file beside the exit status.
_WRAPPER = ('"$0"; rc=$?; '
            'if command -v bash >/dev/null 2>&1; then bash -c \'printf "\\n"\' 2>"$2"; fi; '
            'echo "$rc" > "$1"')


def content_digest(items):
    """Digest of a deployment's launch files from (path, content bytes or None) pairs: the
    name of what a server was started from. The controller computes it from the rendered
    files, the node from the files on disk."""
    digest = hashlib.sha256()
    for path, content in items:
        digest.update(path.encode())
        digest.update(b"<missing>" if content is None else content)
    return digest.hexdigest()[:16]


def files_digest(paths):
    items = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                items.append((path, f.read()))
        except (OSError, IOError):
            items.append((path, None))
    return content_digest(items)


# What a start needs besides the service: sglang_service's options, and sglang_node's `start`,
# which starts a server that is not running the same way.
START_OPTIONS = dict(
    config_files=dict(type="list", elements="path", default=[]),
    config_hash=dict(type="str"),
    launch_spec=dict(type="dict"),
    running_spec_file=dict(type="path"),
    baseline_file=dict(type="path"),
    min_free_mb=dict(type="int", default=64),
    host=dict(type="str", default="127.0.0.1"),
    port=dict(type="int"),
    bootstrap_port=dict(type="int"),
    group_markers=dict(type="list", elements="str", default=[]),
    model_path=dict(type="str"),
)


class ServiceError(Exception):
    pass


def service_of(svc):
    """The service of a deployment from its description (manager, marker, unit_name,
    state_file, user, node_rank; script, log_file and workdir for the supervisor): the one
    place both managers are constructed."""
    if svc["manager"] == "systemd":
        return Systemd(svc["marker"], svc["unit_name"], svc["state_file"],
                       user=svc.get("user") or "root", node_rank=svc.get("node_rank") or 0,
                       log_file=svc.get("log_file"))
    return Supervisor(svc["marker"], svc["script"], svc["log_file"], svc["state_file"],
                      svc.get("workdir") or "/", user=svc.get("user") or "root",
                      node_rank=svc.get("node_rank") or 0)


def resolve_user(user):
    """(uid, gid, name) of the service user, or ServiceError naming it."""
    try:
        uid = procs.service_uid(user)
        entry = pwd.getpwuid(uid)
    except (KeyError, ValueError):
        raise ServiceError("the service user %r does not exist on this node. Fix: create it, "
                           "or set sglang_server_user to an existing user" % (user,)) from None
    return uid, entry.pw_gid, entry.pw_name


def write_running_spec(path, launch_spec):
    """The LaunchSpec that is started, as JSON, mode 0600 (it names paths and settings)."""
    if not path or launch_spec is None:
        return
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(launch_spec, f, sort_keys=True)
        os.chmod(tmp, 0o600)
        os.rename(tmp, path)
    except (OSError, IOError) as exc:
        raise ServiceError("cannot write the running spec %s: %s"
                           % (path, exc.strerror or exc)) from exc


def launch_errors(state_file):
    """Write errors the supervisor saw in the launch path of the last run (for the verdict)."""
    errors = list((read_json(state_file) or {}).get("launch_errors") or [])
    try:
        with open(state_file + ".launch-error") as f:
            text = f.read().strip()
    except (OSError, IOError):
        text = ""
    if text:
        errors.append("the server's log could not be written when it exited: %s" % text)
    return errors


class Supervisor(object):
    def __init__(self, marker, script, log_file, state_file, workdir, user="root", node_rank=0):
        self.marker = marker
        self.script = script
        self.log_file = log_file
        self.state_file = state_file
        self.workdir = workdir
        self.user = user
        self.uid, self.gid, self.user_name = resolve_user(user)
        self.node_rank = node_rank

    def _state(self):
        return read_json(self.state_file) or {}

    def status(self):
        state = self._state()
        found = procs.membership(self.marker, uid=self.uid, **procs.recorded_session(state))
        running = procs.recorded_main_alive(state, found["members"])
        return {"running": running, "pid": state.get("pid") if running else None,
                "digest": state.get("digest"), "config_hash": state.get("config_hash"),
                "members": found["members"], "foreign": found["foreign"],
                "started_at": state.get("started_at")}

    def running(self):
        """Whether the recorded main process still runs (the same process: start time and
        boot as recorded), without scanning the node's processes."""
        state = self._state()
        return bool(state.get("pid")) and procs.same_process(
            {"pid": state["pid"], "start_ticks": state.get("pid_start"),
             "boot_id": state.get("boot_id")})

    def start(self, digest, config_hash=None, launch_spec=None, running_spec_file=None):
        for folder in (os.path.dirname(self.state_file), os.path.dirname(self.log_file)):
            if folder and not os.path.isdir(folder):
                os.makedirs(folder)
        if os.getuid() != 0 and self.uid != os.getuid():
            raise ServiceError("the supervisor runs servers as the user of the module (uid %d), "
                               "not %s: become root (become: true)" % (os.getuid(), self.user))
        # The launch script opens each run in the log with its separator line.
        write_running_spec(running_spec_file, launch_spec)
        exit_file, error_file = self.state_file + ".exit", self.state_file + ".launch-error"
        for path in (exit_file, error_file):
            if os.path.exists(path):
                os.unlink(path)
            if self.uid != os.getuid():  # the wrapper, running as the service user, writes them
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
                os.chown(path, self.uid, self.gid)
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root") if self.uid == 0 else
            pwd.getpwuid(self.uid).pw_dir,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            procs.MARKER_VAR: self.marker,
        }
        as_user = {}
        if self.uid != os.getuid():
            as_user = dict(user=self.uid, group=self.gid,
                           extra_groups=[g.gr_gid for g in grp.getgrall()
                                         if self.user_name in g.gr_mem])
        offset = procs.log_size(self.log_file)
        try:
            # Never through a link (the start checks refuse one; this closes the race).
            fd = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                         | getattr(os, "O_NOFOLLOW", 0), 0o666)
            with os.fdopen(fd, "ab") as log:
                # The child keeps its own copy of the log descriptor after this block closes
                # ours. A small shell waits for the server and records its exit status.
                child = subprocess.Popen(
                    ["/bin/sh", "-c", _WRAPPER, self.script, exit_file, error_file],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.workdir, env=env, close_fds=True, start_new_session=True,
                    **as_user)
        except (OSError, IOError) as exc:
            raise ServiceError("cannot start %s: %s" % (self.script, exc)) from exc
        # Recorded at once: the start time tells this session leader from any later holder
        # of its PID.
        ident = procs.identity(child.pid) or {}
        write_json_atomic(self.state_file, {
            "pid": child.pid, "pid_start": ident.get("start_ticks"),
            "boot_id": ident.get("boot_id"), "digest": digest, "config_hash": config_hash,
            "started_at": time.time(), "marker": self.marker, "user": self.user,
            "manager": "supervisor", "log_offset": offset})
        # Detached: the server outlives this module; init reaps it.
        child.returncode = 0
        return child.pid

    def stop(self, timeout, by=None):
        report = procs.stop_deployment(self.marker, timeout, uid=self.uid,
                                       node_rank=self.node_rank, log_file=self.log_file,
                                       **procs.recorded_session(self._state()))
        _mark_stopped(self.state_file, by)
        return report


def _mark_stopped(state_file, by=None):
    # Keep the record (start time, digest): shm cleanup dates the last run by it. Who stopped
    # it is what the gate says of a server that is not running ("stopped by stop.yml").
    state = read_json(state_file)
    if state is not None:
        state.update(pid=None, stopped_at=time.time(), stopped_by=by)
        write_json_atomic(state_file, state)


def record_stop(state_file, by):
    """Record a stop of a server found not running (it had exited): its last start was
    stopped on purpose all the same. A stop already recorded keeps its time."""
    state = read_json(state_file)
    if state is not None and not (state.get("stopped_at") and state.get("pid") is None
                                  and state["stopped_at"] >= (state.get("started_at") or 0)):
        _mark_stopped(state_file, by)


class Systemd(object):
    def __init__(self, marker, unit_name, state_file, run=None, user="root", node_rank=0,
                 log_file=None):
        self.marker = marker
        self.unit = unit_name
        self.state_file = state_file
        self._run = run or self._subprocess_run
        self.user = user
        self.uid = resolve_user(user)[0]
        self.node_rank = node_rank
        self.log_file = log_file

    @staticmethod
    def _subprocess_run(args):
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return proc.returncode, proc.stdout.decode(), proc.stderr.decode()

    def _systemctl(self, *args):
        rc, out, err = self._run(["systemctl"] + list(args))
        if rc != 0:
            raise ServiceError("systemctl %s failed (rc=%d): %s" % (" ".join(args), rc,
                                                                    err.strip() or out.strip()))
        return out

    def status(self):
        out = self._systemctl("show", "-p", "ActiveState,MainPID", self.unit)
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        state = read_json(self.state_file) or {}
        running = props.get("ActiveState") in ("active", "activating")
        pid = int(props.get("MainPID") or 0) or None
        found = procs.membership(self.marker, unit=self.unit, uid=self.uid)
        return {"running": running, "pid": pid if running else None,
                "digest": state.get("digest"), "config_hash": state.get("config_hash"),
                "members": found["members"], "foreign": found["foreign"],
                "started_at": state.get("started_at")}

    def running(self):
        """Whether the unit is active, without scanning the node's processes."""
        props = self._props("ActiveState")
        return props.get("ActiveState") in ("active", "activating")

    def _props(self, *names):
        out = self._systemctl("show", "-p", ",".join(names), self.unit)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def start(self, digest, config_hash=None, launch_spec=None, running_spec_file=None):
        write_running_spec(running_spec_file, launch_spec)
        # Reload the manager only when the unit file is new or changed on disk.
        props = self._props("LoadState", "NeedDaemonReload")
        if props.get("LoadState") == "not-found" or props.get("NeedDaemonReload") == "yes":
            self._systemctl("daemon-reload")
        if self._props("UnitFileState").get("UnitFileState") != "enabled":
            self._systemctl("enable", self.unit)
        offset = procs.log_size(self.log_file) if self.log_file else 0
        self._systemctl("restart", self.unit)
        write_json_atomic(self.state_file, {"digest": digest, "config_hash": config_hash,
                                             "started_at": time.time(), "marker": self.marker,
                                             "user": self.user, "manager": "systemd",
                                             "unit": self.unit, "log_offset": offset,
                                             "boot_id": procs.boot_id()})
        return self.status()["pid"]

    def stop(self, timeout, by=None):
        escalated = None
        if self.node_rank:
            # systemctl stop would wait out TimeoutStopSec on a rank that only logs SIGTERM.
            members = procs.membership(self.marker, unit=self.unit, uid=self.uid)["members"]
            offset = procs.log_size(self.log_file)
            self._systemctl("kill", "--signal=SIGTERM", self.unit)
            left, escalated = procs.wait_after_term(
                dict((m["pid"], m["start_ticks"]) for m in members), timeout, self.node_rank,
                self.log_file, offset)
            if left:
                self._systemctl("kill", "--signal=SIGKILL", self.unit)
        self._systemctl("stop", self.unit)
        # KillMode=control-group ends the cgroup; the sweep catches anything that escaped it.
        report = procs.stop_deployment(self.marker, timeout, unit=self.unit, uid=self.uid,
                                       node_rank=self.node_rank, log_file=self.log_file)
        report["escalated"] = report["escalated"] or escalated
        _mark_stopped(self.state_file, by)
        return report
