# -*- coding: utf-8 -*-
# One observation of one deployment on its node: processes (state, CPU, I/O), the log's phase
# and progress, the port and /health, GPU memory, kernel Xid/OOM lines since the start. Every
# probe is bounded in time; the classifier turns observations into verdicts.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import threading
import time

from ..common import vocab
from ..common.files import read_json
from ..common.http import http_status, port_open
from ..gpu import gpu
from ..logs import logphase, logread
from ..process import procs, startcheck
from ..process.service import launch_errors
from . import classify, stacks

_XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)")
# The killed process's pid and name (its comm: a process title's first 15 characters).
_OOM = re.compile(r"Out of memory: Killed process (\d+)(?: \(([^)]*)\))?"
                  r"|oom-kill:.*task=([^,]*),pid=(\d+)")


def process_io(pid):
    out = {}
    try:
        with open("/proc/%d/io" % pid) as f:
            for line in f:
                key, _, value = line.partition(":")
                out[key.strip()] = int(value)
    except (OSError, IOError, ValueError):
        pass
    return out


def read_log(path, start=0):
    """(text, modification time or None, what line numbers count from) of the log from byte
    `start` (where the current run began, when the state file records it): its first
    logread.HEAD_BYTES and last logread.TAIL_BYTES at most."""
    try:
        read = logread.read_bounded(path, start=start)
    except logread.LogUnreadable:
        return "", None, "file"
    return read.text, read.mtime, "file" if not start else "this run"


class HttpProbe(threading.Thread):
    """The server's port, /health and, when /health is not 200, /ready, asked beside the GPU
    query and the kernel log: SGLang's /health generates a token and answers a second or
    more later."""

    def __init__(self, host, port, health_timeout, bootstrap_port=None):
        super(HttpProbe, self).__init__(daemon=True)
        self.host, self.port, self.health_timeout = host, port, health_timeout
        self.bootstrap_port = bootstrap_port
        self.answers = {}

    def run(self):
        # Filled as it goes: an observation that stops waiting reads what is in.
        answers = self.answers
        answers["port_open"] = port_open(self.host, self.port)
        if answers["port_open"]:
            answers["health_asked"] = time.time()
            base = "http://%s:%d" % (self.host, self.port)
            asked = time.monotonic()
            answers["health"] = http_status(base + "/health", self.health_timeout)
            # How long it took: SGLang's 503 before its warm-up ended comes at once, one from
            # a failed generation only after a second at least (module_utils/health/classify).
            answers["health_s"] = round(time.monotonic() - asked, 3)
            if answers["health"] != 200:
                # 0.5.23's status flag without a generation: tells "up but generation fails".
                answers["ready_endpoint"] = http_status(base + "/ready", 5)
            if self.bootstrap_port:
                answers["bootstrap_health"] = bootstrap_health(self.host, self.bootstrap_port)

    def result(self):
        """The answers, once the probe has them (every request it makes is bounded)."""
        self.join()
        return self.answers


# A bootstrap server answers /health at once (it only says "OK").
BOOTSTRAP_TIMEOUT_S = 5


def bootstrap_health(host, port):
    """A prefill's KV bootstrap server's own /health (CommonKVBootstrapServer, in the prefill's
    tokenizer process): the HTTP server answering says nothing about it."""
    return http_status("http://%s:%d/health" % (host, port), BOOTSTRAP_TIMEOUT_S)


def kernel_lines(source, since):
    """Kernel log lines (epoch, text) after `since`: /dev/kmsg on real nodes, or a simulated
    file of '<epoch> <message>' lines."""
    if not source or source == "none":
        return []
    if source == "kmsg":
        return _read_kmsg(since)
    out = []
    try:
        with open(source) as f:
            for line in f:
                stamp, _, text = line.partition(" ")
                try:
                    if float(stamp) >= since:
                        out.append((float(stamp), text.strip()))
                except ValueError:
                    continue
    except (OSError, IOError):
        pass
    return out


def kernel_log_error(source):
    """Why the kernel log cannot be read ('/dev/kmsg: Permission denied', a container without
    it), or None: a kill with no OOM line in an unreadable kernel log may still be the OOM
    killer's."""
    if source != "kmsg":
        return None
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except (OSError, IOError) as exc:
        return "/dev/kmsg: %s" % (exc.strerror or exc)
    return None


