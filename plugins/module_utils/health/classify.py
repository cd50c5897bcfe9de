# -*- coding: utf-8 -*-
# The verdict classifier: a pure function of the previous gate state and one observation.
# It judges progress, not elapsed time: a phase is progressing while any of its progress
# signals moves, stalled when none moved for the phase's window, and each phase has a ceiling.
# Time is the node's monotonic clock (`now`): when the observer saw a signal move, never the
# timestamps printed in the log, which a server's TZ or a clock step can shift by hours.
# A fatal failure line in the current run (the log grammar says which kinds are fatal) is
# `crashed` at once, even while processes live: with dp_size > 1 the main process outlives a
# dead scheduler, and waiting out a stall window would only hide the cause. So is the kernel's
# OOM killer taking one of the run's processes: a SIGKILLed scheduler prints nothing. A server
# that answers /health and /health_generate with 200 is not judged crashed on a line of its
# log alone: the verdict says that the two disagree.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ..common import vocab
from ..logs import failures as failures_grammar
from ..logs import logphase
from . import stacks

# Bytes read per poll that count as loading progress. A busy-waiting process reads a few bytes
# a second from its event pipe; weight loading reads gigabytes.
READ_PROGRESS_BYTES = 1 << 20
GPU_MEMORY_PROGRESS_BYTES = 64 << 20
# Signals that only another process (or the kernel's OOM killer) sends a scheduler: a process
# that fails by itself ends with SIGSEGV, SIGABRT or SIGBUS, or with an exit code.
OUTSIDE_SIGNALS = (9, 15)
SIGNALS = {9: "SIGKILL", 15: "SIGTERM", 6: "SIGABRT", 11: "SIGSEGV", 2: "SIGINT", 3: "SIGQUIT",
           7: "SIGBUS"}


def _signals(obs):
    """The progress signals of one observation, as comparable numbers."""
    log = obs["log"]
    members = obs["processes"]
    return {
        "phase_index": vocab.PHASES.index(log["phase"]),
        # SGLang's own "Health check failed" lines and the prefills of /health's requests
        # answer the gate's probes: not progress.
        "log_lines": log["meaningful_lines"] - log.get("probe_prefills", 0) - sum(
            f.get("count", 1) for f in log["failures"] if f["kind"] == "health_check_failed"),
        "shards_done": (log["shards"] or [0, 0])[0],
        "capture_done": (log["capture"] or [0, 0])[0],
        "progress_ticks": log.get("progress_ticks", 0),
        "bytes_read": sum(p.get("rchar", 0) for p in members),
        "cpu_ticks": sum(p.get("utime_ticks", 0) + p.get("stime_ticks", 0) for p in members),
        "write_calls": sum(p.get("syscw", 0) for p in members),
        "gpu_memory": obs.get("gpu_memory_used", 0),
        "members": len(members),
        "port_open": 1 if obs.get("port_open") else 0,
        # A JIT's compiler running under a rank (nvcc, ninja, ptxas) is work being done.
        "compilers": sum(1 for p in members if stacks.is_compiler(p.get("cmdline"))),
    }


def _moved(prev, now):
    """Which progress signals advanced since the previous observation."""
    moved = []
    for key in ("phase_index", "log_lines", "shards_done", "capture_done", "progress_ticks",
                "members", "port_open"):
        if now[key] > prev.get(key, 0):
            moved.append(key)
    if now["bytes_read"] - prev.get("bytes_read", 0) >= READ_PROGRESS_BYTES:
        moved.append("bytes_read")
    if abs(now["gpu_memory"] - prev.get("gpu_memory", 0)) >= GPU_MEMORY_PROGRESS_BYTES:
        moved.append("gpu_memory")
    if now.get("compilers"):
        moved.append("compilers")
    return moved


def _busy_wait(prev, now, elapsed):
    """The incident's signature: CPU climbing, a trickle of writes, nothing else moving."""
    if elapsed <= 0 or not prev:
        return None
    cpu = now["cpu_ticks"] - prev.get("cpu_ticks", 0)
    writes = now["write_calls"] - prev.get("write_calls", 0)
    if cpu > 0 and 0 < writes / elapsed <= 20:
        return ("alive and spinning (+%d CPU ticks in %.0f s), %d small writes (%.1f/s), "
                "no log, shard, capture, read or GPU-memory progress" %
                (cpu, elapsed, writes, writes / elapsed))
    return None


