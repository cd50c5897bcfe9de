# -*- coding: utf-8 -*-
# One gate observation of a deployment, as sglang_health returns it: observe, judge against the
# previous observation, keep watching while the server progresses in the same phase, remember
# the observation for the next call. sglang_health runs it for the gate's polls; sglang_node
# runs it once when nothing is to change, so that a re-run asks the server in the node check's
# own module run.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import time

from ..common.args import (
    DEPLOYMENT_REQUIRED_IF,
    deployment_argument_spec,
)
from ..common.files import read_json, write_json_atomic
from ..common.http import HEALTH_GRACE_S, http_status
from ..common.text import inert
from ..common.vocab import PROGRESSING
from ..logs.logphase import progress_text
from .classify import classify, stack_state
from .observe import observe
from .stacks import SAMPLE_INTERVAL_S, STACK_WINDOW_S

# sglang_health's options; sglang_node takes the same ones as its `gate` option.
GATE_ARGS = deployment_argument_spec(
    log_file=dict(type="path", required=True),
    gate_state_file=dict(type="path", required=True),
    host=dict(type="str", default="127.0.0.1"),
    port=dict(type="int", required=True),
    serves_http=dict(type="bool", default=True),
    bootstrap_port=dict(type="int"),
    health_timeout=dict(type="float", default=25),
    gpu_timeout=dict(type="float", default=10),
    kernel_log=dict(type="str", default="kmsg"),
    cuda_graph=dict(type="bool", default=True),
    stall_windows=dict(type="dict", required=True),
    ceilings=dict(type="dict", required=True),
    wait=dict(type="float", default=0),
    poll=dict(type="float", default=1.0),
    stack_sampling=dict(type="bool", default=True),
    py_spy=dict(type="str", default=""),
    stack_interval=dict(type="float", default=SAMPLE_INTERVAL_S),
    stack_window=dict(type="float", default=STACK_WINDOW_S),
)
GATE_REQUIRED_IF = DEPLOYMENT_REQUIRED_IF


class GateArgsInvalid(ValueError):
    """The stall windows or ceilings are not numbers of seconds."""


# Once the server's port is open, /health is asked this often between observations: SGLang
# answers 503 at once while it starts, and a second after it is Up at the earliest, so the
# first 200 comes about a second after the server is ready, whoever asks. Each request is one
# uvicorn access line in the server's log while it starts (five a second here).
HEALTH_GAP_S = 0.2
# HEALTH_GRACE_S (module_utils/common/http): how long one such request waits at most.


def await_health(p, until):
    """Ask /health every HEALTH_GAP_S until it answers 200 (True) or `until` passes (False)."""
    url = "http://%s:%d/health" % (p["host"], p["port"])
    while True:
        asked = time.monotonic()
        if http_status(url, min(p["health_timeout"], HEALTH_GRACE_S)) == 200:
            return True
        if time.monotonic() + HEALTH_GAP_S > until:
            return False
        time.sleep(max(0.0, asked + HEALTH_GAP_S - time.monotonic()))


def watch(p, previous, windows, ceilings, health_answered=False):
    """Observe, and keep observing on the node for up to `wait` seconds while the server is
    progressing in the same phase: return at once on a verdict or a phase change (so the gate
    answers the moment a server is ready, and no SSH session is held for long). Observations
    are `poll` s apart (0.25 s at least). While the port is open, /health is asked every
    HEALTH_GAP_S between them, and a phase change is reported once /health has had
    HEALTH_GRACE_S to answer 200. `health_answered`: /health answered 200 just before the
    call (the node check asks it first), so that the first observation does not ask again."""
    obs = observe(p, health_answered=health_answered, stack_state=stack_state(previous))
    verdict, state = classify(previous, obs, time.monotonic(), windows, ceilings,
                              p.get("stack_window", STACK_WINDOW_S))
    deadline = time.monotonic() + max(0.0, p["wait"])
    pause = max(0.25, p["poll"])
    phase, changed_by = verdict["phase"], None
    while verdict["verdict"] == PROGRESSING:
        if verdict["phase"] != phase:
            if not obs.get("port_open") or p["wait"] <= 0:
                break
            if changed_by is None:
                changed_by = time.monotonic() + HEALTH_GRACE_S
        until = deadline if changed_by is None else changed_by
        if obs.get("port_open") and p["serves_http"]:
            if time.monotonic() + HEALTH_GAP_S > until:
                break
            answered = await_health(p, min(until, time.monotonic() + pause))
            obs = observe(p, health_answered=answered, stack_state=stack_state(state))
        else:
            if time.monotonic() + pause > until:
                break
            time.sleep(pause)
            obs = observe(p, stack_state=stack_state(state))
        verdict, state = classify(state, obs, time.monotonic(), windows, ceilings,
                                  p.get("stack_window", STACK_WINDOW_S))
    return obs, verdict, state


def judge(p, check_mode, health_answered=False):
    """The gate's verdict on the deployment `p` describes (GATE_ARGS), as sglang_health
    returns it; the observation is kept for the next call unless in check mode."""
    try:
        windows = dict((k, float(v)) for k, v in p["stall_windows"].items())
        ceilings = dict((k, float(v)) for k, v in p["ceilings"].items())
    except (TypeError, ValueError) as exc:
        raise GateArgsInvalid("stall_windows and ceilings map phases to seconds: %s" % exc) \
            from exc
    obs, verdict, state = watch(p, read_json(p["gate_state_file"]), windows, ceilings,
                                health_answered)
    if not check_mode and os.path.isdir(os.path.dirname(p["gate_state_file"])):
        write_json_atomic(p["gate_state_file"], state)
    verdict["progress_text"] = progress_text(obs["log"])
    # Process titles are the node's text: made inert like the log's lines.
    verdict["processes"] = [dict((k, inert(m[k], keep_newlines=False) if k == "cmdline"
                                  else m[k]) for k in ("pid", "state", "cmdline", "utime_ticks"))
                            for m in obs["processes"]]
    verdict["gpus"] = obs.get("gpus", [])
    verdict["run_id"] = obs["run_id"]
    if verdict["verdict"] in ("crashed", "gpu_fault") and obs.get("launch_errors"):
        # Write errors in the launch path (a full log filesystem) leave nothing in the log.
        verdict["evidence"]["launch_errors"] = obs["launch_errors"]
    if obs.get("gpu_error"):
        verdict["evidence"]["gpu_error"] = obs["gpu_error"]
    return verdict
