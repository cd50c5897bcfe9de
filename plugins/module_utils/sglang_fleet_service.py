# -*- coding: utf-8 -*-
# Two service managers behind one interface (status / start / stop):
# - systemd for real nodes: a unit per server, KillMode=control-group, Restart=no;
# - a supervisor for machines without systemd (CI, containers, the simulated fleet): the launch
#   script runs in its own session, a JSON pid file records pid and configuration digest, and
#   output is appended to the log so the log of a failed run survives a restart.
# Both record the digest of the files the server was started from, so "started" restarts a
# server exactly when its rendered files changed.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os
import subprocess
import time

try:
    from ansible.module_utils import sglang_fleet_procs as procs
    from ansible.module_utils.sglang_fleet_files import read_json, write_json_atomic
except ImportError:  # imported by the controller package or its tests, outside Ansible
    from sglang_fleet_node import sglang_fleet_procs as procs
    from sglang_fleet_node.sglang_fleet_files import read_json, write_json_atomic


def files_digest(paths):
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.encode())
        try:
            with open(path, "rb") as f:
                digest.update(f.read())
        except (OSError, IOError):
            digest.update(b"<missing>")
    return digest.hexdigest()[:16]


class ServiceError(Exception):
    pass


class Supervisor(object):
    def __init__(self, marker, script, log_file, state_file, workdir):
        self.marker = marker
        self.script = script
        self.log_file = log_file
        self.state_file = state_file
        self.workdir = workdir

    def _session(self):
        # start_new_session makes the main pid the session id every child inherits.
        return (read_json(self.state_file) or {}).get("pid")

    def status(self):
        state = read_json(self.state_file) or {}
        members = procs.deployment_processes(self.marker, self._session())
        main_pid = state.get("pid")
        running = any(p["pid"] == main_pid for p in members)
        return {"running": running, "pid": main_pid if running else None,
                "digest": state.get("digest"), "members": members,
                "started_at": state.get("started_at")}

    def start(self, digest):
        for path in (os.path.dirname(self.log_file), os.path.dirname(self.state_file)):
            if not os.path.isdir(path):
                os.makedirs(path)
        with open(self.log_file, "ab") as log:
            # The launch script opens the run with its separator line (as under systemd).
            env = {
                "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
                "HOME": os.environ.get("HOME", "/root"),
                "LANG": os.environ.get("LANG", "C.UTF-8"),
                procs.MARKER_VAR: self.marker,
            }
            exit_file = self.state_file + ".exit"
            if os.path.exists(exit_file):
                os.unlink(exit_file)
            # The child keeps its own copy of the log descriptor after this block closes ours.
            # A small shell waits for the server and records its exit status for the gate.
            child = subprocess.Popen(
                ["/bin/sh", "-c", '"$0"; echo "$?" > "$1"', self.script, exit_file],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, env=env, close_fds=True, start_new_session=True)
        write_json_atomic(self.state_file, {"pid": child.pid, "digest": digest,
                                             "started_at": time.time(),
                                             "marker": self.marker})
        # Detached: the server outlives this module; init reaps it.
        child.returncode = 0
        return child.pid

    def stop(self, timeout):
        report = procs.stop_deployment(self.marker, timeout, session_id=self._session())
        _mark_stopped(self.state_file)
        return report


def _mark_stopped(state_file):
    # Keep the record (start time, digest): shm cleanup dates the last run by it.
    state = read_json(state_file)
    if state is not None:
        state.update(pid=None, stopped_at=time.time())
        write_json_atomic(state_file, state)


class Systemd(object):
    def __init__(self, marker, unit_name, state_file, run=None):
        self.marker = marker
        self.unit = unit_name
        self.state_file = state_file
        self._run = run or self._subprocess_run

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
        return {"running": running, "pid": pid if running else None,
                "digest": state.get("digest"),
                "members": procs.deployment_processes(self.marker, unit=self.unit),
                "started_at": state.get("started_at")}

    def _props(self, *names):
        out = self._systemctl("show", "-p", ",".join(names), self.unit)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def start(self, digest):
        # Reload the manager only when the unit file is new or changed on disk.
        props = self._props("LoadState", "NeedDaemonReload")
        if props.get("LoadState") == "not-found" or props.get("NeedDaemonReload") == "yes":
            self._systemctl("daemon-reload")
        if self._props("UnitFileState").get("UnitFileState") != "enabled":
            self._systemctl("enable", self.unit)
        self._systemctl("restart", self.unit)
        write_json_atomic(self.state_file, {"digest": digest, "started_at": time.time(),
                                             "marker": self.marker})
        return self.status()["pid"]

    def stop(self, timeout):
        self._systemctl("stop", self.unit)
        # KillMode=control-group ends the cgroup; the sweep catches anything that escaped it.
        report = procs.stop_deployment(self.marker, timeout, unit=self.unit)
        _mark_stopped(self.state_file)
        return report
