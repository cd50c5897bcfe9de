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
    the simulated fleet). The supervisor runs the launch script in its own session as
    I(service_user).
  - "Records a digest of the files the server was started from. With I(state=started) a running
    server is left alone when the digest matches and restarted when it differs, so a deploy
    restarts exactly the servers whose launch files changed. The digest is internal; the
    configuration's public name is I(config_hash), recorded in the state file and printed in
    the log's run separator C(===== sglang-fleet: start MARKER config HASH at TIME =====)."
  - At each start it copies the LaunchSpec that is started (I(launch_spec)) to
    I(running_spec_file) (mode 0600), the node's record of the configuration actually running.
  - Check before you stop. Before a server is (re)started, and so before a running one is
    stopped for a change, it checks what the new one needs. There must be at least
    I(min_free_mb) free in the log, run and shm folders. The HTTP port (and a prefill's KV
    bootstrap port, I(bootstrap_port)) must be free, or held by the server being replaced (by
    membership) or by another node of the same multi-node server (I(group_markers)). The
    model path must be present with its C(config.json). When any check fails nothing is
    stopped or started and the module fails naming each problem; the old server keeps serving.
    In check mode the problems are warnings.
  - Members are found by membership (marker, the recorded supervisor session, the unit's
    cgroup). A recorded session is trusted only while its leader has the start time and boot
    recorded at start and carries the marker. Members must run as I(service_user). A process
    of another user carrying the deployment's marker is reported in C(foreign) and a warning,
    and never signalled.
  - Stopping ends every member (orphans reparented to PID 1 included) with SIGTERM, a bounded
    wait, then SIGKILL. On a non-zero node rank (I(node_rank)), whose SGLang main process only
    logs SIGTERM, SIGKILL follows as soon as the log shows that, or after 5 s.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  from_spec:
    description:
      - The sglang_server role's LaunchSpec (C(sglang_server_launch_spec)), or for a stop a
        deployment's identity (C(sglang_server_identity)). On the controller, its service view
        (marker, manager, unit, user, node rank, script, log, state file, workdir, stop
        timeout) and, unless I(state=stopped), its start view (the one M(sglang_node)'s
        I(start) takes, with the GPU backend and shm folder) fill every option the task does
        not give; options given beside it win. Never sent to the node.
    type: dict
  group_hosts:
    description: With I(from_spec), the inventory hosts of the server's multi-node group
      (their nodes may hold its port on a shared machine). Controller side only.
    type: list
    elements: str
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
    description: Log file the server's output is appended to; the run separator is written
      here at each start (both managers).
    type: path
  state_file:
    description: JSON file recording the supervisor's session leader (pid, start time, boot
      id), the config hash and the files digest. See the notes for its format.
    type: path
    required: true
  workdir:
    description: Working directory of the server.
    type: path
    default: /
  unit_name:
    description: systemd unit name, required when I(manager=systemd).
    type: str
  service_user:
    description: User the server runs as (the LaunchSpec's C(service.user)). Only processes
      of this user are members; the supervisor starts the script as this user.
    type: str
    default: root
  node_rank:
    description: Node rank of a multi-node server (LaunchSpec C(group.node_rank)); a non-zero
      rank is escalated to SIGKILL quickly on stop.
    type: int
    default: 0
  config_files:
    description: Files whose content defines the running configuration (script, env file, unit).
    type: list
    elements: path
    default: []
  config_hash:
    description: The LaunchSpec's config hash (12 hex digits), recorded in the state file and
      printed in the log's run separator.
    type: str
  launch_spec:
    description: The LaunchSpec being started (no secret values), copied to
      I(running_spec_file) at start.
    type: dict
  running_spec_file:
    description: Where the started LaunchSpec is kept (mode 0600).
    type: path
  stop_timeout:
    description: Seconds to wait after SIGTERM before SIGKILL.
    type: int
    default: 60
  stopped_by:
    description:
      - With I(state=stopped), who stops the server (C(stop.yml)), recorded in the state file
        with the time; the health gate then says C(stopped by stop.yml at TIME) of it instead
        of C(crashed). A server found already stopped gets the record too.
    type: str
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
  shm_dir:
    description: Shared-memory folder of the server, checked for free space before a start.
    type: path
  min_free_mb:
    description: Free space (MiB) the log, run and shm folders need before a start.
    type: int
    default: 64
  host:
    description: Address the server listens on, for the port check.
    type: str
    default: 127.0.0.1
  port:
    description: HTTP port the new server binds, checked before a start (omit to skip).
    type: int
  bootstrap_port:
    description: KV bootstrap port a prefill server binds beside its HTTP port, checked before
      a start like it (omit for a server that is not a prefill).
    type: int
  group_markers:
    description: Markers of the other nodes of a multi-node server; a port they hold on this
      machine does not block a start.
    type: list
    elements: str
    default: []
  model_path:
    description: Model path of the new server; a local path must exist with C(config.json).
    type: str
notes:
  - Finds processes by the marker in C(/proc/PID/environ); reading other users' environments
    needs root or the same user, as the service does.
  - "State file (JSON): C(pid), C(pid_start) (clock ticks after boot, C(/proc/PID/stat) field
    22), C(boot_id): the supervisor's session leader, C(pid) null once stopped; C(config_hash):
    the running LaunchSpec's 12-hex hash; C(digest): the launch files' digest (internal);
    C(started_at), C(stopped_at); C(marker), C(user), C(manager), and C(unit) for systemd.
    C(STATE_FILE.exit) holds the supervisor's exit status; C(STATE_FILE.launch-error) the
    error seen writing the log when the server exited (e.g. No space left on device)."
  - "Running spec (JSON, mode 0600): exactly the LaunchSpec dict of the configuration started
    last (its C(config_hash) equals the state file's)."
"""

EXAMPLES = r"""
- name: Start the server of the LaunchSpec the sglang_server role built
  sglang.fleet.sglang_service:
    from_spec: "{{ sglang_server_launch_spec }}"
    group_hosts: "{{ groups[sglang_server_launch_spec.group.name] | default([]) }}"
    state: started

- name: Start the server, restarting it if its launch files changed
  sglang.fleet.sglang_service:
    marker: "node1:kimi-k2.5-30000"
    manager: supervisor
    script: /opt/sglang-fleet/conf/kimi-k2.5-30000.launch.sh
    log_file: /opt/sglang-fleet/logs/kimi-k2.5-30000.log
    state_file: /opt/sglang-fleet/run/kimi-k2.5-30000.pid
    config_files:
      - /opt/sglang-fleet/conf/kimi-k2.5-30000.launch.sh
      - /opt/sglang-fleet/conf/kimi-k2.5-30000.env
    config_hash: 871281b7a56d
    launch_spec: "{{ sglang_server_launch_spec }}"
    running_spec_file: /opt/sglang-fleet/run/kimi-k2.5-30000.running-spec.json
    port: 30000
    model_path: /models/Kimi-K2.5
    shm_dir: /dev/shm

- name: Stop it and wait for every process of the deployment to exit
  sglang.fleet.sglang_service:
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
  description: Digest of I(config_files) now (internal, for restart decisions).
  returned: always
  type: str
  sample: 3f2a9c0d11b2e4a5
previous_digest:
  description: Digest the running server was started with, if any.
  returned: always
  type: str
config_hash:
  description: Config hash of the configuration running after the call.
  returned: always
  type: str
  sample: 871281b7a56d
previous_config_hash:
  description: Config hash the running server was started with, if recorded.
  returned: always
  type: str
action:
  description: What was done, one of none, started, restarted, stopped.
  returned: always
  type: str
  sample: restarted
start_blockers:
  description: Problems that keep a new server from starting (full disk, port held by
    another program, missing model); the module fails with them, or warns in check mode.
  returned: when a start was due
  type: list
  elements: str
foreign:
  description: Processes that carry the deployment's marker, session or unit but run as
    another user; never signalled.
  returned: always
  type: list
  elements: dict
stop_report:
  description: Signals sent while stopping (pids per signal), why SIGKILL came early
    (C(escalated)), and processes left.
  returned: when something was stopped
  type: dict
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.process.procs import (
    describe_foreign,
)
from ansible_collections.sglang.fleet.plugins.module_utils.process.service import (
    START_OPTIONS,
    ServiceError,
    files_digest,
    record_stop,
    service_of,
)
from ansible_collections.sglang.fleet.plugins.module_utils.process.start import (
    StartRefused,
    StopIncomplete,
    start_server,
    stop_server,
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
            service_user=dict(type="str", default="root"),
            node_rank=dict(type="int", default=0),
            stop_timeout=dict(type="int", default=60),
            stopped_by=dict(type="str"),
            gpu_backend=dict(type="str", default="nvml", choices=["nvml", "simulated"]),
            sim_dir=dict(type="path"),
            shm_dir=dict(type="path"),
            **START_OPTIONS
        ),
        required_if=[
            ("manager", "systemd", ("unit_name",)),
            ("manager", "supervisor", ("script", "log_file")),
        ],
        supports_check_mode=True,
    )
    p = module.params
    config_hash = p["config_hash"] or (p["launch_spec"] or {}).get("config_hash")
    if config_hash is not None and not re.match(r"^[0-9a-f]{12}$", config_hash):
        module.fail_json(msg="config_hash=%r is not a LaunchSpec config hash (12 hex digits)"
                         % config_hash)
    if p["launch_spec"] and p["launch_spec"].get("config_hash") not in (None, config_hash):
        module.fail_json(msg="launch_spec is configuration %s but config_hash says %s"
                         % (p["launch_spec"].get("config_hash"), config_hash))
    with failing(module, ServiceError):
        service = service_of(dict(p, user=p["service_user"]))
        status = service.status()
    digest = files_digest(p["config_files"])
    result = dict(changed=False, pid=status["pid"], digest=digest,
                  previous_digest=status["digest"], config_hash=status["config_hash"],
                  previous_config_hash=status["config_hash"], action="none",
                  foreign=status["foreign"])
    for line in describe_foreign(status["foreign"], p["service_user"]):
        module.warn(line)

    if p["state"] == "stopped":
        _stopped(module, service, status, result)

    needs_restart = p["state"] == "restarted" or (
        status["running"] and status["digest"] != digest)
    if status["running"] and not needs_restart:
        module.exit_json(**result)
    result.update(changed=True, config_hash=config_hash)
    options = dict(p, config_hash=config_hash)
    try:
        result.update(start_server(service, status, options, p["stop_timeout"],
                                   check_mode=module.check_mode, warn=module.warn))
    except StartRefused as exc:
        module.fail_json(msg=str(exc), **dict(result, changed=False, action="none",
                                              start_blockers=exc.blockers))
    except StopIncomplete as exc:
        module.fail_json(msg=str(exc), stop_report=exc.report)
    except (ServiceError, OSError) as exc:
        module.fail_json(msg="could not start %s: %s" % (p["marker"], exc), **result)
    module.exit_json(**result)


def _stopped(module, service, status, result):
    """state=stopped: stop what runs; a server found not running gets the stop recorded."""
    p = module.params
    if status["running"] or status["members"]:
        result.update(changed=True, action="stopped", pid=None)
        if not module.check_mode:
            try:
                result["stop_report"] = stop_server(service, p["stop_timeout"],
                                                    p["stopped_by"])
            except StopIncomplete as exc:
                module.fail_json(msg=str(exc), stop_report=exc.report)
            except ServiceError as exc:
                module.fail_json(msg=str(exc))
    elif p["stopped_by"] and not module.check_mode:
        record_stop(p["state_file"], p["stopped_by"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
