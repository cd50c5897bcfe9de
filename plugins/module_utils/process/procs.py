# -*- coding: utf-8 -*-
# Finding a deployment's processes by membership, never by name, and never by a bare number.
#
# Three membership signals, any one suffices: the environment marker
# SGLANG_FLEET_DEPLOYMENT=<host>:<deployment> inherited by every child (SPT_NOENV=1 keeps
# setproctitle from erasing it), the supervisor's session, and the systemd unit's cgroup. All
# three survive reparenting, so orphans are found too.
#
# Identity, not numbers: a PID or session id read from a state file may have been reused by an
# unrelated process since it was written. A recorded session is trusted only while its leader
# is alive with the start time (/proc/PID/stat field 22) and boot recorded at start, and still
# carries the deployment's marker. Every member must also run as the deployment's service user
# (real uid); a process of another user that carries the marker is reported, never signalled.
# Pure Python on /proc, shared by the service, stop, recovery and observation code.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd
import re
import signal
import time

from ..common.secrets import SECRET_FLAGS, mask_argv

MARKER_VAR = "SGLANG_FLEET_DEPLOYMENT"

# Real SGLang's non-zero node ranks (sglang/srt/entrypoints/engine.py, 0.5.23) install a SIGTERM
# handler that only logs this line and waits for rank 0's ShutdownReq broadcast; a stop must
# not wait out its whole timeout there.
SIGTERM_ONLY_LOGGED = re.compile(r"SIGTERM received on node_rank \d+")
NONZERO_RANK_TERM_GRACE = 5.0


def _read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except (OSError, IOError):
        return None


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


def _real_uid(pid):
    for line in (_read("/proc/%d/status" % pid) or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


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
        # Field 22: clock ticks after boot when the process started. With the boot id it names
        # one process for good; a PID alone names whoever holds it now.
        "start_ticks": int(fields[19]),
        "uid": _real_uid(pid),
        "cmdline": " ".join(mask_argv(cmdline.decode("utf-8", "replace").split("\0"))).strip(),
    }


def boot_id():
    return (_read("/proc/sys/kernel/random/boot_id") or "").strip() or None


def identity(pid):
    """What a state file records to recognise this process later: pid, start time, boot."""
    info = process_info(pid)
    if info is None:
        return None
    return {"pid": pid, "start_ticks": info["start_ticks"], "boot_id": boot_id()}


def same_process(record):
    """Whether the process a record names is still alive: same pid, start time and boot.
    A record without a start time (written by an older version) is never trusted."""
    if not record or record.get("pid") is None or record.get("start_ticks") is None:
        return False
    if record.get("boot_id") and record["boot_id"] != boot_id():
        return False
    info = process_info(int(record["pid"]))
    return (info is not None and info["state"] not in ("Z", "X")
            and info["start_ticks"] == int(record["start_ticks"]))


def recorded_session(state):
    """The supervisor's session as a state file records it, for deployment_processes."""
    state = state or {}
    if state.get("pid") is None:
        return {}
    return {"session_id": int(state["pid"]), "session_start": state.get("pid_start"),
            "session_boot": state.get("boot_id")}


def recorded_main_alive(state, members):
    """The gate's main_alive: the recorded main pid is one of the members found by membership
    and still the process that was started (start time and boot as recorded)."""
    pid = (state or {}).get("pid")
    if pid is None or not any(m["pid"] == pid for m in members):
        return False
    if state.get("pid_start") is None:  # a record from before start times were kept
        return True  # membership (its marker) already vouched for it
    return same_process({"pid": pid, "start_ticks": state.get("pid_start"),
                         "boot_id": state.get("boot_id")})


def service_uid(user):
    """The uid of the deployment's service user (a name or a number); KeyError if unknown."""
    if user is None:
        return None
    text = str(user)
    if text.isdigit():
        return int(text)
    return pwd.getpwnam(text).pw_uid


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


def marker_of(pid):
    return (environ_of(pid) or {}).get(MARKER_VAR)


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


def units_of(pid):
    """systemd unit names in the process's cgroup paths (v1 and v2)."""
    units = set()
    for line in cgroup_of(pid).splitlines():
        last = line.rstrip().rsplit("/", 1)[-1]
        if last.endswith(".service") or last.endswith(".scope"):
            units.add(last)
    return units


def trusted_session(session_id, marker, session_start=None, session_boot=None):
    """Whether a recorded session id still names the deployment's session: its leader is alive,
    leads a session, started when recorded (if recorded) on this boot, and carries the marker.
    A PID reused by an unrelated session fails the marker and start-time checks."""
    if session_id is None:
        return False
    if session_boot and session_boot != boot_id():
        return False
    leader = process_info(int(session_id))
    if leader is None or leader["state"] in ("Z", "X") or leader["sid"] != leader["pid"]:
        return False
    if session_start is not None and leader["start_ticks"] != int(session_start):
        return False
    return marker_of(leader["pid"]) == marker


def membership(marker, session_id=None, unit=None, uid=None, session_start=None,
               session_boot=None):
    """The deployment's live processes, and the 'foreign' ones: processes that carry one of
    its signals but run as another user than `uid` (never signalled; reported).

    uid None applies no user check (read-only callers that do not know the service user)."""
    skip = own_lineage()
    leader = None
    if session_id is not None and trusted_session(session_id, marker, session_start,
                                                  session_boot):
        leader = process_info(int(session_id))
    members, foreign = [], []
    for pid in all_pids():
        if pid in skip:
            continue
        info = process_info(pid)
        if info is None or info["state"] in ("Z", "X"):
            continue
        # A session member always starts after its leader: anything older is not ours.
        carries = marker_of(pid) == marker
        how = None
        if leader is not None and info["sid"] == leader["pid"] \
                and info["start_ticks"] >= leader["start_ticks"]:
            how = "session"
        elif unit and unit in units_of(pid):
            how = "unit"
        elif carries:
            how = "marker"
        if how is None:
            continue
        info.update(member_by=how, carries_marker=carries)
        if uid is not None and info["uid"] != uid:
            foreign.append(info)
        else:
            members.append(info)
    key = lambda p: p["pid"]  # noqa: E731
    return {"members": sorted(members, key=key), "foreign": sorted(foreign, key=key)}


