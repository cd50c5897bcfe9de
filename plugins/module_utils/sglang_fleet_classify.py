# -*- coding: utf-8 -*-
# The verdict classifier: a pure function of the previous gate state and one observation.
# It judges progress, not elapsed time: a phase is progressing while any of its progress
# signals moves, stalled when none moved for the phase's window, and each phase has a ceiling.
# A fatal failure line in the current run (the log grammar says which kinds are fatal) is
# `crashed` at once, even while processes live: with dp_size > 1 the main process outlives a
# dead scheduler, and waiting out a stall window would only hide the cause. So is the kernel's
# OOM killer taking one of the run's processes: a SIGKILLed scheduler prints nothing.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

try:
    from ansible.module_utils import sglang_fleet_logphase as logphase
    from ansible.module_utils import sglang_fleet_vocab as vocab
except ImportError:  # imported by the controller package or its tests, outside Ansible
    from sglang_fleet_node import sglang_fleet_logphase as logphase
    from sglang_fleet_node import sglang_fleet_vocab as vocab

# Bytes read per poll that count as loading progress. A busy-waiting process reads a few bytes
# a second from its event pipe; weight loading reads gigabytes.
READ_PROGRESS_BYTES = 1 << 20
GPU_MEMORY_PROGRESS_BYTES = 64 << 20


