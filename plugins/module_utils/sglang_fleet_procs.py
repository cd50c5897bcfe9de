# -*- coding: utf-8 -*-
# Finding a deployment's processes by membership, never by name. Three signals, any one
# suffices: the environment marker SGLANG_FLEET_DEPLOYMENT=<host>:<deployment> inherited by
# every child (SPT_NOENV=1 keeps setproctitle from erasing it), the supervisor's session id,
# and the systemd unit's cgroup. All three survive reparenting, so orphans are found too.
# Pure Python on /proc, shared by the service, stop and recovery code.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import time

MARKER_VAR = "SGLANG_FLEET_DEPLOYMENT"


def _read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except (OSError, IOError):
        return None


# SGLang takes its API key on the command line: never report it.
SECRET_FLAGS = ("--api-key", "--admin-api-key")
MASK = "********"


def mask_argv(args):
    out, hide_next = [], False
    for arg in args:
        flag, eq, _ = arg.partition("=")
        if hide_next:
            out.append(MASK)
        elif eq and flag in SECRET_FLAGS:
            arg = flag + "=" + MASK
            out.append(arg)
        else:
            out.append(arg)
        hide_next = not hide_next and arg in SECRET_FLAGS
    return out


def secret_values(pid):
    """The values given to secret flags on a live process's command line (to mask them in
    anything that prints the command line, such as a py-spy dump)."""
    raw = _read("/proc/%d/cmdline" % pid, "rb") or b""
    args = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    values = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if eq and flag in SECRET_FLAGS:
            values.append(value)
        elif arg in SECRET_FLAGS and i + 1 < len(args):
            values.append(args[i + 1])
    return [v for v in values if v]


def process_info(pid):
    stat = _read("/proc/%d/stat" % pid)
    if stat is None:
        return None
    head, _, tail = stat.rpartition(")")
    fields = tail.split()
    cmdline = _read("/proc/%d/cmdline" % pid, "rb") or b""
    return {
        "pid": pid,
        "comm": head.split("(", 1)[-1],
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "utime_ticks": int(fields[11]),
        "stime_ticks": int(fields[12]),
        "cmdline": " ".join(mask_argv(cmdline.decode("utf-8", "replace").split("\0"))).strip(),
    }


def environ_of(pid):
    raw = _read("/proc/%d/environ" % pid, "rb")
    if raw is None:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def all_pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def own_lineage():
    """This process and its ancestors: never signalled, whatever they carry."""
    pids = set()
    pid = os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        info = process_info(pid)
        if info is None:
            break
        pid = info["ppid"]
    return pids


def cgroup_of(pid):
    return _read("/proc/%d/cgroup" % pid) or ""


def deployment_processes(marker, session_id=None, unit=None):
    """Every live process of the deployment: marker in its environment, or in the
    supervisor's session, or in the systemd unit's cgroup."""
    skip = own_lineage()
    unit_suffix = "/" + unit if unit else None
    found = []
    for pid in all_pids():
        if pid in skip:
            continue
        info = process_info(pid)
        if info is None or info["state"] in ("Z", "X"):
            continue
        member = session_id is not None and info["sid"] == session_id
        if not member and unit_suffix:
            member = any(line.rstrip().endswith(unit_suffix)
                         for line in cgroup_of(pid).splitlines())
        if not member:
            env = environ_of(pid)
            member = bool(env) and env.get(MARKER_VAR) == marker
        if member:
            found.append(info)
    return sorted(found, key=lambda p: p["pid"])


def signal_pids(pids, sig):
    sent = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except OSError:
            pass
    return sent


def wait_until_gone(marker, timeout, poll=0.1, session_id=None, unit=None):
    """Poll until no member is left; returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = deployment_processes(marker, session_id, unit)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll)


def stop_deployment(marker, term_timeout, kill_timeout=10.0, skip_term=False,
                    session_id=None, unit=None):
    """TERM every member (unless skipped), wait, then KILL what is left; report each step."""
    report = {"term_sent": [], "kill_sent": [], "remaining": []}
    members = deployment_processes(marker, session_id, unit)
    if not members:
        return report
    if not skip_term:
        report["term_sent"] = signal_pids([p["pid"] for p in members], signal.SIGTERM)
        members = wait_until_gone(marker, term_timeout, session_id=session_id, unit=unit)
    if members:
        report["kill_sent"] = signal_pids([p["pid"] for p in members], signal.SIGKILL)
        members = wait_until_gone(marker, kill_timeout, session_id=session_id, unit=unit)
    report["remaining"] = members
    return report
