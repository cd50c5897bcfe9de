#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_router_member
short_description: Put an SGLang server in an SGLang router, take it out, or read its view
description:
  - Talks to the worker API of SGLang's router (C(sglang-router), the SGLang Model Gateway),
    C(GET /workers), C(POST /workers) and C(DELETE /workers/{id}). Additions and removals are
    jobs the router queues, so every change is followed by polling the worker list until it
    shows the result.
  - I(state=present) adds the worker when the router does not list it and waits until the
    router lists it healthy. The fleet calls it only for a server the gate judged C(ready).
    Before adding it, the server's own C(/server_info) must say the C(disaggregation_mode)
    that I(worker_type) means (C(null) for a regular server); otherwise it is not added and
    the module fails saying both. A prefill or decode server is added with its
    C(worker_type) (and a prefill with its C(bootstrap_port)), for a router in PD mode; one
    the router lists with another type is taken out and added again.
  - I(state=absent) removes the worker, waits until the router no longer lists it, and with
    I(drain=true) waits until the requests still running on the worker finish (two zero
    readings in a row of the worker's C(sglang:num_running_reqs) plus C(sglang:num_queue_reqs),
    and of the router's C(smg_worker_requests_active) for it, whichever answer), at most
    I(drain_timeout) seconds; hitting the bound is reported.
  - I(state=query) changes nothing and returns the router's view (registered, healthy, load)
    and, given the gate's I(verdict), any disagreement between the two as a finding.
  - Runs on the router host (delegate to it); the worker's metrics are read from there too.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.router_spec
  - sglang.fleet.sglang_fleet.attributes
options:
  router_url:
    description: Base URL of the router's API, as the router host reaches it (with
      I(from_spec), the RouterSpec's C(admin_url); I(from_spec) also gives
      I(router_metrics_url), I(join_timeout), I(drain_timeout) and I(drain_poll_interval)).
    type: str
    required: true
  key_from_host:
    description: With I(from_spec), give I(admin_key_file) the router's env file (a stop,
      whose inventory keys may be refused). Controller side only, never sent as an option.
    type: bool
    default: false
  admin_key:
    description: An admin key of the router's control plane (C(--control-plane-api-keys)); empty
      when the router runs without one.
    type: str
    default: ""
  admin_key_file:
    description: The router's env file on its host. When I(admin_key) is empty, the admin key
      the router was started with is read from it (a stop whose inventory key is unset or
      refused still leaves the router); when it holds none, the call goes without a key.
    type: path
  router_name:
    description: The router's inventory name, for the messages (its URL when empty).
    type: str
    default: ""
  worker_url:
    description: URL the router reaches the server at.
    type: str
    required: true
  worker_api_key:
    description: The server's own API key (SGLang's C(--api-key)); the router sends it to the
      worker with every request it forwards.
    type: str
    default: ""
  state:
    description: Desired membership, or C(query) to only read the router's view.
    type: str
    choices: [present, absent, query]
    default: present
  worker_type:
    description: What the server is to the router, from its LaunchSpec; C(prefill) and
      C(decode) are the sides of a PD deployment, behind a router in PD mode.
    type: str
    choices: [regular, prefill, decode]
    default: regular
  bootstrap_port:
    description: With I(worker_type=prefill), the port of the prefill's KV bootstrap server
      (SGLang's C(--disaggregation-bootstrap-port)), which the router tells each decode.
    type: int
  drain:
    description: With I(state=absent), wait for the worker's in-flight requests to finish.
    type: bool
    default: false
  drain_timeout:
    description: Most seconds to wait while draining.
    type: float
    default: 120
  drain_poll_interval:
    description: Seconds between in-flight readings.
    type: float
    default: 1.0
  worker_metrics_url:
    description: The worker's Prometheus endpoint; empty means I(worker_url)/metrics.
    type: str
    default: ""
  router_metrics_url:
    description: The router's Prometheus endpoint, for its per-worker request gauge.
    type: str
    default: ""
  join_timeout:
    description: Seconds to wait for the router to list an added worker healthy.
    type: float
    default: 60
  served_by_other:
    description:
      - With I(state=absent), the process (not of this server's deployment) that its node
        found serving the worker URL's port (sglang_port_owner), else empty. A router lists
        workers by URL only, and a URL served by another deployment (another host's server that
        took the port) is that deployment's worker, and stays (I(action=kept)).
    type: str
    default: ""
  verdict:
    description: The gate's verdict of the server, compared with the router's view.
    type: str
    default: ""
  timeout:
    description: Seconds allowed for each HTTP call.
    type: float
    default: 10
notes:
  - An unreachable router is a failure for I(state=present) (a ready server would serve nothing
    through it) and a warning for I(state=absent) (nothing is routed through a router that is
    down).
"""

EXAMPLES = r"""
- name: Put a ready server in the router
  sglang.fleet.sglang_router_member:
    router_url: http://127.0.0.1:30000
    admin_key: "{{ router_admin_key }}"
    worker_url: http://10.0.0.11:30000
    state: present
  delegate_to: router-1

- name: Put the prefill server of a PD deployment in a router started in PD mode
  sglang.fleet.sglang_router_member:
    router_url: http://127.0.0.1:30000
    worker_url: http://10.0.0.21:30000
    worker_type: prefill
    bootstrap_port: 8998
  delegate_to: router-1

- name: Take it out and wait for its in-flight requests before a restart
  sglang.fleet.sglang_router_member:
    router_url: http://127.0.0.1:30000
    worker_url: http://10.0.0.11:30000
    state: absent
    drain: true
    drain_timeout: 120
    router_metrics_url: http://127.0.0.1:29000/metrics
  delegate_to: router-1

- name: Put a ready server in the router its RouterSpec names, within its join timeout
  sglang.fleet.sglang_router_member:
    from_spec: "{{ sglang_router__spec }}"
    admin_key: "{{ router_admin_key }}"
    worker_url: http://10.0.0.11:30000
    state: present
  delegate_to: router-1

- name: Read the router's view beside the gate's verdict
  sglang.fleet.sglang_router_member:
    router_url: http://127.0.0.1:30000
    worker_url: http://10.0.0.11:30000
    state: query
    verdict: ready
  delegate_to: router-1
"""

RETURN = r"""
before:
  description: The router's view of the worker before the call.
  returned: when the router answered
  type: dict
  sample: {registered: true, healthy: true, load: 3, id: 2f3a0c3e-3a7b-4c3f-8c70-1b7d4c3a6e1f}
after:
  description: The router's view after the call.
  returned: when the router answered
  type: dict
  sample: {registered: false, healthy: null, load: null, id: null}
action:
  description: What was done, one of none, added, removed; C(kept) when the router lists the
    URL but another deployment serves it (I(served_by_other)).
  returned: always
  type: str
  sample: removed
at:
  description: Epoch seconds when the router was seen to have applied the change.
  returned: when something changed
  type: float
drain:
  description: Seconds waited, in-flight at start and left, whether the timeout was hit, the
    sources read, and a note when it matters.
  returned: when drain was requested and the worker was removed
  type: dict
  sample: {seconds: 1.6, inflight_at_start: 3, inflight_left: 0, timed_out: false,
           sources: [worker /metrics], readings: 5}
finding:
  description: A disagreement between the gate's verdict and the router's view, else null.
  returned: always
  type: str
before_text:
  description: The router's view before the call in one line, e.g. "registered, healthy, load 0".
  returned: when the router answered
  type: str
view_text:
  description: The router's view after the call in one line.
  returned: always
  type: str
kept_because:
  description: With I(action=kept), who serves the URL instead of this server.
  returned: when kept
  type: str
router_reachable:
  description: Whether the router answered.
  returned: always
  type: bool
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.router.api import (
    Router,
    RouterError,
    RouterUnreachable,
    describe_view,
    drain,
    finding,
    mode_refusal,
    normalize,
    read_inflight,
    recorded_admin_key,
    server_mode,
    view_of,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            router_url=dict(type="str", required=True),
            admin_key=dict(type="str", default="", no_log=True),
            admin_key_file=dict(type="path"),
            router_name=dict(type="str", default=""),
            worker_url=dict(type="str", required=True),
            worker_api_key=dict(type="str", default="", no_log=True),
            state=dict(type="str", default="present", choices=["present", "absent", "query"]),
            worker_type=dict(type="str", default="regular",
                             choices=["regular", "prefill", "decode"]),
            bootstrap_port=dict(type="int"),
            drain=dict(type="bool", default=False),
            drain_timeout=dict(type="float", default=120),
            drain_poll_interval=dict(type="float", default=1.0),
            worker_metrics_url=dict(type="str", default=""),
            router_metrics_url=dict(type="str", default=""),
            join_timeout=dict(type="float", default=60),
            served_by_other=dict(type="str", default=""),
            verdict=dict(type="str", default=""),
            timeout=dict(type="float", default=10),
        ),
        supports_check_mode=True,
    )
    p = module.params
    key = p["admin_key"] or (recorded_admin_key(p["admin_key_file"]) if p["admin_key_file"]
                             else "")
    if key and key != p["admin_key"]:
        module.no_log_values.add(key)
    router = Router(p["router_url"], key, p["timeout"])
    worker = normalize(p["worker_url"])
    result = dict(changed=False, action="none", finding=None, router_reachable=True)
    try:
        before = view_of(router.find(worker))
    except RouterUnreachable as exc:
        result.update(router_reachable=False, view_text="router unreachable")
        if p["state"] == "present":
            module.fail_json(msg="router %s is unreachable (%s): %s is ready but serves nothing "
                                 "through it. Fix: start it with ansible-playbook deploy.yml "
                                 "--limit %s (it adds back every ready server)"
                                 % (p["router_name"] or p["router_url"], exc, worker,
                                    p["router_name"] or "<the router's host>"), **result)
        if p["state"] == "absent":
            module.warn("router %s is unreachable: nothing is routed to %s through it"
                        % (p["router_url"], worker))
        if p["verdict"]:
            result["finding"] = "the router at %s does not answer" % p["router_url"]
        module.exit_json(**result)
    except RouterError as exc:
        module.fail_json(msg=str(exc), **result)
    result.update(before=before, after=before, before_text=describe_view(before))

    try:
        if p["state"] == "present" and before["registered"] and \
                before["worker_type"] != p["worker_type"]:
            # Listed as another side (or as a regular worker): its requests would go wrong.
            _leave(module, router, worker, before, result)
            _join(module, router, worker, result)
        elif p["state"] == "present" and not before["registered"]:
            _join(module, router, worker, result)
        elif p["state"] == "absent" and before["registered"] and p["served_by_other"]:
            # Listed by URL, but not this server: removing it would take another host's
            # healthy server out of the router.
            result.update(action="kept", kept_because="another deployment serves that URL "
                                                      "(%s)" % p["served_by_other"])
        elif p["state"] == "absent" and before["registered"]:
            _leave(module, router, worker, before, result)
    except RouterUnreachable as exc:
        # The router went down while this server's membership changed (killed mid-roll).
        name = p["router_name"] or "at " + p["router_url"]
        module.fail_json(
            msg="router %s stopped answering while %s %s it (%s): no client reaches the fleet "
                "through it. Fix: start it again with ansible-playbook deploy.yml --limit %s "
                "(it adds back every ready server), then re-run this deploy"
                % (name, worker, "joined" if p["state"] == "present" else "left", exc,
                   p["router_name"] or "<the router's host>"), **result)
    except RouterError as exc:
        module.fail_json(msg=str(exc), **result)
    if p["verdict"]:
        # What the operator would have seen: the router's view when the gate observed.
        result["finding"] = finding(p["verdict"], before)
    result["view_text"] = describe_view(result["after"])
    module.exit_json(**result)


def _join(module, router, worker, result):
    p = module.params
    result.update(changed=True, action="added")
    if module.check_mode:
        return
    refusal = mode_refusal(worker, server_mode(worker, p["worker_api_key"] or None,
                                               p["timeout"]), p["worker_type"])
    if refusal:
        module.fail_json(msg=refusal, **result)
    router.add(worker, p["worker_api_key"], p["worker_type"], p["bootstrap_port"])
    entry = router.wait_for(worker, present=True, healthy=True, timeout=p["join_timeout"])
    result["after"] = view_of(entry)
    result["at"] = time.time()
    if entry is None or not entry.get("is_healthy"):
        module.fail_json(
            msg="the router at %s did not list %s as healthy within %ss (%s). Fix: check that "
                "the router host reaches the server at that URL (sglang_router_worker_url) and "
                "its key; the router's log says why"
                % (p["router_url"], worker, p["join_timeout"], describe_view(result["after"])),
            **result)


def _leave(module, router, worker, before, result):
    p = module.params
    result.update(changed=True, action="removed")
    if module.check_mode:
        return
    router.remove(before["id"])
    entry = router.wait_for(worker, present=False, timeout=max(p["timeout"], 30))
    if entry is not None:
        module.fail_json(msg="the router at %s still lists %s 30 s after its removal"
                             % (p["router_url"], worker), **result)
    result["after"] = view_of(None)
    result["at"] = time.time()
    if p["drain"]:
        metrics = p["worker_metrics_url"] or worker + "/metrics"
        result["drain"] = drain(
            lambda: read_inflight(metrics, p["router_metrics_url"], worker,
                                  timeout=min(p["timeout"], 5)),
            p["drain_timeout"], p["drain_poll_interval"])
        if result["drain"].get("timed_out") or result["drain"].get("inflight_left") is None:
            module.warn("%s: %s" % (worker, result["drain"].get("note")))


if __name__ == "__main__":
    main()