# The port in SGLang's (uvicorn's) bind failure, and in torch's store's.
_BIND_PORT = re.compile(r"attempting to bind on address \('[^']*', (\d+)\)|port: (\d+)")


def bind_holders(cause, member_pids):
    """For a start that failed to bind a port: the port and the processes that hold it now,
    'pid (command)' as far as /proc shows them (an empty list: none that this node check can
    see). None when the cause is not a failed bind."""
    if not cause or cause["kind"] not in ("bind_failed", "dist_store_bind_failed"):
        return None
    m = _BIND_PORT.search(cause.get("exception") or cause["message"])
    if m is None:
        return None
    port = int(m.group(1) or m.group(2))
    # Any address: the failed bind's own may be a wildcard the holder shares.
    listening, _, others = startcheck.port_holders(None, port, member_pids)
    return {"port": port, "held": listening, "holders": others}


def _bootstrap_holders(obs, members):
    """A prefill that answers while its KV bootstrap server does not: who holds that port, as
    far as /proc shows (its own processes left out)."""
    port = obs.get("bootstrap_port")
    if port and obs.get("health") == 200 and obs.get("bootstrap_health") != 200:
        _, _, others = startcheck.port_holders(None, port, set(m["pid"] for m in members))
        obs["bootstrap_holders"] = others


def _read_kmsg(since):
    try:
        with open("/proc/stat") as f:
            btime = next(int(x.split()[1]) for x in f if x.startswith("btime"))
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, IOError, StopIteration):
        return []
    out = []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break
            except OSError:  # EPIPE when records were overwritten: keep reading
                continue
            head, _, text = record.partition(";")
            fields = head.split(",")
            if len(fields) >= 3:
                stamp = btime + int(fields[2]) / 1e6
                if stamp >= since:
                    out.append((stamp, text.strip()))
    finally:
        os.close(fd)
    return out


def xids_and_ooms(lines, member_pids):
    xids, ooms = [], []
    for stamp, text in lines:
        m = _XID.search(text)
        if m:
            code = int(m.group(2))
            xids.append({"code": code, "device": m.group(1), "at": stamp, "line": text,
                         "action": vocab.XID_ACTIONS.get(code, "see NVIDIA's Xid catalog")})
        m = _OOM.search(text)
        if m:
            ooms.append({"at": stamp, "line": text, "pid": int(m.group(1) or m.group(4)),
                         "name": m.group(2) or m.group(3)})
    return xids, ooms


def exit_status(state_file, manager, unit):
    """The server's exit status, as a shell reports it (128 + N when killed by signal N), under
    either manager."""
    if manager == "systemd" and unit:
        import subprocess
        try:
            out = subprocess.run(["systemctl", "show", "-p", "ExecMainCode,ExecMainStatus",
                                  unit], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 timeout=10).stdout.decode()
            props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
            status = int(props.get("ExecMainStatus") or 0)
            # ExecMainCode is the waitid() code: 1 exited, 2 killed, 3 dumped core.
            return 128 + status if props.get("ExecMainCode") in ("2", "3") else status
        except (OSError, ValueError, subprocess.SubprocessError):
            return None
    try:
        with open(state_file + ".exit") as f:
            return int(f.read().strip())
    except (OSError, IOError, ValueError):
        return None


FATAL_EXIT_GRACE_S = 5.0


def _members(p, state, session, unit):
    """The deployment's processes with their I/O counters, and whether the main one lives."""
    members = procs.deployment_processes(p["marker"], unit=unit, **session)
    for member in members:
        io = process_io(member["pid"])
        member.update(rchar=io.get("rchar", 0), read_bytes=io.get("read_bytes", 0),
                      syscw=io.get("syscw", 0))
    if p["manager"] == "systemd":
        return bool(members), members
    # Identity, not numbers: a recorded pid now held by an unrelated process is dead.
    return procs.recorded_main_alive(state, members), members


def _wait_for_exit(p, state, session, unit):
    deadline = time.time() + FATAL_EXIT_GRACE_S
    while True:
        main_alive, members = _members(p, state, session, unit)
        if not main_alive or time.time() >= deadline:
            return main_alive, members
        time.sleep(0.2)


def _read_run(p, state):
    """The current run's log, parsed, and its file's modification time."""
    text, mtime, lines_from = read_log(p["log_file"], start=state.get("log_offset") or 0)
    log = logphase.parse_log(text, cuda_graph=p.get("cuda_graph", True), now=mtime,
                             lines_from=lines_from)
    return log, mtime


