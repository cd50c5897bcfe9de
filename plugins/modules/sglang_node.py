#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_node
short_description: Check a node for one deployment, in one pass, before anything changes
description:
  - One module run for everything a deploy must know about a node before it changes anything,
    where separate stock tasks would take one run each.
  - Refuses the node, naming the fix, when the server's Python is missing, recovery left a
    reboot mark, the GPUs (NVML, queried by the server's environment, or the simulated ledger)
    do not match the inventory, or a simulated model path lies outside the simulated node.
  - Provisions a simulated node's GPUs and stand-in model, and removes shared-memory segments
    the deployment's last run leaked (only when none of its processes runs).
  - Reports the service's state, whether the launch files on disk are the rendered ones
    (digest and modes), and whether the installed SGLang already parsed this exact command
    line (the record C(sglang_argcheck) leaves), so that the deploy can skip what has nothing
    to do.
  - When that command line was not parsed yet (and not in check mode), the installed SGLang
    parses it here, beside the GPU query, and the record is written on success; a rejection is
    reported as I(args_parsed=rejected), for C(sglang_argcheck) to explain.
  - When something is to change and I(lock) is given (not in check mode), takes the
    deployment's lock last, once nothing can refuse the node, if it is free or this run holds
    it already; a lock another run holds is reported, not failed, for C(sglang_lock) to take
    over or refuse.
  - With I(write), once it holds that lock and the installed SGLang accepts the arguments, it
    writes the launch files that differ, as M(sglang_deployment_files) does (atomically, with
    their modes and owners, a diff per file with C(--diff), a file holding secrets never
    shown), so that a deploy starts its server one module run sooner. Anything in the way is
    reported as I(files_error) and left to M(sglang_deployment_files), which fails with it.
  - With I(start), once the launch files are the rendered ones, a server that is not running
    and has no process left to stop is started here as M(sglang_service) starts it, with the
    same checks before the start (free space, the ports, the model), its GPU baseline (from
    this check's GPU query) and the warning about another user's processes that carry the
    marker. Blockers are reported as I(start_blockers), a failed start as I(start_error); both
    are left to M(sglang_service), which fails with them. A running server is never stopped
    here.
version_added: "0.2.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  from_spec:
    description:
      - The sglang_server role's LaunchSpec (C(sglang_server_launch_spec)). On the controller,
        every option that follows from it alone (the host, interpreter, reboot mark, GPUs,
        simulated node, running spec, settings, secret names, model, shm folder, service,
        argument check) is filled from it where the task does not give it; options given
        beside it win (an explicit null stays null). I(files), I(gate), I(lock), I(write) and
        I(start) depend on the run and stay the task's. Never sent to the node.
    type: dict
  host_name:
    description: Inventory name of the host, for messages.
    type: str
    required: true
  router:
    description:
      - A router host's check instead, in the same task as the servers' (deploy.yml's servers'
        play checks its routers there, in one task wave with the servers' nodes). It is the
        router as its host is given it, built by the filter
        C(sglang.fleet.sglang_fleet_router_host_view); the action plugin runs
        M(sglang.fleet.sglang_router_node) with it and returns that module's result, which it
        also sets as the host's fact C(sglang_router__node), the name the router role reads its
        check by. Given with I(from_spec) (a host that routes and serves), the router is
        checked first (its result only as that fact), then the server, whose result the task
        returns. Never sent to the node as an option.
    type: dict
  server_python:
    description: Python of the server's environment.
    type: path
  reboot_mark:
    description: File recovery writes when GPU memory stayed held; its presence refuses the node.
    type: path
  gpu_backend:
    description: Where GPU facts come from.
    type: str
    choices: [nvml, simulated]
    default: nvml
  sim_dir:
    description: Simulated GPU folder.
    type: path
  gpu_count:
    description: GPUs the inventory says the node has.
    type: int
    required: true
  compute_capability:
    description: Their compute capability, "major.minor".
    type: str
    required: true
  gpu_timeout:
    description: Seconds allowed for the GPU query.
    type: float
    default: 10
  sim:
    description: The simulated node to provision, as the LaunchSpec's C(sim) section describes
      it (GPUs, stand-in model, the folder the model path must be inside), with model_dir,
      family and shm_dir; unset on real nodes.
    type: dict
  running_spec_file:
    description: The LaunchSpec the deployment last started from (the service keeps it).
    type: path
  settings:
    description: >-
      The new LaunchSpec's public settings. When the launch files change, the summary names
      each setting that differs from the running LaunchSpec's, old and new.
    type: dict
    default: {}
  secrets:
    description:
      - The secrets this start will have, by env file variable name (never their values).
        One the deployment last started with (I(running_spec_file)) that is missing now is
        refused, unless listed in I(drops), since a key that resolved to nothing would restart
        the server without it.
    type: dict
    suboptions:
      names:
        description: The env file variables of the secrets this start has.
        type: list
        elements: str
        default: []
      variables:
        description: Each secret's env file variable and inventory variable, as pairs.
        type: list
        elements: list
        default: []
      drops:
        description: Env file variables this start may leave out on purpose.
        type: list
        elements: str
        default: []
  model:
    description:
      - The model and the layout it must support, checked against the node's own copy before
        anything changes; a model path that is not a folder here (a hub id) is not read.
      - Its C(config.json) decides whether the attention heads divide by the attention TP,
        the key/value heads fit TP, the experts divide by EP and the layers cover PP; the
        checkpoint's size (its safetensors index, or its weight files) against the GPUs'
        memory, as NVML reports it, decides whether the weights fit.
    type: dict
    suboptions:
      path:
        description: The model path of the server.
        type: str
        required: true
      layout:
        description: C(tp), C(pp), C(ep) and C(attn_dp), as the LaunchSpec resolved them.
        type: dict
        required: true
      mem_fraction_static:
        description: The server's C(--mem-fraction-static), or null for SGLang's default.
        type: float
  shm_dir:
    description: Shared-memory folder of the server.
    type: path
    default: /dev/shm
  service:
    description: The deployment's service (manager, unit_name, state_file, marker, user,
      node_rank, script, log_file, workdir).
    type: dict
    required: true
  previous_roots:
    description: Roots this inventory host's servers ran from before (the controller's
      ledger). A server of the host still running under one of them (left by a change of
      root, and of port or name) refuses the check, naming the command that stops it.
    type: list
    elements: path
    default: []
  files:
    description: The launch files (path, mode), in the order of the service's digest.
    type: list
    elements: dict
    default: []
  folders:
    description: The deployment's folders (path, mode).
    type: list
    elements: dict
    default: []
  expected_digest:
    description: Digest of the rendered launch files (the controller's, computed as the
      service computes it from the files on disk).
    type: str
  argcheck_record:
    description: Record file of the last successful argument check.
    type: path
  args_parser:
    description: The parser (module:function) the argument check uses.
    type: str
    default: sglang.srt.server_args:prepare_server_args
  args:
    description: The server arguments the argument check parses.
    type: list
    elements: str
    default: []
  gate:
    description:
      - The options of M(sglang_health) for this deployment. When given, and the service runs
        unchanged from the rendered files whose command line the installed SGLang already
        parsed, the gate's first observation is taken in this module run, beside the GPU
        query, and returned as I(gate); a deploy with nothing to change then needs no other
        module run on the node.
      - Never observed in check mode.
    type: dict
  lock:
    description:
      - The deployment's lock, as M(sglang_lock) takes it - I(path), I(name), I(purpose),
        I(lease) - plus I(run), the ansible-playbook run that takes it, which this module's action
        plugin fills in on the controller.
    type: dict
  write:
    description:
      - The launch files to write when something is to change, never in check mode (where
        M(sglang_deployment_files) shows the change). I(files) and I(secret_files) are each a
        list of I(path), I(content), I(mode), I(owner), I(group) as M(sglang_deployment_files)
        takes them; a secret file's content is never logged or shown. The folders are
        I(folders).
    type: dict
    suboptions:
      files:
        description: Files written as they are.
        type: list
        elements: dict
        default: []
      secret_files:
        description: Files whose content holds secrets (the env file).
        type: list
        elements: dict
        default: []
  start:
    description:
      - What a start needs besides I(service), as M(sglang_service) takes the options of the
        same names; never used in check mode, where M(sglang_service) shows the start.
    type: dict
    suboptions:
      config_files:
        description: The launch files whose digest the start records.
        type: list
        elements: path
        default: []
      config_hash:
        description: The LaunchSpec's configuration hash.
        type: str
      launch_spec:
        description: The LaunchSpec started, copied to I(running_spec_file).
        type: dict
      running_spec_file:
        description: The node's record of the configuration running (mode 0600).
        type: path
      baseline_file:
        description: Where the GPUs' memory before the start is recorded.
        type: path
      min_free_mb:
        description: Free space the log, run and shm folders must have.
        type: int
        default: 64
      host:
        description: Address the server binds.
        type: str
        default: 127.0.0.1
      port:
        description: The server's HTTP port, which must be free.
        type: int
      bootstrap_port:
        description: A prefill server's KV bootstrap port, which must be free as well.
        type: int
      group_markers:
        description: Markers of the other nodes of its multi-node server, which may hold the
          port on a shared machine.
        type: list
        elements: str
        default: []
      model_path:
        description: Model folder, which must hold C(config.json).
        type: str
attributes:
  diff_mode:
    support: partial
    details: A diff per file it writes (see I(write)).
"""

EXAMPLES = r"""
- name: Check the node for the LaunchSpec the sglang_server role built
  sglang.fleet.sglang_node:
    from_spec: "{{ sglang_server_launch_spec }}"
    gate: "{{ sglang_server_launch_spec | sglang.fleet.sglang_fleet_gate_args }}"
  register: node

- name: Check the node before deploying
  sglang.fleet.sglang_node:
    host_name: gpu-node-01
    server_python: /opt/sglang-fleet/venv/bin/python
    reboot_mark: /opt/sglang-fleet/NEEDS_REBOOT
    gpu_count: 8
    compute_capability: "12.0"
    service:
      manager: systemd
      unit_name: sglang-Kimi-K2.5-30000.service
      state_file: /opt/sglang-fleet/run/Kimi-K2.5-30000.pid
      marker: gpu-node-01:Kimi-K2.5-30000
      user: root
      node_rank: 0
"""

RETURN = r"""
gpus:
  description: GPU count and compute capabilities found.
  returned: when the GPUs were read
  type: dict
  sample: {count: 8, compute_capabilities: ["12.0"]}
service:
  description: The service now (running, pid, digest and config_hash it was started with).
  returned: always
  type: dict
files_current:
  description: Whether the launch files on disk are the rendered ones, modes included.
  returned: always
  type: bool
files_reason:
  description: Why the files are, or are not, current.
  returned: always
  type: str
service_current:
  description: Whether the service runs from exactly the rendered files.
  returned: always
  type: bool
argcheck_current:
  description: Whether the installed SGLang parsed this command line (same arguments, same
    parser code), before or in this run.
  returned: always
  type: bool
args_parsed:
  description: C(accepted) or C(rejected), when the installed SGLang parsed the arguments in
    this run.
  returned: when the arguments were parsed here
  type: str
  sample: accepted
lock:
  description: The lock taken (I(outcome) C(acquired) or C(reentered), and the I(lock)
    record), or I(outcome=held) and I(held_by) when another run holds it.
  returned: when I(lock) was given and something is to change
  type: dict
  sample: {outcome: acquired, lock: {owner: "deploy of gpu-node-01:Kimi-K2.5-30000",
           purpose: deploy}}
files_written:
  description: The folders and files written (see I(write)); empty when they were the
    rendered ones already.
  returned: when the files were written here
  type: list
  elements: str
files_error:
  description: Why the files could not be written here (M(sglang_deployment_files) then
    tries and fails with it).
  returned: when writing them failed
  type: str
started:
  description: The start of a server that was not running (see I(start)), as
    M(sglang_service) returns it.
  returned: when the server was started here
  type: dict
  sample: {action: started, pid: 48213, config_hash: 3f9a1c0d2b7e, changed: true}
start_blockers:
  description: What would make the start fail (M(sglang_service) then fails naming each).
  returned: when the start was not tried for them
  type: list
  elements: str
start_error:
  description: Why the start failed (M(sglang_service) then tries and fails with it).
  returned: when starting failed
  type: str
provisioned:
  description: Simulated node files written (or, in check mode, to be written).
  returned: on simulated nodes
  type: list
  elements: str
shm_removed:
  description: Leaked shared-memory segments removed.
  returned: when the service was not running
  type: list
  elements: str
gate:
  description: The gate's verdict, exactly as M(sglang_health) returns it (verdict, phase,
    headline, evidence, run_id and the rest), the observation kept for the gate's next call.
  returned: when I(gate) was given and nothing is to change
  type: dict
  sample: {verdict: ready, phase: serving, headline: "ready: /health answered 200"}