def _oom_killed_members(obs, member_pids, lost_one=False):
    """The kernel's OOM kills of processes this run had: the killed one is gone by the time
    the kill is read, so the run's earlier members are remembered in the gate state.
    `lost_one`: the server lost a process without an error of its own (it exited, or SGLang
    says a child died). A kill since its start of an SGLang-titled process the gate never saw
    (killed before its first look) is then taken as its own, and said to be unseen."""
    known = set(member_pids)
    out = []
    for kill in obs.get("oom_kills") or []:
        seen = kill.get("pid") in known
        if not seen and not (lost_one and _sglang_titled(kill.get("name"))):
            continue
        out.append({"kind": "killed", "fatal": True, "line": kill["line"],
                    "message": kill["line"], "at": kill["at"], "oom_kill": True,
                    "pid": kill.get("pid"), "seen": seen})
    return out


def _sglang_titled(name):
    # SGLang titles its processes sglang::...; the kernel names a process by its comm.
    return bool(name) and name.startswith("sglang::")


def _xid_fault(xids):
    worst = None
    for xid in xids:
        if xid["code"] in vocab.APPLICATION_XIDS and worst is not None:
            continue
        worst = xid
    return worst


def _stamp(epoch):
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(epoch))


def classify(prev_state, obs, now, windows, ceilings, stack_window=stacks.STACK_WINDOW_S):
    """Return (verdict dict, new state). `prev_state` is None on the first observation; `now`
    is the node's monotonic clock (time.monotonic()).

    Besides the verdict, its phase and reason, the dict says how the current phase stands
    against its limits, in seconds measured on the node (so a reader on another clock can
    count down from them): `window_s` and `ceiling_s` of the phase, `quiet_s` since the last
    progress, `phase_s` in the phase, and for `progressing` `stalls_in_s` (time left before
    it would be judged stalled) with `stalls_by` ("window" or "ceiling", whichever is
    nearer). `headline` is the verdict in one line of words. A failed verdict says its
    `cause` (configuration, environment, external, hardware, or None when unknown), the
    `failure` it rests on and `advice`: what to do next. `stack_window`: how long the ranks'
    stacks must stay on the same frames with no progress before that alone is `stalled`."""
    verdict, state = _judge(prev_state, obs, now, windows, ceilings, stack_window)
    verdict.pop("stack_hang", None)  # shown as evidence["stacks"] when it decided
    phase = verdict["phase"]
    window, ceiling = windows.get(phase, 300), ceilings.get(phase, 3600)
    quiet = max(0.0, now - verdict["last_progress_at"])
    in_phase = max(0.0, now - verdict["since"])
    # Epoch seconds for readers on other machines, counted back from this observation.
    wall = obs.get("wall_now", now)
    verdict.update(window_s=window, ceiling_s=ceiling, quiet_s=round(quiet, 1),
                   phase_s=round(in_phase, 1), since=wall - in_phase,
                   last_progress_at=wall - quiet)
    if verdict["verdict"] == vocab.PROGRESSING:
        by_window, by_ceiling = window - quiet, ceiling - in_phase
        verdict.update(stalls_in_s=round(max(0.0, min(by_window, by_ceiling)), 1),
                       stalls_by="window" if by_window <= by_ceiling else "ceiling")
        verdict["reason"] = progressing_reason(logphase.progress_text(obs["log"]), verdict)
    verdict["headline"] = "%s: %s" % (vocab.verdict_phrase(verdict["verdict"], phase),
                                      verdict["reason"])
    return verdict, state


def progressing_reason(progress, verdict, later=0.0):
    """'loading_weights 27/64 shards, last progress 3 s ago; 297 s left in its 300 s window'
    for a progressing verdict, as it stands `later` seconds after it was judged (a display
    counting down between observations)."""
    quiet = verdict.get("quiet_s", 0.0) + later
    left = max(0.0, verdict.get("stalls_in_s", 0.0) - later)
    # Limits in seconds, as sglang_server_gate_stall_windows and _ceilings set them.
    if verdict.get("stalls_by") == "ceiling":
        limit = "%s left before its %d s ceiling" % (vocab.duration_text(left),
                                                     verdict["ceiling_s"])
    else:
        limit = "%s left in its %d s window" % (vocab.duration_text(left), verdict["window_s"])
    return "%s, last progress %s ago; %s" % (progress, vocab.duration_text(quiet), limit)


def _first_sight(obs, now):
    """When the server last did something, for an observer without history: the log file's
    last change, as the node's clock measures its age, else the start's age, else now."""
    for key in ("log_age_s", "run_age_s"):
        age = obs.get(key)
        if age is not None:
            return now - max(0.0, float(age))
    return now


def _observing_s(obs):
    """How long the observation ran after it read the processes and the log."""
    if obs.get("observed_at") and obs.get("read_at"):
        return max(0.0, obs["observed_at"] - obs["read_at"])
    return 0.0


