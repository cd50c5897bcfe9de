#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: sglang_canary
short_description: Judge a canary SGLang server under live traffic against the baseline servers
description:
  - Runs on the controller through its action plugin (sglang_fleet.rollout). Scrapes SGLang's
    C(/metrics) on the canary and on each baseline server, and each router's Prometheus
    endpoint, at the start and the end of a window of live traffic; all through the window it
    sends a fixed set of greedy probe prompts to every server, one after another.
  - "Signals, in the order they decide: error rate (the router's per-worker failures and the
    probes' 5xx or internal-error aborts), greedy output equivalence (probe answers, canary
    against baseline), abort rate (C(sglang:num_aborted_requests_total) over
    C(sglang:num_requests_total)), generation tokens per second of a request (the inter-token
    latency histogram's count over its sum), p99 time to first token and p99 inter-token
    latency (SGLang's histograms; where both p99s fall in one bucket the means decide)."
  - The verdict is C(failed) when a signal passes its threshold, C(inconclusive) when either
    side got fewer than the minimum live requests (the probe-measured signals still decide),
    and C(passed) otherwise. It never fails the task; the playbook acts on the verdict.
  - The controller must reach the servers' and routers' HTTP ports.
version_added: "1.0.0"
author: sglang-fleet
options:
  canary:
    description: The canary, as C(host), C(url) (where the controller reaches it) and
      C(worker_url) (the URL its routers know it by; defaults to C(url)) and C(release)
      (the SGLang release its LaunchSpec pins; the server's own C(/server_info) version wins
      where it answers). Where the canary's release differs from the baseline's, greedy
      outputs are compared by log-probability distance, else exactly.
    type: dict
    required: true
  baselines:
    description: The servers still on the baseline, each like I(canary).
    type: list
    elements: dict
    required: true
  router_metrics:
    description: Base URLs of the routers' Prometheus endpoints (C(/metrics) is appended).
    type: list
    elements: str
    default: []
  settings:
    description:
      - The sglang_bench_canary_* variables (window, min_requests, probes, probe_tokens and
        the thresholds), by their full names; absent ones take their defaults.
      - A threshold that could never fail, an empty or too large probe set, or a window that
        is not positive is refused, naming the variable.
    type: dict
    default: {}
  api_key:
    description: The servers' API key (sglang_server_api_key), sent as a bearer token.
    type: str
    no_log: true
attributes:
  check_mode:
    support: full
    details: Skipped in check mode (no window is run).
  diff_mode:
    support: none
  action:
    support: full
"""

EXAMPLES = r"""
- name: Judge the canary
  sglang.fleet.sglang_canary:
    canary: {host: node1, url: "http://10.0.0.1:30000"}
    baselines:
      - {host: node2, url: "http://10.0.0.2:30000"}
    router_metrics: ["http://10.0.0.9:29000"]
    settings:
      sglang_bench_canary_window: 300
      sglang_bench_canary_max_ttft_p99_ratio: 1.15
  register: judged
"""

RETURN = r"""
judgement:
  description: The verdict, the deciding signal and every signal with both values.
  returned: success
  type: dict
  contains:
    verdict: {description: passed, failed or inconclusive., type: str}
    passed: {description: Whether the verdict is passed., type: bool}
    decided_by: {description: The first failing signal, or null., type: str}
    signals: {description: "Each signal: signal, canary, baseline, threshold, failed, unit,
      note.", type: list, elements: dict}
    message: {description: The judgement in words, with both values of the deciding
      signal and the window., type: str}
    live_requests: {description: Live requests each side served in the window., type: dict}
    window: {description: The window in seconds., type: float}
    seconds: {description: How long the window took., type: float}
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(canary=dict(type="dict", required=True),
                           baselines=dict(type="list", elements="dict", required=True),
                           router_metrics=dict(type="list", elements="str", default=[]),
                           settings=dict(type="dict", default={}),
                           api_key=dict(type="str", no_log=True)),
        supports_check_mode=True,
    )
    module.fail_json(msg="sglang_canary runs on the controller through its action plugin "
                         "(call it as sglang.fleet.sglang_canary with the collection installed)")


if __name__ == "__main__":
    main()
