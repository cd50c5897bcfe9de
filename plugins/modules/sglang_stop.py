#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_stop
short_description: Stop a deployment's processes and prove its GPUs released
description:
  - Stops the service, then every process of the deployment (found by membership, orphans
    reparented to PID 1 included) with SIGTERM and a bounded wait, or straight to SIGKILL for
    a server judged hung (SGLang drains on SIGTERM and a hung one may never exit). On a
    non-zero node rank (I(node_rank)), whose SGLang main process only logs SIGTERM, SIGKILL
    follows as soon as its log says so, or after 5 s.
  - Identity, not numbers. The session recorded in I(state_file) is used only while its leader
    has the start time and boot recorded at start and carries the marker, so a PID reused by
    an unrelated session is never signalled. Every process is tracked by pid and start time
    between signals. Members must run as I(service_user); processes of other users that carry
    the deployment's marker are reported in C(foreign) and never signalled.
  - Never signals processes of other users or deployments, C(nvidia-persistenced),
    C(nv-hostengine)/DCGM, C(dcgm-exporter), or this module and its parents.
  - With I(aggressive=true), for dedicated nodes, it also ends every process of the service
    user whose command line matches SGLang's own C(killall_sglang) pattern
    (C(sglang::), C(sglang.launch_server), C(sglang serve), the simulator) and every process
    of the service user holding one of the node's GPU devices. Still spared are that agent
    list, processes of other users, and every process that carries another deployment's marker,
    runs in another deployment's supervisor session, or runs in another C(sglang-*.service)
    unit (C(spared_other_deployments)). Each process it stops without this deployment's
    marker is listed with its command line (C(unmarked_stopped)) and named in a warning.
  - Then polls the GPUs (no fixed sleeps) until none of the stopped processes is on them and
    memory is back to the pre-deploy baseline. If memory stays held it reports the holders and
    their states, resets the GPU when I(gpu_reset=true) and nothing else uses it, and otherwise
    writes I(reboot_mark) so that later deploys refuse the node until it is cleared.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet
  - sglang.fleet.sglang_fleet.gpu
  - sglang.fleet.sglang_fleet.attributes
