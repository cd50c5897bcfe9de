#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_health
short_description: Observe one SGLang deployment and return its verdict
description:
  - Observes the deployment's processes (found by membership; state, CPU time, I/O counters),
    its log (phase and progress in SGLang 0.5.23 and 0.5.4-0.5.12 formats, failure lines), its
    port and C(/health), its GPU memory (NVML or simulated) and kernel Xid/OOM lines since the
    start, and returns one verdict, C(ready), C(progressing), C(stalled), C(crashed),
    C(unhealthy), C(gpu_fault), C(stopped) or C(absent), with the phase, progress, evidence,
    and for a failed verdict its cause and what to do.
  - Failure lines count only where SGLang writes them (a log record's message, a traceback's
    final exception line, a shell's or torch's own line), never inside SGLang's request log.
    A live server whose log reads as fatal but which answers C(/health) and
    C(/health_generate) with 200 is C(ready), and the reason says that the two disagree.
  - Time is the node's monotonic clock; the log's printed timestamps are never used to judge
    progress. The log is read from where the current run began, its first 1 MiB and last
    8 MiB.
  - Judges progress, not elapsed time. A phase is progressing while any of its signals moves
    (log lines, shard and capture counts, bytes read, GPU memory, the port); it is stalled
    when none moved for the phase's window, or when the phase outlasts its ceiling.
  - Returns within seconds, so a gate polls it with C(until) instead of holding one SSH
    session for an hour. Observations between calls are kept in I(gate_state_file).
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet
  - sglang.fleet.sglang_fleet.gpu
  - sglang.fleet.sglang_fleet.attributes