def _history(prev_state, obs):
    """The previous observation's state when it belongs to this run on this boot."""
    prev_state = prev_state or {}
    if prev_state.get("run_id") != obs.get("run_id"):
        return {}  # a new start: history of the previous run does not apply
    if prev_state.get("clock") != "monotonic" or prev_state.get("boot_id") != obs.get("boot_id"):
        return {}  # another clock (an older state file, or a reboot restarted it)
    return prev_state


def stack_state(state):
    """What observe() needs of the gate state to sample stacks: when each rank was last
    sampled, and whether sampling is known to be off on this node."""
    state = state or {}
    return {"sampled": state.get("stacks_sampled") or {}, "off": state.get("stacks_off"),
            "history": state.get("stacks") or {}, "last_progress": state.get("last_progress_wall"),
            "signals": state.get("signals")}


def progressed(stack_state_, obs):
    """Which progress signals moved between the gate state and an observation (possibly
    still without the port's answers): the node's StackSampler asks before it stops
    waiting on /health."""
    prev = (stack_state_ or {}).get("signals")
    return _moved(prev, _signals(obs)) if prev else ["no previous observation"]


def _stacks(prev_state, obs, now, last_progress, state, stack_window):
    """Keep each rank's last samples in the state; return the hang the stacks show (every
    rank on the same frames over the last samples since the last progress, and no progress
    for `stack_window`), or None. Sampling that is off is said once, in `stack_sampling`."""
    sampled = dict(prev_state.get("stacks_sampled") or {})
    history = prev_state.get("stacks")
    for taken in obs.get("stacks") or []:
        # On this clock: as long before `now` as the round was before the observation's end.
        at = now - max(0.0, obs.get("observed_at", taken["at"]) - taken["at"])
        history = stacks.merge(history, taken["samples"], at, taken["at"])
        sampled.update((label, taken["at"]) for label in taken["samples"])
    history = history or {}
    pids = set(p["pid"] for p in obs["processes"])
    history = dict((label, kept) for label, kept in history.items() if kept[-1]["pid"] in pids)
    off = prev_state.get("stacks_off")
    if off == stacks.TURNED_OFF and obs.get("stacks_error") != stacks.TURNED_OFF:
        off = None  # turned on again: sampling starts over
    off = off or obs.get("stacks_error")
    # The last progress on the wall clock, for the node's next observation (StackSampler).
    wall = obs.get("observed_at") or obs.get("wall_now")
    state.update(stacks=history, stacks_sampled=sampled, stacks_off=off,
                 last_progress_wall=wall - (now - last_progress) if wall else None)
    if off:
        return {"off": off, "said": prev_state.get("stacks_off") == off}
    if now - last_progress < stack_window or not stacks.frozen(history, list(history),
                                                              last_progress):
        return None
    if obs["log"].get("rendezvous"):
        return None  # a multi-node group waits for its other nodes: the window judges that
    hang = stacks.read_signature(history, list(history))
    # Frames that no signature names (a model's own code, torch.compile's workers) may be a
    # slow step of their own: the window judges them.
    return hang if hang["signature"] else None