def _signals(obs):
    """The progress signals of one observation, as comparable numbers."""
    log = obs["log"]
    members = obs["processes"]
    return {
        "phase_index": vocab.PHASES.index(log["phase"]),
        "log_lines": log["meaningful_lines"],
        "shards_done": (log["shards"] or [0, 0])[0],
        "capture_done": (log["capture"] or [0, 0])[0],
        "progress_ticks": log.get("progress_ticks", 0),
        "bytes_read": sum(p.get("rchar", 0) for p in members),
        "cpu_ticks": sum(p.get("utime_ticks", 0) + p.get("stime_ticks", 0) for p in members),
        "write_calls": sum(p.get("syscw", 0) for p in members),
        "gpu_memory": obs.get("gpu_memory_used", 0),
        "members": len(members),
        "port_open": 1 if obs.get("port_open") else 0,
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


def _oom_killed_members(obs, member_pids):
    """The kernel's OOM kills of processes this run had: the killed one is gone by the time
    the kill is read, so the run's earlier members are remembered in the gate state."""
    known = set(member_pids)
    return [{"kind": "killed", "fatal": True, "line": kill["line"], "at": kill["at"]}
            for kill in obs.get("oom_kills") or [] if kill.get("pid") in known]


def _xid_fault(xids):
    worst = None
    for xid in xids:
        if xid["code"] in vocab.APPLICATION_XIDS and worst is not None:
            continue
        worst = xid
    return worst


def classify(prev_state, obs, now, windows, ceilings):
    """Return (verdict dict, new state). `prev_state` is None on the first observation.

    Besides the verdict, its phase and reason, the dict says how the current phase stands
    against its limits, in seconds measured on the node (so a reader on another clock can
    count down from them): `window_s` and `ceiling_s` of the phase, `quiet_s` since the last
    progress, `phase_s` in the phase, and for `progressing` `stalls_in_s` (time left before
    it would be judged stalled) with `stalls_by` ("window" or "ceiling", whichever is
    nearer). `headline` is the verdict in one line of words."""
    verdict, state = _judge(prev_state, obs, now, windows, ceilings)
    phase = verdict["phase"]
    window, ceiling = windows.get(phase, 300), ceilings.get(phase, 3600)
    quiet = max(0.0, now - verdict["last_progress_at"])
    in_phase = max(0.0, now - verdict["since"])
    verdict.update(window_s=window, ceiling_s=ceiling, quiet_s=round(quiet, 1),
                   phase_s=round(in_phase, 1))
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


def _judge(prev_state, obs, now, windows, ceilings):
    prev_state = prev_state or {}
    log = obs["log"]
    phase = log["phase"]
    signals = _signals(obs)
    run_id = obs.get("run_id")
    if prev_state.get("run_id") != run_id:
        prev_state = {}  # a new start: history of the previous run does not apply

    prev_signals = prev_state.get("signals") or {}
    moved = _moved(prev_signals, signals) if prev_signals else []
    last_progress = prev_state.get("last_progress_at")
    # Without history, the log's own clock says when the server last did something.
    activity = obs.get("last_log_activity") or obs.get("started_at") or now
    if last_progress is None:
        last_progress = activity
    if moved:
        last_progress = now
    last_progress = max(last_progress, activity)
    phase_since = prev_state.get("phase_since") if prev_state.get("phase") == phase else None
    if phase_since is None:
        phase_since = obs.get("phase_started_at") or last_progress
    # Signals as they stood at the last progress: the busy-wait signature is judged over the
    # whole quiet span, not between two polls a second apart.
    quiet_signals = signals if (moved or not prev_state) else (
        prev_state.get("quiet_signals") or prev_signals)
    member_pids = sorted(set(prev_state.get("member_pids") or ()) |
                         set(p["pid"] for p in obs["processes"]))
    state = {"run_id": run_id, "signals": signals, "last_progress_at": last_progress,
             "member_pids": member_pids,
             "phase": phase, "phase_since": phase_since, "observed_at": now,
             "quiet_signals": quiet_signals, "quiet_since": now if moved or not prev_state
             else prev_state.get("quiet_since", now)}

    verdict = {
        "phase": phase,
        "progress": log.get("progress"),
        "since": phase_since,
        "last_progress_at": last_progress,
        "moved": moved,
        "evidence": {},
    }

    if not obs.get("started") and not obs["processes"]:
        verdict.update(verdict=vocab.ABSENT, reason="no record of this deployment starting "
                       "and none of its processes is running")
        return verdict, state

    xid = _xid_fault(obs.get("xids") or [])
    if xid is not None:
        verdict.update(verdict=vocab.GPU_FAULT, reason="Xid %d in the kernel log: %s"
                       % (xid["code"], xid["action"]), xid=xid)
        verdict["evidence"]["kernel"] = [x["line"] for x in obs["xids"]]
        return verdict, state

    if not obs["main_alive"]:
        status = obs.get("exit_status")
        verdict.update(verdict=vocab.CRASHED, exit_status=status,
                       reason="the server exited (status %s) in %s" % (status, phase)
                       if status is not None else
                       "the server exited in %s (no exit status recorded)" % phase)
        verdict["evidence"].update(failures=log["failures"], error_lines=log["error_lines"],
                                   last_lines=log["last_lines"],
                                   kernel_oom=obs.get("oom_kills") or [],
                                   leftover_processes=len(obs["processes"]))
        return verdict, state

    fatal = (logphase.fatal_failures(log, since=obs.get("started_at"))
             + _oom_killed_members(obs, member_pids))
    if fatal:
        first = fatal[0]
        verdict.update(verdict=vocab.CRASHED, exit_status=None,
                       reason="%s in %s while %d of its processes are still running: %s"
                       % (first["kind"], phase, len(obs["processes"]), first["line"]))
        verdict["evidence"].update(fatal_line=first["line"], failures=fatal[:10],
                                   error_lines=log["error_lines"],
                                   last_lines=log["last_lines"],
                                   processes_alive=len(obs["processes"]))
        return verdict, state

    health = obs.get("health")
    # /health answers 200 only once warm-up succeeded: from warming_up on (the ready line may
    # not be written yet, or have left the log tail of a long-running server) that is ready.
    if health == 200 and (phase in ("warming_up", "serving")
                          or not obs.get("serves_http", True)):
        verdict.update(verdict=vocab.READY, reason="/health answered 200")
        return verdict, state
    if not obs.get("serves_http", True) and phase in ("starting_http", "warming_up", "serving"):
        verdict.update(verdict=vocab.READY, reason="workers of a non-zero node rank finished "
                       "start-up; rank 0 serves HTTP")
        return verdict, state
    if phase == "serving":
        verdict.update(verdict=vocab.UNHEALTHY,
                       reason="serving, but /health %s" % (
                           "timed out" if health is None else "answered %s" % health))
        verdict["evidence"].update(health=health, ready_endpoint=obs.get("ready_endpoint"),
                                   failures=log["failures"][-5:], last_lines=log["last_lines"])
        return verdict, state

    quiet_for = now - last_progress
    in_phase = now - phase_since
    window = windows.get(phase, 300)
    ceiling = ceilings.get(phase, 3600)
    if quiet_for > window or in_phase > ceiling:
        flat = [k for k in ("log_lines", "shards_done", "capture_done", "progress_ticks",
                            "bytes_read", "gpu_memory", "port_open") if k not in moved]
        # The headline names the phase before the reason ("stalled in <phase>: ...").
        reason = ("no progress for %.0f s (window %d s)" % (quiet_for, window)
                  if quiet_for > window else
                  "the phase has lasted %.0f s, over its ceiling of %d s" % (in_phase, ceiling))
        verdict.update(verdict=vocab.STALLED, reason=reason, stalled_for=quiet_for)
        verdict["evidence"].update(flat_signals=flat, last_lines=log["last_lines"],
                                   process_states=sorted({p["state"] for p in obs["processes"]}),
                                   port_open=bool(obs.get("port_open")))
        busy = _busy_wait(quiet_signals, signals, now - state["quiet_since"])
        if busy:
            verdict["evidence"]["busy_wait"] = busy
        return verdict, state

    verdict.update(verdict=vocab.PROGRESSING, reason="")  # worded by classify()
    return verdict, state
