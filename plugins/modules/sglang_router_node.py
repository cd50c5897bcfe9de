#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_router_node
short_description: Bring SGLang's router on its host to the rendered one, in one pass
description:
  - One module run for the router's host, where separate stock tasks would take one each, so
    that a re-run with nothing to change costs one module run.
  - With I(router.install.mode=pip), first reads the router's virtualenv for the pinned
    release (its dist-info folders, without starting pip). When it is missing, returns
    I(install_needed) and does nothing else, for the role's install step to install it and
    call this module again with I(after_install).
  - With I(router.install.mode=existing), refuses a router Python that does not exist.
  - Lets the installed router's own parser (the one behind C(sglang-router launch)) read the
    rendered command (secrets masked) when the files changed or the installed router did
    since it last accepted that command (a record beside the service's state file), and
    refuses it, naming the variable behind the refused option and the fix, before anything is
    written. In check mode a router not installed yet is not asked.
  - Writes the folders, launch script, env file (mode 0600) and unit that differ, with the
    deployment file writer the servers' files have (atomically, with their modes; with
    C(--diff) a diff per file, the env file's secrets shown only as fingerprints).
  - Starts a router that is not running, and restarts one that runs from other files, through
    the service the servers have (systemd or the supervisor), with the same checks before a
    start; then waits until the router answers on C(/liveness), and reads its workers, so that
    a server already in it and unchanged since need not be asked to join again.
  - A router that runs unchanged is also asked the report's one request (when it lists a
    healthy worker; a request not answered within 5 s is left to the report), so that the
    report of a run that changes nothing in front of the router needs no module run of its
    own.
version_added: "0.2.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.router_spec
  - sglang.fleet.sglang_fleet.attributes