def _recorded_stop(state):
    """The stop the state file records for the last start (stop.yml, a recovery), or None."""
    stopped, started = state.get("stopped_at"), state.get("started_at")
    if stopped is None or state.get("pid") is not None or (started and stopped < started):
        return None
    return {"at": stopped, "by": state.get("stopped_by")}


def _main_python(members):
    """The launcher's Python (its command line's first word), where SGLang's venv keeps
    py-spy."""
    for member in members:
        first = (member.get("cmdline") or "").split(" ", 1)[0]
        if "python" in os.path.basename(first):
            return first
    return ""


class StackSampler(object):
    """Each rank's stack, sampled with py-spy when due, in rounds: one at the end of the
    observation, and one each sampling interval while /health keeps the observation waiting
    (a deadlocked server's /health takes its whole timeout, 25 s: the samples keep their
    pace). `stack_state`: the gate state's record of when each rank was last sampled, and
    whether sampling is known to be off. Leaves `stacks` (the rounds, each {"at": wall time,
    "samples": {label: sample}}), `stacks_cost` and, when it cannot sample, `stacks_error`
    in the observation."""

    def __init__(self, p, obs, stack_state):
        stack_state = stack_state or {}
        self.obs, self.sampled = obs, dict(stack_state.get("sampled") or {})
        self.interval = float(p.get("stack_interval") or stacks.SAMPLE_INTERVAL_S)
        self.window = float(p.get("stack_window") or stacks.STACK_WINDOW_S)
        self.history = stack_state.get("history") or {}
        self.last_progress = stack_state.get("last_progress")
        self.stack_state = stack_state
        self.py_spy = None
        if not p.get("stack_sampling", True):
            obs["stacks_error"] = stacks.TURNED_OFF
            return
        if not obs["main_alive"] or stack_state.get("off") not in (None, stacks.TURNED_OFF):
            return
        self.py_spy = stacks.find_py_spy(p.get("py_spy") or "", _main_python(obs["processes"]))
        if self.py_spy is None:
            obs["stacks_error"] = ("py-spy was not found beside the server's Python or on "
                                   "PATH (sglang_server_pip_extra_packages installs it)")

    def take(self):
        """One round of the ranks that are due."""
        if self.py_spy is None:
            return
        now = time.time()
        try:
            samples, cost = stacks.sample_ranks(self.py_spy, self.obs["processes"],
                                                self.sampled, now, interval=self.interval,
                                                secrets_of=procs.secret_values)
        except stacks.SamplingUnavailable as exc:
            self.obs["stacks_error"], self.py_spy = str(exc), None
            return
        self.sampled.update((label, now) for label in samples)
        if samples:
            self.obs.setdefault("stacks", []).append({"at": now, "samples": samples})
        total = self.obs.setdefault("stacks_cost", {"samples": 0, "cpu_s": 0.0, "wall_s": 0.0})
        for key in total:
            total[key] = round(total[key] + cost[key], 4)

    def during(self, thread):
        """Rounds each interval while `thread` (the HTTP probe) runs. True when the stacks
        have decided meanwhile (no progress for the stack window, every rank on the same
        frames since): waiting on for /health would only delay the verdict."""
        while self.py_spy is not None and thread.is_alive():
            thread.join(self.interval)
            if thread.is_alive():
                self.take()
                if self.settled():
                    return True
        return False

    def settled(self):
        if self.last_progress is None or time.time() - self.last_progress < self.window:
            return False
        if classify.progressed(self.stack_state, self.obs):
            return False  # this observation saw progress: the classifier's to judge
        history = self.history
        for taken in self.obs.get("stacks") or []:
            history = stacks.merge(history, taken["samples"], taken["at"], taken["at"])
        pids = set(m["pid"] for m in self.obs["processes"])
        labels = [label for label, kept in history.items() if kept[-1]["pid"] in pids]
        return stacks.frozen(history, labels, self.last_progress, clock="wall")