options:
  hung:
    description: Skip SIGTERM and send SIGKILL at once.
    type: bool
    default: false
  term_timeout:
    description: Seconds to wait after SIGTERM before SIGKILL.
    type: float
    default: 30
  service_user:
    description: User the deployment runs as (the LaunchSpec's C(service.user)).
    type: str
    default: root
  node_rank:
    description: Node rank of a multi-node server (LaunchSpec C(group.node_rank)).
    type: int
    default: 0
  log_file:
    description: The server's log, read after SIGTERM for SGLang's non-zero-rank line.
    type: path
  aggressive:
    description: Also end SGLang-looking processes and GPU device holders of the service user
      outside the deployment (dedicated nodes only); protected agents, other users and other
      deployments are still spared.
    type: bool
    default: false
  baseline_file:
    description: GPU memory per device recorded before the server started.
    type: path
  verify_timeout:
    description: Seconds to wait for the GPUs to be released.
    type: float
    default: 60
  gpu_reset:
    description: Reset a GPU whose memory stays held when nothing else uses it.
    type: bool
    default: false
  reboot_mark:
    description: File written when memory stays held, marking the node for reboot.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Stop a hung server and verify its GPUs are free
  sglang.fleet.sglang_stop:
    marker: "node1:Kimi-K2.5-30000"
    state_file: /opt/sglang-fleet/run/Kimi-K2.5-30000.pid
    manager: systemd
    unit_name: sglang-Kimi-K2.5-30000.service
    hung: true
    baseline_file: /opt/sglang-fleet/run/Kimi-K2.5-30000.baseline.json
    reboot_mark: /opt/sglang-fleet/NEEDS_REBOOT
"""

RETURN = r"""
killed:
  description: Processes signalled, with pid, state and command line (secrets masked).
  returned: always
  type: list
  elements: dict
signals:
  description: Pids that got SIGTERM and SIGKILL.
  returned: always
  type: dict
escalated:
  description: Why SIGKILL came before the SIGTERM timeout (a non-zero node rank), or null.
  returned: always
  type: str
unmarked_stopped:
  description: Processes stopped that did not carry this deployment's marker, each with pid,
    uid, command line and why it was stopped (aggressive sweep, or membership by session or
    unit).
  returned: always
  type: list
  elements: dict
spared_other_deployments:
  description: In aggressive mode, SGLang-looking processes or GPU holders left alone because
    they belong to another deployment or another user, each with why.
  returned: always
  type: list
  elements: dict
foreign:
  description: Processes that carry this deployment's marker, session or unit but run as
    another user; never signalled.
  returned: always
  type: list
  elements: dict
spared_protected:
  description: Protected agents that carried the marker and were left alone.
  returned: always
  type: list
  elements: dict
released:
  description: Whether the GPUs were verified free.
  returned: always
  type: bool
seconds_to_free:
  description: Seconds from the kill decision to verified-free GPUs.
  returned: always
  type: float
held:
  description: Devices still held, with holders and their states.
  returned: always
  type: list
  elements: dict
reset:
  description: GPU reset attempts and their results.
  returned: always
  type: list
  elements: dict
reboot_needed:
  description: Whether the node was marked for reboot.
  returned: always
  type: bool
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.args import (
    DEPLOYMENT_REQUIRED_IF,
    deployment_argument_spec,
)
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.common.files import (
    read_json,
    write_json_atomic,
)
from ansible_collections.sglang.fleet.plugins.module_utils.gpu.gpu import (
    GpuQueryTimeout,
    GpuUnavailable,
    gpu_snapshot,
)
from ansible_collections.sglang.fleet.plugins.module_utils.process.procs import (
    describe_foreign,
    membership,
    recorded_session,
    service_uid,
)
from ansible_collections.sglang.fleet.plugins.module_utils.process.shm import record_run
from ansible_collections.sglang.fleet.plugins.module_utils.process.stop import (
    aggressive_targets,
    device_paths,
    kill_members,
    reset_gpu,
    verify_released,
)

_SHOWN = ("pid", "uid", "state", "cmdline", "why")


def _brief(proc):
    return dict((k, proc.get(k)) for k in _SHOWN if k in proc)


def main():
    module = AnsibleModule(
        argument_spec=deployment_argument_spec(
            hung=dict(type="bool", default=False),
            term_timeout=dict(type="float", default=30),
            service_user=dict(type="str", default="root"),
            node_rank=dict(type="int", default=0),
            log_file=dict(type="path"),
            aggressive=dict(type="bool", default=False),
            baseline_file=dict(type="path"),
            verify_timeout=dict(type="float", default=60),
            gpu_reset=dict(type="bool", default=False),
            reboot_mark=dict(type="path", required=True),
        ),
        required_if=DEPLOYMENT_REQUIRED_IF,
        supports_check_mode=True,
    )
    p = module.params
    try:
        uid = service_uid(p["service_user"])
    except (KeyError, ValueError):
        module.fail_json(msg="service_user=%r does not exist on this node. Fix: set "
                         "sglang_server_user to the user the server runs as" % p["service_user"])
    state = read_json(p["state_file"]) or {}
    session = recorded_session(state) if p["manager"] == "supervisor" else {}
    unit = p["unit_name"] if p["manager"] == "systemd" else None
    with failing(module, (GpuQueryTimeout, GpuUnavailable),
                 "cannot read the GPUs before stopping"):
        gpu_count = len(gpu_snapshot(p["gpu_backend"], p["sim_dir"]))
    extra, spared_others = [], []
    if p["aggressive"]:
        extra, spared_others = aggressive_targets(
            device_paths(p["gpu_backend"], p["sim_dir"], gpu_count), p["marker"], unit, uid)
    found = membership(p["marker"], unit=unit, uid=uid, **session)
    members = found["members"]
    member_pids = set(m["pid"] for m in members)
    extra = [e for e in extra if e["pid"] not in member_pids]
    result = dict(changed=bool(members or extra), killed=[], signals={}, spared_protected=[],
                  released=True, seconds_to_free=0.0, held=[], reset=[], reboot_needed=False,
                  escalated=None, foreign=[_brief(f) for f in found["foreign"]],
                  spared_other_deployments=[_brief(s) for s in spared_others],
                  unmarked_stopped=[])
    for line in describe_foreign(found["foreign"], p["service_user"]):
        module.warn(line)
    if module.check_mode:
        result["killed"] = members + extra
        result["unmarked_stopped"] = _unmarked(members, extra)
        module.exit_json(**result)

    # The processes about to be killed bind the segments named by their PIDs to this run, for
    # the shared-memory cleanup after the stop.
    try:
        record_run(p["state_file"], member_pids)
    except (OSError, IOError) as exc:
        module.warn("could not record the processes' PIDs for the shared-memory cleanup: %s"
                    % exc)
    decided = time.monotonic()
    if unit:
        cmd = ["systemctl", "kill", "--signal=SIGKILL", unit] if p["hung"] else \
            ["systemctl", "stop", "--no-block", unit]
        module.run_command(cmd)
    report = kill_members(p["marker"], session, unit, p["hung"], p["term_timeout"], extra,
                          uid=uid, node_rank=p["node_rank"], log_file=p["log_file"])
    stopped = [t for t in report["targets"] if t["pid"] in
               set(report["term_sent"]) | set(report["kill_sent"])]
    result.update(killed=report["targets"], spared_protected=report["spared_protected"],
                  signals={"SIGTERM": report["term_sent"], "SIGKILL": report["kill_sent"]},
                  escalated=report["escalated"],
                  unmarked_stopped=_unmarked([s for s in stopped if s["pid"] in member_pids],
                                             [s for s in stopped if s["pid"] not in member_pids]))
    if result["unmarked_stopped"] and p["aggressive"]:
        module.warn("aggressive mode stopped %d process(es) without this deployment's marker: %s"
                    % (len(result["unmarked_stopped"]), "; ".join(
                        "%d %s (%s)" % (u["pid"], u["cmdline"][:120], u["why"])
                        for u in result["unmarked_stopped"])))
    if state:
        state.update(pid=None, stopped_at=time.time(), stopped_by="a recovery")
        write_json_atomic(p["state_file"], state)
    targeted = set(t["pid"] for t in report["targets"])
    baseline = read_json(p["baseline_file"]) if p["baseline_file"] else None
    try:
        released, _, held = verify_released(p["gpu_backend"], p["sim_dir"], targeted, baseline,
                                             p["verify_timeout"])
        if not released and p["gpu_reset"]:
            for dev in held:
                others = [h for h in dev["holders"] if h["pid"] not in targeted]
                if others:
                    result["reset"].append({"index": dev["index"], "ok": False,
                                            "message": "not reset: other processes use it",
                                            "holders": others})
                    continue
                ok, message = reset_gpu(p["gpu_backend"], p["sim_dir"], dev["index"])
                result["reset"].append({"index": dev["index"], "ok": ok, "message": message})
            released, _, held = verify_released(p["gpu_backend"], p["sim_dir"], targeted,
                                                baseline, 10)
    except (GpuQueryTimeout, GpuUnavailable) as exc:
        released, held = False, [{"error": str(exc)}]
    result.update(released=released, held=held, seconds_to_free=time.monotonic() - decided)
    if report["remaining"] or not released:
        result["reboot_needed"] = True
        with open(p["reboot_mark"], "w") as f:
            json.dump({"marked_at": time.time(), "deployment": p["marker"],
                       "reason": "GPU memory still held after the deployment was killed"
                       if not released else "processes survived SIGKILL (D state?)",
                       "held": held, "survivors": report["remaining"]}, f, indent=2)
    module.exit_json(**result)


def _unmarked(members, extra):
    """Stopped processes without the deployment's marker: members by session or unit, and
    the aggressive sweep's targets, each with its command line and why."""
    out = []
    for m in members:
        if not m.get("carries_marker"):
            out.append(_brief(dict(m, why="member by %s" % m.get("member_by"))))
    out += [_brief(e) for e in extra]
    return out


if __name__ == "__main__":
    main()