options:
  from_spec:
    description:
      - The sglang_server role's LaunchSpec (C(sglang_server_launch_spec)). On the controller,
        its gate view (the one M(sglang_node)'s I(gate) takes) fills every option below that
        the task does not give; options given beside it win. Never sent to the node.
    type: dict
  log_file:
    description: The server log.
    type: path
    required: true
  gate_state_file:
    description: Where the previous observation is kept between calls.
    type: path
    required: true
  host:
    description: Address to probe the HTTP port on.
    type: str
    default: 127.0.0.1
  port:
    description: HTTP port of the server.
    type: int
    required: true
  serves_http:
    description: Whether this node serves HTTP (rank 0 of a multi-node server).
    type: bool
    default: true
  bootstrap_port:
    description:
      - A prefill server's KV bootstrap server port (C(--disaggregation-bootstrap-port)). The
        server is C(ready) only when this server's C(/health) answers too; a bootstrap server
        that does not answer while the HTTP server does is C(unhealthy), since no decode can
        fetch the prefill's KV cache.
    type: int
  health_timeout:
    description: Seconds to wait for C(/health); above SGLang's own 20 s generation timeout.
    type: float
    default: 25
  gpu_timeout:
    description: Seconds allowed for an NVML query.
    type: float
    default: 10
  kernel_log:
    description: C(kmsg) to read C(/dev/kmsg), a file of C(<epoch> <message>) lines
      (the simulated fleet), or C(none).
    type: str
    default: kmsg
  cuda_graph:
    description: Whether the server captures CUDA graphs (without, the memory pool's end
      ends the KV-cache phase).
    type: bool
    default: true
  stall_windows:
    description: Seconds without progress after which a phase is stalled, by phase.
    type: dict
    required: true
  ceilings:
    description: Longest a phase may last whatever its progress, by phase.
    type: dict
    required: true
  wait:
    description: Seconds to keep observing on the node while the server progresses in the
      same phase; the module returns at once on a verdict other than C(progressing) or on a
      phase change. 0 observes once.
    type: float
    default: 0
  poll:
    description: Seconds between observations while waiting (0.25 s while the port is open and
      /health is not yet 200).
    type: float
    default: 1.0
  stack_sampling:
    description: Sample each rank's Python stack with py-spy's non-blocking mode while the
      server starts and serves, so that a hang whose stacks stop changing is C(stalled) within
      O(stack_window) of its last progress, whatever the phase's window. Without py-spy, or
      where ptrace is denied, the verdict says so once and hangs are judged by the windows.
    type: bool
    default: true
  py_spy:
    description: py-spy executable; when empty it is looked for beside the server's Python,
      then on PATH.
    type: str
    default: ""
  stack_interval:
    description: Seconds between two samples of one rank (each sample costs milliseconds of
      py-spy's CPU and never pauses the rank).
    type: float
    default: 10.0
  stack_window:
    description: Seconds with no progress, over which every rank's stack stayed on the same
      frames (3 samples at least), after which the server is C(stalled).
    type: float
    default: 30.0
  release_lock:
    description:
      - The deployment's lock (I(path)) and the run that holds it (I(run), as the lock records
        it). When the verdict is C(ready) the lock is released, if that run still holds it; the
        deploy's last business on the node done in the observation that ends it.
      - Not in check mode.
    type: dict
  renew_lock:
    description:
      - The deployment's lock (I(path)) and the run that holds it (I(run)). Each observation
        renews that run's lease on the lock (when the run still holds it), so that a long gate
        is a live owner's, never a stale lock. Not in check mode.
    type: dict
  shm_dir:
    description:
      - The deployment's shared-memory folder. Each observation records the deployment's
        processes and the segments there they have open or mapped, binding them to its run
        for M(sglang_shm_cleanup) (nothing else is ever removed). Not in check mode.
    type: path
notes:
  - In check mode the observation is not remembered; a first observation measures the time
    since the last progress from the log file's age on the node's clock.
"""

EXAMPLES = r"""
- name: Gate on the server of the LaunchSpec the sglang_server role built
  sglang.fleet.sglang_health:
    from_spec: "{{ sglang_server_launch_spec }}"
    wait: 10
  register: verdict
  until: verdict.verdict != 'progressing'
  retries: 720
  delay: 0

- name: Gate on one server
  sglang.fleet.sglang_health:
    marker: "node1:Kimi-K2.5-30000"
    state_file: /opt/sglang-fleet/run/Kimi-K2.5-30000.pid
    log_file: /opt/sglang-fleet/logs/Kimi-K2.5-30000.log
    gate_state_file: /opt/sglang-fleet/run/Kimi-K2.5-30000.gate.json
    manager: systemd
    unit_name: sglang-Kimi-K2.5-30000.service
    port: 30000
    stall_windows: {loading_weights: 300, capturing_cuda_graph: 600}
    ceilings: {loading_weights: 7200}
    wait: 10
  register: verdict
  until: verdict.verdict != 'progressing'
  retries: 720
  delay: 0
"""

RETURN = r"""
lock_released:
  description: Whether the lock named by I(release_lock) was released (false when that run no
    longer held it).
  returned: when I(release_lock) was given and the verdict is ready
  type: bool
  sample: true
verdict:
  description: One of ready, progressing, stalled, crashed, unhealthy, gpu_fault, stopped,
    absent.
  returned: always
  type: str
  sample: stalled
cause:
  description: Why a server failed, when it did and the evidence says - C(configuration),
    C(environment) (a full disk, the host's OOM killer, a reboot), C(external) (a signal from
    outside SGLang, a stopped process) or C(hardware) (a GPU fault). Only a configuration
    cause makes recovery change the configuration.
  returned: when the verdict is stalled, crashed, unhealthy or gpu_fault
  type: str
  sample: environment
failure:
  description: The failure the verdict rests on - its kind, C(said) (the exception's own final
    line with the ranks that printed it and its log line), C(hint), C(ranks), C(line_no).
  returned: when crashed or gpu_fault from a log line
  type: dict
advice:
  description: What to do next (for a stall, what the phase waits on, the py-spy command for
    each scheduler and the NCCL variables to set).
  returned: when the verdict is failed and there is something to say, or a ready PD server's
    KV transfers failed since the last look
  type: str
kv_transfer:
  description: A ready PD server whose log gained KV transfer failures since the last look (at
    the first look, any in its log; the server serves on). C(requests_failed) counts the
    requests aborted as their KV cache did not pass, C(lookups_failed) the failed look-ups of a
    prefill's bootstrap server, C(prefills_lost) the prefills the decode's heartbeat lost,
    C(prefills) the bootstrap addresses the lines name, C(last_line) and C(last_at) the
    latest line.
  returned: when there is news of KV transfer failures
  type: dict
  sample: {requests_failed: 2, lookups_failed: 16, prefills_lost: 1, prefills: ["10.0.0.5:8998"]}
stopped_by:
  description: Who stopped the server (C(stop.yml), C(a recovery), or C(SIGTERM) from the
    log).
  returned: when stopped
  type: str
phase:
  description: Start-up phase from the log.
  returned: always
  type: str
  sample: capturing_cuda_graph
progress_text:
  description: Short progress, e.g. "loading_weights 27/61 shards".
  returned: always
  type: str
reason:
  description: Why this verdict, in one sentence.
  returned: always
  type: str
headline:
  description: The verdict in one line of words, the phase named only where it says where
    the server is.
  returned: always
  type: str
  sample: "stalled in capturing_cuda_graph: no progress for 601 s (window 600 s)"
window_s:
  description: The current phase's stall window in seconds (no progress for this long is
    C(stalled)).
  returned: always
  type: float
