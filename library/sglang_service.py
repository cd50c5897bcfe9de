#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_service
short_description: Start, stop or restart one SGLang server through systemd or the supervisor
description:
  - Manages one deployment's server through one interface over two service managers,
    C(systemd) for real nodes and C(supervisor) for machines without systemd (CI, containers,
    the simulated fleet).
  - Records a digest of the files the server was started from. With I(state=started) a running
    server is left alone when the digest matches and restarted when it differs, so a deploy
    restarts exactly the servers whose launch files changed.
  - Stopping ends every process carrying the deployment marker (orphans reparented to PID 1
    included), with SIGTERM, a bounded wait, then SIGKILL. Nothing else is signalled.
version_added: "0.1.0"
author: sglang-fleet maintainers
options:
  marker:
    description: Deployment marker, the value of C(SGLANG_FLEET_DEPLOYMENT) in every process.
    type: str
    required: true
  state:
    description: Desired state.
    type: str
    choices: [started, stopped, restarted]
    default: started
  manager:
    description: Service manager.
    type: str
    choices: [systemd, supervisor]
    default: supervisor
  script:
    description: Launch script the supervisor runs (systemd runs it from the unit).
    type: path
  log_file:
    description: Log file the supervisor appends the server output to.
    type: path
  state_file:
    description: JSON file recording pid (supervisor) and configuration digest.
    type: path
    required: true
  workdir:
    description: Working directory of the server.
    type: path
    default: /
  unit_name:
    description: systemd unit name, required when I(manager=systemd).
    type: str
  config_files:
    description: Files whose content defines the running configuration (script, env file, unit).
    type: list
    elements: path
    default: []
  stop_timeout:
    description: Seconds to wait after SIGTERM before SIGKILL.
    type: int
    default: 60
  baseline_file:
    description: Before each start, GPU memory per device is recorded here, the baseline
      that recovery verifies the GPUs return to.
    type: path
  gpu_backend:
    description: Where GPU facts for the baseline come from.
    type: str
    choices: [nvml, simulated]
    default: nvml
  sim_dir:
    description: Simulated GPU folder.
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
notes:
  - Finds processes by the marker in C(/proc/PID/environ); reading other users' environments
    needs root or the same user, as the service does.
"""

EXAMPLES = r"""
- name: Start the server, restarting it if its launch files changed
  sglang_service:
    marker: "node1:kimi-k2.5-30000"
    manager: supervisor
    script: /opt/sglang-fleet/conf/kimi-k2.5-30000.launch.sh
    log_file: /opt/sglang-fleet/logs/kimi-k2.5-30000.log
    state_file: /opt/sglang-fleet/run/kimi-k2.5-30000.pid
    config_files:
      - /opt/sglang-fleet/conf/kimi-k2.5-30000.launch.sh
      - /opt/sglang-fleet/conf/kimi-k2.5-30000.env

- name: Stop it and wait for every process of the deployment to exit
  sglang_service:
    marker: "node1:kimi-k2.5-30000"
    manager: systemd
    unit_name: sglang-kimi-k2.5-30000.service
    state_file: /opt/sglang-fleet/run/kimi-k2.5-30000.pid
    state: stopped
    stop_timeout: 30
"""

RETURN = r"""
pid:
  description: Main process id after the call (null when stopped).
  returned: always
  type: int
  sample: 41873
digest:
  description: Digest of I(config_files) now.
  returned: always
  type: str
  sample: 3f2a9c0d11b2e4a5
previous_digest:
  description: Digest the running server was started with, if any.
  returned: always
  type: str
action:
  description: What was done, one of none, started, restarted, stopped.
  returned: always
  type: str
  sample: restarted
stop_report:
  description: Signals sent while stopping (pids per signal) and processes left.
  returned: when something was stopped
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_fleet_files import write_json_atomic
from ansible.module_utils.sglang_fleet_gpu import GpuQueryTimeout, GpuUnavailable, gpu_snapshot
from ansible.module_utils.sglang_fleet_service import (
    ServiceError,
    Supervisor,
    Systemd,
    files_digest,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            marker=dict(type="str", required=True),
            state=dict(type="str", default="started",
                       choices=["started", "stopped", "restarted"]),
            manager=dict(type="str", default="supervisor", choices=["systemd", "supervisor"]),
            script=dict(type="path"),
            log_file=dict(type="path"),
            state_file=dict(type="path", required=True),
            workdir=dict(type="path", default="/"),
            unit_name=dict(type="str"),
            config_files=dict(type="list", elements="path", default=[]),
            stop_timeout=dict(type="int", default=60),
            baseline_file=dict(type="path"),
            gpu_backend=dict(type="str", default="nvml", choices=["nvml", "simulated"]),
            sim_dir=dict(type="path"),
        ),
        required_if=[
            ("manager", "systemd", ("unit_name",)),
            ("manager", "supervisor", ("script", "log_file")),
        ],
        supports_check_mode=True,
    )
    p = module.params
    if p["manager"] == "systemd":
        service = Systemd(p["marker"], p["unit_name"], p["state_file"])
    else:
        service = Supervisor(p["marker"], p["script"], p["log_file"], p["state_file"],
                             p["workdir"])
    digest = files_digest(p["config_files"])
    try:
        status = service.status()
    except ServiceError as exc:
        module.fail_json(msg=str(exc))
    result = dict(changed=False, pid=status["pid"], digest=digest,
                  previous_digest=status["digest"], action="none")

    if p["state"] == "stopped":
        if status["running"] or status["members"]:
            result.update(changed=True, action="stopped", pid=None)
            if not module.check_mode:
                report = _stop(module, service, p["stop_timeout"])
                result["stop_report"] = report
        module.exit_json(**result)

    needs_restart = p["state"] == "restarted" or (
        status["running"] and status["digest"] != digest)
    if status["running"] and not needs_restart:
        module.exit_json(**result)
    result.update(changed=True, action="restarted" if status["running"] else "started")
    if module.check_mode:
        module.exit_json(**result)
    if status["running"] or status["members"]:
        result["stop_report"] = _stop(module, service, p["stop_timeout"])
    if p["baseline_file"]:
        _record_baseline(module, p)
    try:
        result["pid"] = service.start(digest)
    except (ServiceError, OSError) as exc:
        module.fail_json(msg="could not start %s: %s" % (p["marker"], exc), **result)
    module.exit_json(**result)


def _record_baseline(module, p):
    try:
        devices = gpu_snapshot(p["gpu_backend"], p["sim_dir"])
    except (GpuQueryTimeout, GpuUnavailable) as exc:
        module.warn("no GPU baseline recorded: %s" % exc)
        return
    write_json_atomic(p["baseline_file"],
                      dict((str(d["index"]), d["memory_used"]) for d in devices))


def _stop(module, service, timeout):
    try:
        report = service.stop(timeout)
    except ServiceError as exc:
        module.fail_json(msg=str(exc))
    if report["remaining"]:
        module.fail_json(
            msg="processes of the deployment survived SIGKILL (D state?): %s; "
                "run playbooks/recover.yml, or reboot the node"
                % ", ".join("%d(%s)" % (x["pid"], x["state"]) for x in report["remaining"]),
            stop_report=report)
    return report


if __name__ == "__main__":
    main()