def _judge(prev_state, obs, now, windows, ceilings, stack_window=stacks.STACK_WINDOW_S):
    prev_state = _history(prev_state, obs)
    log = obs["log"]
    phase = log["phase"]
    signals = _signals(obs)
    prev_signals = prev_state.get("signals") or {}
    moved = _moved(prev_signals, signals) if prev_signals else []
    last_progress = prev_state.get("last_progress_at")
    if last_progress is None:
        last_progress = _first_sight(obs, now)
    if moved:
        # Seen when the processes and the log were read, at the observation's start: a
        # /health probe after it can take 25 s.
        last_progress = now - _observing_s(obs)
    phase_since = prev_state.get("phase_since") if prev_state.get("phase") == phase else None
    if phase_since is None:
        phase_since = now if prev_state else last_progress
    # Signals as they stood at the last progress: the busy-wait signature is judged over the
    # whole quiet span, not between two polls a second apart.
    quiet_signals = signals if (moved or not prev_state) else (
        prev_state.get("quiet_signals") or prev_signals)
    member_pids = sorted(set(prev_state.get("member_pids") or ()) |
                         set(p["pid"] for p in obs["processes"]))
    state = {"run_id": obs.get("run_id"), "clock": "monotonic", "boot_id": obs.get("boot_id"),
             "signals": signals, "last_progress_at": last_progress,
             "member_pids": member_pids, "phase": phase, "phase_since": phase_since,
             "observed_at": now, "quiet_signals": quiet_signals,
             "quiet_since": now if moved or not prev_state
             else prev_state.get("quiet_since", now)}
    verdict = {"phase": phase, "progress": log.get("progress"), "since": phase_since,
               "last_progress_at": last_progress, "moved": moved, "evidence": {}}
    hang = _stacks(prev_state, obs, now, last_progress, state, stack_window)
    sampling_off = None
    if hang and hang.get("off"):
        sampling_off = ("stack sampling is off: %s; hangs are judged by the phases' windows "
                        "alone" % hang["off"])
        if not hang["said"]:
            verdict["stack_sampling"] = sampling_off
        hang = None
    verdict["stack_hang"] = hang
    judged = (_absent(verdict, obs) or _stopped(verdict, obs) or _xid(verdict, obs) or
              _exited(verdict, obs, member_pids) or
              _fatal_while_alive(verdict, obs, member_pids) or
              _answering(verdict, obs))
    if not judged:
        _stalled_or_progressing(verdict, obs, now, windows, ceilings,
                                (quiet_signals, signals, now - state["quiet_since"]))
    elif verdict["verdict"] == vocab.READY and obs.get("bootstrap_port") and \
            obs.get("bootstrap_health") != 200:
        # A prefill answers only with its KV bootstrap server (whose failed bind SGLang logs
        # with a traceback, read above as a failure the answers outweigh).
        _bootstrap_down(verdict, obs)
    if sampling_off and verdict["verdict"] in (vocab.STALLED, vocab.UNHEALTHY):
        verdict["evidence"]["stack_sampling"] = sampling_off  # why no stacks decided it
    kv = log.get("kv_transfer")
    state["kv_last"] = kv["last_line"] if kv else None
    if kv and verdict["verdict"] == vocab.READY and kv["last_line"] != prev_state.get("kv_last"):
        _kv_transfer_failed(verdict, kv, bool(prev_state))
    return verdict, state


def _absent(verdict, obs):
    if obs.get("started") or obs["processes"]:
        return False
    verdict.update(verdict=vocab.ABSENT, cause=None, reason="no record of this deployment "
                   "starting and none of its processes is running")
    return True


def _stopped(verdict, obs):
    """Stopped on purpose: the state file records a stop (stop.yml, a recovery), or the log
    ends in SGLang's own answer to a SIGTERM with no failure before it."""
    if obs["main_alive"]:
        return False
    recorded, log = obs.get("stopped"), obs["log"]
    if recorded:
        reason = "stopped by %s at %s" % (recorded.get("by") or "sglang-fleet",
                                          _stamp(recorded["at"]))
    elif log.get("stop") and not _fatal_before(log, log["stop"]):
        stop = log["stop"]
        reason = ("stopped by a SIGTERM from outside sglang-fleet (%s: %s); the toolkit "
                  "recorded no stop" % (failures_grammar.where(
                      dict(stop, lines_from="file")), stop["line"]))
    else:
        return False
    verdict.update(verdict=vocab.STOPPED, cause=None, reason=reason,
                   stopped_by=(recorded or {}).get("by") or "SIGTERM",
                   stopped_at=(recorded or {}).get("at") or log["stop"].get("at"),
                   exit_status=obs.get("exit_status"))
    verdict["evidence"].update(last_lines=log["last_lines"])
    return True


def _fatal_before(log, stop):
    cause = log.get("cause")
    return bool(cause and cause.get("line_no") is not None and stop.get("line_no") is not None
                and cause["line_no"] < stop["line_no"])


def _xid(verdict, obs):
    xid = _xid_fault(obs.get("xids") or [])
    if xid is None:
        return False
    verdict.update(verdict=vocab.GPU_FAULT, cause=vocab.HARDWARE, reason="Xid %d in the "
                   "kernel log on %s: %s" % (xid["code"], xid.get("device") or "a GPU",
                                             xid["action"]), xid=xid,
                   advice="NVIDIA's action for Xid %d: %s" % (xid["code"], xid["action"]))
    verdict["evidence"]["kernel"] = [x["line"] for x in obs["xids"]]
    return True


def _signal_name(status):
    if status is None or status <= 128:
        return None
    number = status - 128
    return SIGNALS.get(number, "signal %d" % number)