def deployment_processes(marker, session_id=None, unit=None, uid=None, session_start=None,
                         session_boot=None):
    """Every live process of the deployment: marker in its environment, or in the
    supervisor's (verified) session, or in the systemd unit's cgroup; with `uid`, only those
    running as that user."""
    return membership(marker, session_id, unit, uid, session_start, session_boot)["members"]


def describe_foreign(foreign, user):
    return ["process %d (uid %s, %s) carries this deployment's %s but does not run as the "
            "service user %s: not signalled" % (p["pid"], p["uid"], p["cmdline"][:200],
                                                 p["member_by"], user) for p in foreign]


def signal_pids(pids, sig):
    sent = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except OSError:
            pass
    return sent


def _alive(pid, start_ticks=None):
    info = process_info(pid)
    if info is None or info["state"] in ("Z", "X"):
        return False
    return start_ticks is None or info["start_ticks"] == start_ticks


def log_size(path):
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def sigterm_only_logged(log_file, offset):
    """Whether the log, after `offset`, has SGLang's 'SIGTERM received on node_rank N' line."""
    if not log_file:
        return False
    try:
        with open(log_file, "rb") as f:
            f.seek(offset)
            text = f.read(4 << 20).decode("utf-8", "replace")
    except (OSError, IOError):
        return False
    return bool(SIGTERM_ONLY_LOGGED.search(text))


def wait_after_term(targets, timeout, node_rank=0, log_file=None, log_offset=0, poll=0.05):
    """Wait after SIGTERM until every target (pid -> start ticks) is gone or the timeout ends.

    A non-zero node rank of real SGLang only logs SIGTERM: waiting is cut short as soon as
    its log says so, and after NONZERO_RANK_TERM_GRACE seconds at most. Returns
    (pids left, why the wait was cut short or None)."""
    start = time.monotonic()
    grace = min(timeout, NONZERO_RANK_TERM_GRACE) if node_rank else timeout
    left = [p for p, s in targets.items() if _alive(p, s)]
    while left:
        elapsed = time.monotonic() - start
        if node_rank and sigterm_only_logged(log_file, log_offset):
            return left, ("node rank %d logged that it only waits for rank 0 after SIGTERM: "
                          "SIGKILL after %.1f s" % (node_rank, elapsed))
        if elapsed >= grace:
            if node_rank and grace < timeout:
                return left, ("node rank %d still running %.0f s after SIGTERM (SGLang's "
                              "non-zero ranks only log it): SIGKILL" % (node_rank, elapsed))
            return left, None
        time.sleep(poll)
        left = [p for p in left if _alive(p, targets[p])]
    return left, None


def wait_until_dead(targets, timeout, poll=0.05):
    deadline = time.monotonic() + timeout
    left = [p for p, s in targets.items() if _alive(p, s)]
    while left and time.monotonic() < deadline:
        time.sleep(poll)
        left = [p for p in left if _alive(p, targets[p])]
    return left


def terminate(processes, hung=False, term_timeout=30.0, kill_timeout=10.0, node_rank=0,
              log_file=None):
    """TERM (unless hung), wait, KILL what is left, wait. Each process is tracked by pid and
    start time, so a PID reused meanwhile is never signalled. Returns a report."""
    targets = dict((p["pid"], p["start_ticks"]) for p in processes)
    report = {"term_sent": [], "kill_sent": [], "remaining": [], "escalated": None}
    if not targets:
        return report
    pids = sorted(targets)
    if not hung:
        offset = log_size(log_file)
        report["term_sent"] = signal_pids([p for p in pids if _alive(p, targets[p])],
                                          signal.SIGTERM)
        pids, report["escalated"] = wait_after_term(targets, term_timeout, node_rank,
                                                    log_file, offset)
    pids = [p for p in pids if _alive(p, targets[p])]
    if pids:
        report["kill_sent"] = signal_pids(pids, signal.SIGKILL)
        pids = wait_until_dead(dict((p, targets[p]) for p in pids), kill_timeout)
    report["remaining"] = [process_info(p) for p in pids if process_info(p)]
    return report


CALLER = "caller"  # stop_deployment's default uid: the caller's own


def stop_deployment(marker, term_timeout, kill_timeout=10.0, skip_term=False,
                    session_id=None, unit=None, uid=CALLER, session_start=None,
                    session_boot=None, node_rank=0, log_file=None):
    """TERM every member (unless skipped), wait, then KILL what is left; report each step.

    Only processes of `uid` are signalled: by default the caller's own real uid, so a caller
    never signals another user's process unless told the service user. Members that appear
    while the stop runs (a worker forked late) are caught by a second pass."""
    if uid == CALLER:
        uid = os.getuid()
    report = {"term_sent": [], "kill_sent": [], "remaining": [], "escalated": None,
              "foreign": []}
    for _ in range(2):
        found = membership(marker, session_id, unit, uid, session_start, session_boot)
        report["foreign"] = found["foreign"]
        if not found["members"]:
            break
        step = terminate(found["members"], skip_term, term_timeout, kill_timeout, node_rank,
                         log_file)
        for key in ("term_sent", "kill_sent"):
            report[key] += step[key]
        report["escalated"] = report["escalated"] or step["escalated"]
        report["remaining"] = step["remaining"]
        if step["remaining"]:
            break
    return report