def observe(p, health_answered=False, stack_state=None):
    """One observation; `p` holds the module's parameters. `health_answered`: /health answered
    200 just before it (the gate's wait between observations), so it is not asked again: a
    200 older than the processes and the log read here cannot hide a crash they show.
    `stack_state`: what the gate state holds of the stack sampling (StackSampler)."""
    state = read_json(p["state_file"]) or {}
    # A recorded session counts only while its leader is the process recorded at start.
    session = procs.recorded_session(state) if p["manager"] == "supervisor" else {}
    unit = p.get("unit_name") if p["manager"] == "systemd" else None
    read_at = time.time()  # what moved in the processes and the log had moved by now
    main_alive, members = _members(p, state, session, unit)
    log, mtime = _read_run(p, state)
    started_at = state.get("started_at")
    if main_alive and logphase.fatal_failures(log):
        # SGLang tears its process tree down right after a fatal line: a moment's wait lets
        # the verdict carry the exit status (with dp_size > 1 it may never come).
        main_alive, members = _wait_for_exit(p, state, session, unit)
        log, mtime = _read_run(p, state)
    wall = time.time()
    current_boot = procs.boot_id()
    obs = {
        "run_id": started_at,
        "started": started_at is not None,
        "started_at": started_at,
        "processes": members,
        "main_alive": main_alive,
        "log": log,
        # Ages on the node's own clock (a file's mtime against the time now), for an
        # observer without history; the log's printed stamps are never used for time.
        "log_age_s": wall - mtime if mtime else None,
        "run_age_s": wall - started_at if started_at else None,
        "wall_now": wall,
        "read_at": read_at,
        "boot_id": current_boot,
        "boot_changed": bool(not main_alive and state.get("boot_id") and current_boot
                             and state["boot_id"] != current_boot),
        "stopped": None if main_alive else _recorded_stop(state),
        "serves_http": p["serves_http"],
        "exit_status": None if main_alive else exit_status(p["state_file"], p["manager"], unit),
        "launch_errors": launch_errors(p["state_file"]) if p["manager"] == "supervisor"
        else [],
    }
    # Asked after the log was read, never before: an answer older than the log could pair a
    # 503 from a server still starting with a log that says it is serving.
    probe = None
    sampler = StackSampler(p, obs, stack_state)
    bootstrap_port = p.get("bootstrap_port") if p["serves_http"] else None
    obs["bootstrap_port"] = bootstrap_port
    if p["serves_http"] and main_alive and health_answered:
        obs.update(port_open=True, health=200)
        if bootstrap_port:
            obs["bootstrap_health"] = bootstrap_health(p["host"], bootstrap_port)
    elif p["serves_http"] and main_alive:
        probe = HttpProbe(p["host"], p["port"], p["health_timeout"], bootstrap_port)
        probe.start()
    try:
        devices = gpu.gpu_snapshot(p["gpu_backend"], p.get("sim_dir"), p["gpu_timeout"])
        pids = set(m["pid"] for m in members)
        obs["gpu_memory_used"] = sum(proc["used_memory"] for d in devices
                                     for proc in d["processes"] if proc["pid"] in pids)
        obs["gpus"] = [{"index": d["index"], "memory_used": d["memory_used"],
                        "processes": d["processes"]} for d in devices]
    except (gpu.GpuQueryTimeout, gpu.GpuUnavailable) as exc:
        obs["gpu_error"] = str(exc)
    if started_at:
        xids, ooms = xids_and_ooms(kernel_lines(p["kernel_log"], started_at),
                                   set(m["pid"] for m in members))
        obs["xids"], obs["oom_kills"] = xids, ooms
        obs["kernel_log_error"] = kernel_log_error(p["kernel_log"])
    holders = bind_holders(log.get("cause"), set(m["pid"] for m in members))
    if holders is not None:
        obs["port_holders"] = holders
    if probe is not None:
        if sampler.during(probe):
            # The stacks decided while /health kept the observation waiting: what the probe
            # has so far, and how long /health has not answered.
            obs.update(dict(probe.answers), health_unanswered_s=round(
                time.time() - probe.answers.get("health_asked", time.time()), 1))
        else:
            obs.update(probe.result())
    _bootstrap_holders(obs, members)
    if obs.get("health") == 200 and main_alive and logphase.fatal_failures(log):
        # The log reads as a failure while /health answers: ask again, generating a token,
        # before anything is judged crashed on a line of text.
        obs["health_generate"] = http_status(
            "http://%s:%d/health_generate" % (p["host"], p["port"]), p["health_timeout"])
    sampler.take()
    obs["observed_at"] = time.time()
    return obs