def _failure_of(obs, member_pids):
    """(failure dict or None, cause) of a failed run: the log's cause, the kernel's OOM
    kill of one of its processes, a reboot, a signal from outside, a full disk."""
    found = obs["log"].get("cause")
    lost_one = not obs["main_alive"] or (
        found is not None and found["kind"] in failures_grammar.CONSEQUENCE_KINDS)
    oom = _oom_killed_members(obs, member_pids, lost_one)
    # SGLang's own words after the kill (a scheduler is dead, the tree killed) are its
    # consequences: the OOM killer is the cause.
    if oom and (found is None or found["kind"] in failures_grammar.CONSEQUENCE_KINDS):
        kill = oom[0]
        return dict(kill, said="the kernel's OOM killer killed pid %s%s (host memory): %s"
                    % (kill["pid"], "" if kill["seen"] else
                       ", an SGLang process killed after this start that the gate never saw",
                       kill["line"]),
                    hint="the node ran out of host memory: free it, or lower what the server "
                         "holds in host memory (--cpu-offload-gb, --hicache-size)"), \
            vocab.ENVIRONMENT
    if obs.get("boot_changed"):
        return found, vocab.ENVIRONMENT
    if found is not None:
        if found["kind"] in failures_grammar.ENVIRONMENT_KINDS:
            return _with_port_holders(found, obs.get("port_holders")), vocab.ENVIRONMENT
        if found["kind"] in failures_grammar.GPU_FAULT_KINDS:
            return found, vocab.HARDWARE
        if failures_grammar.exit_signal(found) in OUTSIDE_SIGNALS:
            # SGLang says a scheduler was killed (exit code -9) and nothing of its own came
            # before: with no OOM kill in the kernel log, the kill came from outside.
            return found, vocab.EXTERNAL
        if found["kind"] != "killed" or found.get("after_sglang_failure"):
            return found, vocab.CONFIGURATION
    if any("No space left on device" in e for e in obs.get("launch_errors") or ()):
        return found, vocab.ENVIRONMENT
    if _signal_name(obs.get("exit_status")) or (found and found["kind"] == "killed"):
        return found, vocab.EXTERNAL
    return found, None


def _with_port_holders(failure, holders):
    """A failed bind said with the program that holds the port, as the node saw it."""
    if not holders:
        return failure
    port = holders["port"]
    if holders["holders"]:
        who = "port %d is held by %s" % (port, ", ".join(holders["holders"]))
    elif holders["held"]:
        who = ("port %d is held by a process this node check cannot see (another user's or "
               "another namespace's)" % port)
    else:
        who = "nothing holds port %d now: the program that held it has let it go" % port
    said = failure.get("said") or failures_grammar.said(failure)
    return dict(failure, said="%s; %s" % (said, who), holders=holders["holders"],
                hint="stop the program that holds port %d, or give the server a free port "
                     "(sglang_server_port; sglang_server_dist_init_port for the store's); the "
                     "configuration is not at fault" % port)


def _external_reason(obs, failure=None):
    """Why a kill is taken to have come from outside SGLang: what the log and the kernel log
    show, and that an OOM kill cannot be ruled out when the kernel log could not be read."""
    number = failures_grammar.exit_signal(failure)
    if number is not None:
        what = ("a scheduler was killed by %s from outside SGLang in %s (SGLang: %s), with no "
                "error of its own before it" % (SIGNALS.get(number, "signal %d" % number),
                                                obs["log"]["phase"],
                                                failure.get("exception") or failure["message"]))
    else:
        what = ("killed by %s from outside SGLang: the log has no fatal line from SGLang"
                % (_signal_name(obs.get("exit_status")) or "SIGKILL"))
    unread = obs.get("kernel_log_error")
    if unread:
        return ("%s; the kernel log could not be read (%s), so a kill by the kernel's OOM "
                "killer cannot be told from one by another process" % (what, unread))
    return "%s%s the kernel log no OOM kill of its processes" % (
        what, " and" if number is None else ", and in")


def _exited(verdict, obs, member_pids):
    if obs["main_alive"]:
        return False
    status, log, phase = obs.get("exit_status"), obs["log"], verdict["phase"]
    failure, cause = _failure_of(obs, member_pids)
    exit_text = ("the server exited (status %s%s)" % (
        status, ", %s" % _signal_name(status) if _signal_name(status) else "")
        if status is not None else "the server exited (no exit status recorded)")
    if obs.get("boot_changed"):
        what = "the node rebooted since the server started (its boot id changed)"
    elif cause == vocab.EXTERNAL and (failure is None or failure["kind"] == "killed"
                                      or failures_grammar.exit_signal(failure)):
        what = _external_reason(obs, failure)
    elif failure is not None:
        what = failure.get("said") or failure["line"]
    elif obs.get("launch_errors"):
        what = obs["launch_errors"][-1]
    else:
        what = "the log has no fatal line from SGLang"
    verdict.update(verdict=vocab.GPU_FAULT if cause == vocab.HARDWARE else vocab.CRASHED,
                   exit_status=status, cause=cause, failure=_failure_view(failure),
                   reason="%s; %s" % (what, exit_text),
                   advice=_advice(failure, cause, phase))
    verdict["evidence"].update(failures=log["failures"], error_lines=log["error_lines"],
                               last_lines=log["last_lines"],
                               kernel_oom=obs.get("oom_kills") or [],
                               leftover_processes=len(obs["processes"]))
    return True


