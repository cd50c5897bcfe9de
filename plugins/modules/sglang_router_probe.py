#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_router_probe
short_description: Ask SGLang's router for its workers and one answer, in one module run
description:
  - Reads the router's workers (C(GET /workers), with the control-plane key) and sends one
    short chat request through it (C(POST /v1/chat/completions), with the clients' key), in one
    module run on the router's host.
  - Changes nothing. Without O(report) it never fails on the router's answer and the caller
    decides what an answer other than 200 means; with it, the module words the router's report
    line (C(msg)) and fails on any other answer, naming the fix.
version_added: "0.2.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.router_spec
  - sglang.fleet.sglang_fleet.attributes
options:
  url:
    description: The router's URL as its host reaches it (with I(from_spec), the RouterSpec's
      C(admin_url)).
    type: str
    required: true
  admin_key:
    description: A control-plane key with the admin role (the worker API), if the router has
      any.
    type: str
  api_key:
    description: The clients' key, if the router has one.
    type: str
  timeout:
    description: Seconds the request through the router may take.
    type: float
    default: 60
  report:
    description:
      - The router as its report names it; with it the module returns the report line and
        fails when no request is answered through the router. I(from_spec) gives it, unless
        the task gives I(report=null).
    type: dict
    suboptions:
      name:
        description: The router's inventory name.
        type: str
        required: true
      url:
        description: The URL clients use.
        type: str
        required: true
      version:
        description: The sglang-router release.
        type: str
        required: true
      policy:
        description: The routing policy.
        type: str
        required: true
  judge:
    description:
      - With I(report), return the router's verdict as C(gate) (as a server's gate returns
        one) instead of failing; C(ready) when it lists a healthy worker and answers a request
        through it, C(unhealthy) when it answers but serves nothing, C(absent) when nothing
        answers. C(playbooks/health.yml) fails the router's host on anything but C(ready).
    type: bool
    default: false
  fleet_stopped:
    description:
      - With I(judge), every server of the router's fleet was stopped by an operator with
        C(playbooks/stop.yml), so a router that does not answer is then C(stopped), not
        C(absent).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: It only reads, and sends the one request, in check mode too.
"""

EXAMPLES = r"""
- name: Ask the router for its workers and one answer
  sglang.fleet.sglang_router_probe:
    url: http://127.0.0.1:30000
    admin_key: >-
      {{ sglang_router_control_plane_api_keys | sglang.fleet.sglang_fleet_router_admin_key }}
    api_key: "{{ sglang_router_api_key }}"
  register: sglang_router__probe

- name: Report the router, failing when no request is answered through it
  sglang.fleet.sglang_router_probe:
    url: http://127.0.0.1:30000
    report: {name: router-1, url: "http://10.0.0.5:30000", version: 0.3.2, policy: cache_aware}

- name: Report the router its RouterSpec names, with its verdict instead of failing
  sglang.fleet.sglang_router_probe:
    from_spec: "{{ sglang_router__spec }}"
    admin_key: >-
      {{ sglang_router_control_plane_api_keys | sglang.fleet.sglang_fleet_router_admin_key }}
    api_key: "{{ sglang_router_api_key }}"
    judge: true
"""

RETURN = r"""
workers:
  description: The router's workers as C(GET /workers) lists them (empty when it could not be
    read).
  returned: always
  type: list
  elements: dict
workers_error:
  description: Why the workers could not be read, or null.
  returned: always
  type: str
status:
  description: The HTTP status of the request through the router; null when nothing answered.
  returned: always
  type: int
  sample: 200
answer:
  description: The router's answer (OpenAI chat completion) when the status is 200.
  returned: always
  type: dict
error:
  description: The router's error, or why nothing answered, when the status is not 200.
  returned: always
  type: str
gate:
  description: With I(report), the router's verdict (verdict, reason, headline, progress_text,
    advice, and its worker counts under C(router)).
  returned: with report
  type: dict
  sample: {verdict: ready, headline: "ready: 2 of 2 workers healthy; one request answered through
           it", progress_text: 2 of 2 workers healthy, router: {registered: 2, healthy: 2}}
msg:
  description: The report line (its URL, workers, and the request answered through it).
  returned: with report, when the router answered
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.router.api import (
    ask,
    report_failure,
    report_line,
    router_verdict,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            admin_key=dict(type="str", no_log=True),
            api_key=dict(type="str", no_log=True),
            timeout=dict(type="float", default=60),
            report=dict(type="dict", options=dict(
                name=dict(type="str", required=True), url=dict(type="str", required=True),
                version=dict(type="str", required=True),
                policy=dict(type="str", required=True))),
            judge=dict(type="bool", default=False),
            fleet_stopped=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    seen = ask(p["url"].rstrip("/"), p["admin_key"] or None, p["api_key"] or None,
               p["timeout"])
    if p["report"]:
        # The router's verdict: its row in the run's table says it, as a server's says its own.
        seen["gate"] = router_verdict(p["report"], seen, p["fleet_stopped"])
    if p["report"] and p["judge"]:
        module.exit_json(changed=False, **seen)
    if p["report"] and seen["status"] != 200:
        module.fail_json(msg=report_failure(p["report"], seen), **seen)
    if p["report"]:
        seen["msg"] = report_line(p["report"], seen)
    module.exit_json(changed=False, **seen)


if __name__ == "__main__":
    main()