options:
  secret_values:
    description: With I(from_spec), the values of the router's secret settings by variable
      (C(sglang_router_api_key), C(sglang_router_control_plane_api_keys)); its env file is
      rendered with them on the controller. Controller side only, never sent as an option.
    type: dict
  host_name:
    description: Inventory name of the router host, for messages (with I(from_spec), the
      RouterSpec's host).
    type: str
    required: true
  router:
    description:
      - The router as its host is given it, built on the controller from the RouterSpec
        (with I(from_spec), its view C(sglang_fleet.router.views.node_view)).
    type: dict
    required: true
    suboptions:
      marker:
        description: The router's deployment marker (C(host:sglang-router-PORT)).
        type: str
        required: true
      config_hash:
        description: The RouterSpec's configuration hash.
        type: str
        required: true
      version:
        description: The pinned sglang-router release, for messages.
        type: str
        required: true
      folders:
        description: The router's folders, as M(sglang.fleet.sglang_deployment_files) takes
          its I(folders) (I(path), I(mode)).
        type: list
        elements: dict
        default: []
      files:
        description: The launch script and, with systemd, the unit, as
          M(sglang.fleet.sglang_deployment_files) takes its I(files) (I(path), I(content),
          I(mode), I(owner), I(group)).
        type: list
        elements: dict
        default: []
      secret_files:
        description: The env file, as M(sglang.fleet.sglang_deployment_files) takes its
          I(secret_files); its content (the router's keys) is never logged or shown.
        type: list
        elements: dict
        default: []
      service:
        description: The router's service.
        type: dict
        required: true
        suboptions:
          manager:
            description: The service manager.
            type: str
            required: true
            choices: [systemd, supervisor]
          unit_name:
            description: The systemd unit.
            type: str
          state_file:
            description: The service's record of what runs.
            type: path
            required: true
          script:
            description: The launch script.
            type: path
          log_file:
            description: The router's log.
            type: path
          workdir:
            description: Working folder of the supervised router.
            type: path
            default: /
          user:
            description: The service user.
            type: str
            default: root
          stop_timeout:
            description: Seconds a stop waits before SIGKILL.
            type: int
            default: 60
      install:
        description: How the router is installed.
        type: dict
        required: true
        suboptions:
          mode:
            description: C(pip) (its own virtualenv) or C(existing) (an environment as it is).
            type: str
            required: true
            choices: [pip, existing]
          python:
            description: The configured Python (sglang_router_python), for messages.
            type: path
          router_python:
            description: The Python the router runs with.
            type: path
            required: true
          venv:
            description: The router's virtualenv (pip).
            type: path
          requirements:
            description: The pinned requirements (C(name==version)) the virtualenv must hold.
            type: list
            elements: str
            default: []
      args:
        description: The router's command line after C(launch), secrets masked.
        type: list
        elements: str
        default: []
      args_parser:
        description: The installed router's parser (module:function).
        type: str
        default: sglang_router.launch_router:parse_router_args
      argcheck_record:
        description: Record file of the last command the installed router accepted.
        type: path
      liveness_url:
        description: The router's C(/liveness), polled after a start and asked once on a
          re-run.
        type: str
        required: true
      url:
        description: The URL clients use (the router's line names it).
        type: str
      admin_url:
        description: The router's URL as its host reaches it; its workers are read there once
          it answers.
        type: str
      admin_key:
        description: The control-plane key with the admin role the workers are read with, if
          the router has any.
        type: str
      api_key:
        description: The client key of the report's request (C(sglang_router_api_key)), if the
          router has one.
        type: str
      policy:
        description: The router's load-balancing policy, for the report's line.
        type: str
        default: ""
      flag_variables:
        description: Each router option the role sets and its sglang_router_* variable, to
          name the variable behind a refused option.
        type: dict
        default: {}
      running_spec_file:
        description: Where each start keeps what it started with (the configuration, its
          keys' env file variables and fingerprints, never their values).
        type: path
      secrets:
        description:
          - The keys this start has, by env file variable name (never their values). A key
            the router last started with (I(running_spec_file)) that is missing now is
            refused before anything changes, unless listed in I(drops), since a key that
            resolved to nothing would restart the router open.
        type: dict
        suboptions:
          names:
            description: The env file variables of the keys this start has.
            type: list
            elements: str
            default: []
          variables:
            description: Each key's env file variable (C(NAME_*) for one per list item) and
              inventory variable, as pairs.
            type: list
            elements: list
            default: []
          drops:
            description: Env file variables this start may leave out on purpose.
            type: list
            elements: str
            default: []
          fingerprints:
            description: Each key's fingerprint, by env file variable, kept with the start.
            type: dict
            default: {}
  after_install:
    description: The role's install step ran just before; go on even when the pinned release
      is not installed (in check mode, where the install step only said it would install).
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait for the router to answer after a start (and on a re-run).
    type: float
    default: 60
attributes:
  check_mode:
    support: full
    details: Reports what would be written and started; the installed router still parses a
      changed command.
  diff_mode:
    support: full
    details: A diff per folder and file it would write; the env file's secrets as
      fingerprints.
"""

EXAMPLES = r"""
- name: Write, check and start the router, in one pass
  sglang.fleet.sglang_router_node:
    from_spec: "{{ sglang_router__spec }}"
    secret_values:
      sglang_router_api_key: "{{ sglang_router_api_key }}"
      sglang_router_control_plane_api_keys: "{{ sglang_router_control_plane_api_keys }}"
  register: sglang_router__node
"""

RETURN = r"""
msg:
  description: The router's line (running, started or restarted, where, which release and
    configuration, its pid).
  returned: when the router was checked and answers (not in check mode)
  type: str
install_needed:
  description: Whether the pinned release is missing from the router's virtualenv (pip).
  returned: always
  type: bool
files_changed:
  description: The folders and files written (in check mode, to be written).
  returned: unless the install is needed first
  type: list
  elements: str
args_parsed:
  description: C(accepted) (the installed router parsed the command in this run), C(before)
    (it had accepted this command, and is unchanged since) or C(skipped) (check mode, router
    not installed yet).
  returned: unless the install is needed first
  type: str
  sample: before
action:
  description: C(none), C(started) or C(restarted) (in check mode, what would be done).
  returned: always
  type: str
pid:
  description: The router's main process.
  returned: unless the install is needed first
  type: int
config_hash:
  description: The configuration the router runs (the rendered one after a start).
  returned: unless the install is needed first
  type: str
workers:
  description: The workers the router lists once it answers (I(url), I(healthy)), or null
    when they could not be read; a server already in it and unchanged since is not asked to
    join again.
  returned: when not in check mode and the install was not needed first
  type: list
  elements: dict
  sample: [{url: "http://10.0.0.11:30000", healthy: true}]
report:
  description: The router report's line (where it serves, its workers, the request answered
    through it), when the router ran unchanged and answered the request.
  returned: when the router ran unchanged and answered one request
  type: str
gate:
  description: The router's verdict from that visit (as sglang_router_probe returns it).
  returned: with report
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing
from ansible_collections.sglang.fleet.plugins.module_utils.router.host import (
    ROUTER_OPTIONS,
    RouterRefused,
    converge,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host_name=dict(type="str", required=True),
            router=dict(type="dict", required=True, options=ROUTER_OPTIONS),
            after_install=dict(type="bool", default=False),
            wait_timeout=dict(type="float", default=60),
        ),
        supports_check_mode=True,
    )
    host = "host %s" % module.params["host_name"]
    with failing(module, (OSError, IOError), host + ": the router's host failed"), \
            failing(module, RouterRefused, host):
        result = converge(module.params, module.check_mode, module.warn, module._diff)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