def _failure_view(failure):
    if failure is None:
        return None
    keep = ("kind", "said", "hint", "ranks", "line_no", "lines_from", "exception", "line", "at",
            "holders")
    return dict((k, failure.get(k)) for k in keep if k in failure)


def _advice(failure, cause, phase):
    if cause == vocab.ENVIRONMENT:
        base = "a fault of the node, not of the configuration: fix the node"
    elif cause == vocab.EXTERNAL:
        base = "a signal from outside SGLang, not the configuration: find who sent it"
    elif cause == vocab.HARDWARE:
        base = "a fault of the GPU, not of the configuration"
    else:
        base = None
    hint = (failure or {}).get("hint") or (failures_grammar.hint(failure, phase)
                                           if failure else None)
    return "; ".join(x for x in (hint, base) if x) or None


def _fatal_while_alive(verdict, obs, member_pids):
    log = obs["log"]
    fatal = [f for f in log["failures"] if f["fatal"]] + _oom_killed_members(obs, member_pids)
    if not fatal:
        return False
    failure, cause = _failure_of(obs, member_pids)
    failure = failure or fatal[0]
    where = failure.get("said") or failure["line"]
    if obs.get("health") == 200 and obs.get("health_generate") == 200:
        # The log says the server failed, the server answers: a line of text alone does not
        # get a server that generates killed.
        verdict.update(verdict=vocab.READY, cause=None,
                       reason="/health and /health_generate answered 200, though the log "
                              "reads as %s: %s. Judged by the answers; look at the log"
                              % (failure["kind"], where))
        verdict["evidence"].update(log_disagrees=_failure_view(failure),
                                   last_lines=log["last_lines"])
        return True
    verdict.update(verdict=vocab.GPU_FAULT if cause == vocab.HARDWARE else vocab.CRASHED,
                   exit_status=None, cause=cause, failure=_failure_view(failure),
                   reason="%s; %d of its processes are still running"
                          % (where, len(obs["processes"])),
                   advice=_advice(failure, cause, verdict["phase"]))
    verdict["evidence"].update(fatal_line=failure["line"], failures=fatal[:10],
                               error_lines=log["error_lines"], last_lines=log["last_lines"],
                               processes_alive=len(obs["processes"]),
                               health=obs.get("health"),
                               health_generate=obs.get("health_generate"))
    return True


# SGLang 0.5.23's health_generate sleeps a second before it first looks for the generated
# token, so a 503 in less time came from its early returns: the server is not Up yet (its
# warm-up has not ended) or is shutting down. Below this many seconds a 503 is one of those.
STARTING_503_S = 0.9


def _still_starting(obs):
    """/health's 503 came at once: SGLang has not set the server Up, though the log shows it
    serving (a router that never took it out sends requests before its warm-up ends). Left to
    the phase's window, not judged unhealthy; a 503 whose time is unknown is judged."""
    elapsed = obs.get("health_s")
    return obs.get("health") == 503 and elapsed is not None and elapsed < STARTING_503_S


def _answering(verdict, obs):
    health, phase, log = obs.get("health"), verdict["phase"], obs["log"]
    # /health answers 200 only once warm-up succeeded: from warming_up on (the ready line may
    # not be written yet, or have left the log tail of a long-running server) that is ready.
    if health == 200 and (phase in ("warming_up", "serving")
                          or not obs.get("serves_http", True)):
        verdict.update(verdict=vocab.READY, cause=None, reason="/health answered 200")
        return True
    if not obs.get("serves_http", True) and phase in ("starting_http", "warming_up", "serving"):
        verdict.update(verdict=vocab.READY, cause=None, reason="workers of a non-zero node "
                       "rank finished start-up; rank 0 serves HTTP")
        return True
    if phase == "serving" and not _still_starting(obs):
        if obs.get("health_unanswered_s") is not None:
            reason = "serving, but /health has not answered in %.0f s" % obs[
                "health_unanswered_s"]
        else:
            reason = "serving, but /health %s" % ("timed out" if health is None
                                                  else "answered %s" % health)
        hang = verdict.get("stack_hang")
        if hang and hang["signature"]:
            # A deadlock, not a slow generation: the stacks name where it waits.
            verdict.update(verdict=vocab.STALLED, cause=vocab.CONFIGURATION,
                           reason="%s; its stacks stayed on the same frames over %d samples: "
                                  "%s" % (reason, stacks.FROZEN_SAMPLES, hang["text"]),
                           advice=stall_advice(phase, obs["processes"]))
            verdict["evidence"].update(health=health, last_lines=log["last_lines"])
            _stack_evidence(verdict, hang)
            return True
        cause, frozen = _stall_cause(obs["processes"])
        verdict.update(verdict=vocab.UNHEALTHY, cause=cause if frozen else None,
                       reason=reason + ("; " + frozen if frozen else ""),
                       advice=("%s: send SIGCONT, or find what stopped it" % frozen
                               if frozen else "py-spy dump the scheduler processes, and read "
                               "the log's last lines: generation fails or hangs"))
        verdict["evidence"].update(health=health, ready_endpoint=obs.get("ready_endpoint"),
                                   failures=log["failures"][-5:], last_lines=log["last_lines"])
        return True
    return False