summary:
  description: One line saying what the deploy will do on the node and why (the sglang_fleet
    stdout callback prints it).
  returned: always
  type: str
  sample: "unchanged: the server runs from the rendered files (config 871281b7a56d); argument
    check skipped: the installed SGLang parsed this command line before"
"""

from ansible.module_utils.basic import AnsibleModule, _load_params
from ansible_collections.sglang.fleet.plugins.module_utils.common.http import (
    ask_health_early,
)


def main():
    # SGLang's /health answers a ready server a second later at the soonest (it waits for a
    # one-token generation). Asked first, from the options as Ansible handed them over, it is
    # answered while the rest of this module loads and reads the node: the gate's observation
    # uses a 200. Hence also the imports below, made after that request.
    try:
        health = ask_health_early(_load_params())
    except Exception:  # noqa: BLE001 - AnsibleModule below reports unreadable options
        health = None
    from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
    from ansible_collections.sglang.fleet.plugins.module_utils.deploy.deployfiles import (
        FILE_OPTIONS,
        SECRET_FILE_OPTIONS,
    )
    from ansible_collections.sglang.fleet.plugins.module_utils.deploy.nodecheck import (
        NodeRefused,
        check_node,
    )
    from ansible_collections.sglang.fleet.plugins.module_utils.health.gate import (
        GATE_ARGS,
        GATE_REQUIRED_IF,
    )
    from ansible_collections.sglang.fleet.plugins.module_utils.process.service import (
        START_OPTIONS,
    )

    module = AnsibleModule(
        argument_spec=dict(
            host_name=dict(type="str", required=True),
            server_python=dict(type="path"),
            reboot_mark=dict(type="path"),
            gpu_backend=dict(type="str", default="nvml", choices=["nvml", "simulated"]),
            sim_dir=dict(type="path"),
            gpu_count=dict(type="int", required=True),
            compute_capability=dict(type="str", required=True),
            gpu_timeout=dict(type="float", default=10),
            sim=dict(type="dict"),
            running_spec_file=dict(type="path"),
            settings=dict(type="dict", default={}),
            secrets=dict(type="dict", options=dict(
                names=dict(type="list", elements="str", default=[], no_log=False),
                variables=dict(type="list", elements="list", default=[], no_log=False),
                drops=dict(type="list", elements="str", default=[], no_log=False),
            )),
            model=dict(type="dict", options=dict(
                path=dict(type="str", required=True),
                layout=dict(type="dict", required=True),
                mem_fraction_static=dict(type="float"),
            )),
            shm_dir=dict(type="path", default="/dev/shm"),
            service=dict(type="dict", required=True),
            previous_roots=dict(type="list", elements="path", default=[]),
            files=dict(type="list", elements="dict", default=[]),
            folders=dict(type="list", elements="dict", default=[]),
            expected_digest=dict(type="str"),
            argcheck_record=dict(type="path"),
            args_parser=dict(type="str", default="sglang.srt.server_args:prepare_server_args"),
            args=dict(type="list", elements="str", default=[], no_log=False),
            gate=dict(type="dict", options=GATE_ARGS, required_if=GATE_REQUIRED_IF),
            lock=dict(type="dict", options=dict(
                path=dict(type="path", required=True),
                name=dict(type="str", required=True),
                purpose=dict(type="str", default="change"),
                run=dict(type="dict", required=True),
                lease=dict(type="float"),
            )),
            start=dict(type="dict", options=START_OPTIONS),
            write=dict(type="dict", options=dict(
                files=dict(type="list", elements="dict", default=[], options=FILE_OPTIONS),
                secret_files=dict(type="list", elements="dict", default=[],
                                  options=SECRET_FILE_OPTIONS),
            )),
        ),
        required_if=[("gpu_backend", "simulated", ("sim_dir",))],
        supports_check_mode=True,
    )
    host = "host %s" % module.params["host_name"]
    with failing(module, (OSError, IOError), host + ": checking the node failed"), \
            failing(module, NodeRefused, host):
        result = check_node(module.params, module.check_mode, module.warn, module._diff,
                            health)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