ceiling_s:
  description: The current phase's ceiling in seconds (the longest it may last).
  returned: always
  type: float
quiet_s:
  description: Seconds since the last progress, measured on the node.
  returned: always
  type: float
phase_s:
  description: Seconds in the current phase, measured on the node.
  returned: always
  type: float
stalls_in_s:
  description: Seconds left before a C(progressing) server would be judged C(stalled),
    by its window or its ceiling, whichever is nearer.
  returned: when progressing
  type: float
stalls_by:
  description: Which limit C(stalls_in_s) counts down to, C(window) or C(ceiling).
  returned: when progressing
  type: str
since:
  description: Epoch seconds when the phase began.
  returned: always
  type: float
last_progress_at:
  description: Epoch seconds of the last progress seen.
  returned: always
  type: float
evidence:
  description: What the verdict rests on (flat signals, busy-wait signature, last log lines,
    failure lines, Xid lines, exit status).
  returned: always
  type: dict
exit_status:
  description: Exit status of the server, when crashed.
  returned: when crashed
  type: int
xid:
  description: The Xid that made the verdict gpu_fault, with NVIDIA's recommended action.
  returned: when gpu_fault
  type: dict
run_id:
  description: The start time of the run observed (the state file's C(started_at)); a
    recovery checks under its lock that the server is still that run.
  returned: always
  type: float
signature:
  description: For a C(stalled) verdict its ranks' stacks decided, the hang's signature
    (C(cuda_graph_capture), C(nccl_collective), C(scheduler_peer_wait), C(weight_io),
    C(jit_compilation), C(detokenizer_deadlock)), or null when the frames match none;
    I(evidence.stacks) names the rank, the frame and the ranks that wait for it.
  returned: when stalled by stacks
  type: str
stack_sampling:
  description: Said once, on the first observation that finds stack sampling off (py-spy
    missing, ptrace denied, or I(stack_sampling=false)); hangs are then judged by the phases'
    windows alone. A warning too, unless I(stack_sampling=false) turned it off. A C(stalled)
    or C(unhealthy) verdict judged without stacks says the same in I(evidence.stack_sampling).
  returned: when sampling is off, once
  type: str
processes:
  description: The deployment's processes with state and CPU ticks.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.deploy.lock import (
    LockError,
    LockFile,
)
from ansible_collections.sglang.fleet.plugins.module_utils.health.gate import (
    GATE_ARGS,
    GATE_REQUIRED_IF,
    GateArgsInvalid,
    judge,
)
from ansible_collections.sglang.fleet.plugins.module_utils.process.shm import record_run

_LOCK_OPTIONS = dict(path=dict(type="path", required=True), run=dict(type="dict", required=True))


def _bookkeeping(module, verdict):
    """What each observation leaves on the node besides its verdict: the lease of the run that
    holds the lock renewed, the run's processes and segments bound to it."""
    p = module.params
    try:
        if p["renew_lock"]:
            LockFile(p["renew_lock"]["path"]).renew(p["renew_lock"]["run"])
        if p["shm_dir"] and verdict.get("processes"):
            record_run(p["state_file"], [m["pid"] for m in verdict["processes"]], p["shm_dir"])
    except (LockError, OSError, IOError) as exc:
        module.warn("could not renew the lock or record the run's segments: %s" % exc)


def main():
    module = AnsibleModule(
        argument_spec=dict(GATE_ARGS, release_lock=dict(type="dict", options=_LOCK_OPTIONS),
                           renew_lock=dict(type="dict", options=_LOCK_OPTIONS),
                           shm_dir=dict(type="path")),
        required_if=GATE_REQUIRED_IF, supports_check_mode=True)
    with failing(module, GateArgsInvalid):
        verdict = judge(module.params, module.check_mode)
    if verdict.get("stack_sampling") and module.params["stack_sampling"]:
        module.warn(verdict["stack_sampling"])  # said once: the gate state remembers it
    if not module.check_mode:
        _bookkeeping(module, verdict)
    release = module.params["release_lock"]
    if release and verdict["verdict"] == "ready" and not module.check_mode:
        with failing(module, (LockError, OSError, IOError), "lock %s" % release["path"],
                     verdict):
            verdict["lock_released"] = LockFile(release["path"]).release(release["run"])
    module.exit_json(changed=False, **verdict)


if __name__ == "__main__":
    main()