def _bootstrap_down(verdict, obs):
    """A prefill whose HTTP server answers and whose KV bootstrap server does not: decode
    servers cannot look it up, so every request through it fails. SGLang logs a bind failure
    as "Server error: [Errno 98] error while attempting to bind on address ..." and serves on."""
    port, answered = obs["bootstrap_port"], obs.get("bootstrap_health")
    marks = ("attempting to bind on address", ", %d)" % port)
    bind = [line for line in obs["log"]["error_lines"] if all(m in line for m in marks)]
    reason = ("/health answered 200, but its KV bootstrap server on port %d %s: no decode "
              "server can fetch this prefill's KV cache"
              % (port, "does not answer" if answered is None else "answered %s" % answered))
    if bind:
        reason += "; it could not bind the port (%s)" % bind[-1].strip()
        if obs.get("bootstrap_holders"):
            reason += "; port %d is held by %s" % (port, ", ".join(obs["bootstrap_holders"]))
        advice = ("free port %d (ss -ltnp 'sport = :%d' names the process that holds it), or "
                  "set sglang_server_disaggregation_bootstrap_port to a free port; then "
                  "recover" % (port, port))
    else:
        advice = ("its thread ended while the server runs: read the log's 'Server error' "
                  "lines, then recover (a restart starts it again)")
    verdict.update(verdict=vocab.UNHEALTHY, cause=vocab.ENVIRONMENT if bind else None,
                   reason=reason, advice=advice)
    verdict["evidence"].update(health=200, bootstrap_port=port, bootstrap_health=answered,
                               error_lines=obs["log"]["error_lines"],
                               last_lines=obs["log"]["last_lines"])


def _kv_transfer_failed(verdict, kv, looked_before):
    """A ready PD server whose log gained KV transfer failures since the previous look (at the
    first look: any in the log). It stays ready: it serves every request whose other side
    works, and restarting it would not mend the prefill the failures lie with."""
    prefills = sorted(kv["prefills"])
    said = "%d request%s aborted" % (kv["requests_failed"],
                                     "" if kv["requests_failed"] == 1 else "s")
    for counter, words in (("lookups_failed", "failed look-up%s of a prefill"),
                           ("prefills_lost", "lost connection%s to a prefill")):
        if kv[counter]:
            said += ", %d " % kv[counter] + words % ("" if kv[counter] == 1 else "s")
    if prefills:
        said += ", naming the prefill%s at %s" % ("s" if len(prefills) > 1 else "",
                                                   ", ".join(prefills))
    verdict["reason"] += "; KV transfers failed %s (the log holds %s; the latest%s: %s)" % (
        "since the last look" if looked_before else "in its log", said,
        " at %s" % _stamp(kv["last_at"]) if kv.get("last_at") else "", kv["last_message"])
    verdict["kv_transfer"] = dict(kv, prefills=prefills)
    verdict["advice"] = ("this server serves on; the failures lie with the prefill%s named (its "
                         "KV bootstrap server, its transfer engine, or the network between "
                         "them): its own verdict says why, and recovering it, not this server, "
                         "ends them" % ("s" if len(prefills) > 1 else "")
                         if prefills else
                         "this server serves on; read its latest KV transfer lines for the "
                         "prefill and the reason (a timeout names the wait that ran out)")


def _stalled_or_progressing(verdict, obs, now, windows, ceilings, quiet_span):
    phase, log = verdict["phase"], obs["log"]
    # Quiet up to when the signals were read, not to the end of the observation: a /health
    # probe held by a port that accepts and never answers can take its whole timeout, while
    # the log it no longer reads moves on.
    quiet_for = max(0.0, now - _observing_s(obs) - verdict["last_progress_at"])
    in_phase = now - verdict["since"]
    window, ceiling = windows.get(phase, 300), ceilings.get(phase, 3600)
    hang = verdict.get("stack_hang")
    if quiet_for <= window and in_phase <= ceiling and not hang:
        verdict.update(verdict=vocab.PROGRESSING, reason="")  # worded by classify()
        return
    flat = [k for k in ("log_lines", "shards_done", "capture_done", "progress_ticks",
                        "bytes_read", "gpu_memory", "port_open") if k not in verdict["moved"]]
    # The headline names the phase before the reason ("stalled in <phase>: ...").
    if quiet_for > window:
        reason = "no progress for %.0f s (window %d s)" % (quiet_for, window)
    elif in_phase > ceiling:
        reason = "the phase has lasted %.0f s, over its ceiling of %d s" % (in_phase, ceiling)
    else:
        reason = stack_hang_reason(quiet_for, hang)
    if hang:
        _stack_evidence(verdict, hang)
    states = sorted(set(p["state"] for p in obs["processes"]))
    cause, frozen = _stall_cause(obs["processes"])
    if frozen:
        reason += "; " + frozen
    advice = stall_advice(phase, obs["processes"], frozen)
    waiting = log.get("rendezvous")
    if waiting and not frozen:
        # A multi-node group's ranks wait for the others at the rendezvous: a node that never
        # started (or cannot reach --dist-init-addr) holds them all.
        reason += "; " + logphase.rendezvous_text(waiting)
        advice = "%s; %s" % (failures_grammar.FAILURE_HINTS["dist_init_timeout"], advice)
        verdict["evidence"]["rendezvous"] = waiting
    verdict.update(verdict=vocab.STALLED, reason=reason, stalled_for=quiet_for, cause=cause,
                   advice=advice)
    verdict["evidence"].update(flat_signals=flat, last_lines=log["last_lines"],
                               process_states=states, port_open=bool(obs.get("port_open")),
                               waits_on=vocab.WAITS_ON.get(phase))
    busy = _busy_wait(*quiet_span)
    if busy:
        verdict["evidence"]["busy_wait"] = busy


def stack_hang_reason(quiet_for, hang):
    """'no progress for 34 s and every rank's stack stayed on the same frames over 3
    samples: CUDA graph capture at capture_one_shape (...) on TP0; ...'."""
    return ("no progress for %.0f s and every rank's stack stayed on the same frames over "
            "%d samples: %s" % (quiet_for, stacks.FROZEN_SAMPLES, hang["text"]))


def _stack_evidence(verdict, hang):
    verdict["signature"] = hang["signature"]
    verdict["evidence"]["stacks"] = hang


def _stall_cause(processes):
    """A stall some process explains: one stopped by a signal (state T: SIGSTOP, a debugger)
    is external; one in uninterruptible sleep (D: disk, NFS, the driver) is the node's."""
    stopped = [p for p in processes if p.get("state") in ("T", "t")]
    if stopped:
        return vocab.EXTERNAL, ("%d of its processes are stopped (state T: SIGSTOP or a "
                                "debugger), pid %s" % (len(stopped), stopped[0]["pid"]))
    waiting = [p for p in processes if p.get("state") == "D"]
    if waiting and len(waiting) == len(processes):
        return vocab.ENVIRONMENT, ("every process is in uninterruptible sleep (state D: "
                                   "disk, NFS or the driver)")
    return vocab.CONFIGURATION, None


def _scheduler_pids(processes):
    named = [p for p in processes if "scheduler" in (p.get("cmdline") or "")]
    return [p["pid"] for p in (named or processes)]


def stall_advice(phase, processes, frozen=None):
    """What a stalled phase waits on and what to do next."""
    if frozen:
        return "%s: send SIGCONT, or find what stopped it" % frozen
    pids = _scheduler_pids(processes)
    parts = ["%s waits on %s" % (phase, vocab.WAITS_ON.get(phase, "its next step"))]
    if pids:
        # Every rank: the one that hangs a collective may be any of them, the last included.
        parts.append("see where each rank is: py-spy dump --pid %d%s" % (
            pids[0], " (and %s)" % ", ".join(str(p) for p in pids[1:]) if len(pids) > 1
            else ""))
    if phase in vocab.COLLECTIVE_PHASES:
        parts.append("for a collective hang, set %s in sglang_server_extra_env and start "
                     "again" % vocab.NCCL_DEBUG_ENV)
    return "; ".join(parts)
