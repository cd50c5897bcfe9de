#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: sglang_canary
short_description: Judge canary SGLang servers under live traffic against the baseline servers
description:
  - Runs on the controller through its action plugin (sglang_fleet.rollout). Every server
    of I(jobs) is judged in one window. SGLang's C(/metrics) on each canary and each baseline
    server, and each router's Prometheus endpoint, are scraped at the start and at each
    job's end; all through the window one prober per server sends a fixed set of greedy
    probe prompts to it, one after another. A baseline behind several canaries is probed
    once, and every probe it got is taken off its live requests.
  - "Signals, in the order they decide: error rate (the router's per-worker failures and the
    probes' 5xx or internal-error aborts), greedy output equivalence (probe answers, canary
    against baseline), abort rate (C(sglang:num_aborted_requests_total) over
    C(sglang:num_requests_total)), generation tokens per second of a request (the inter-token
    latency histogram's count over its sum), p99 time to first token and p99 inter-token
    latency (SGLang's histograms; where both p99s fall in one bucket the means decide)."
  - The verdict is C(failed) when a signal passes its threshold, C(inconclusive) when either
    side got fewer than the minimum live requests (the probe-measured signals still decide),
    and C(passed) otherwise. It never fails the task; the playbook acts on the verdicts.
  - The controller must reach the servers' and routers' HTTP ports.
version_added: "1.0.0"
author: sglang-fleet
options:
  jobs:
    description:
      - The servers to judge, one dict each, all in one window.
      - C(canary) is the server judged, as C(host), C(url) (where the controller reaches
        it), C(worker_url) (the URL its routers know it by; defaults to C(url)) and
        C(release) (the SGLang release its LaunchSpec pins; the server's own
        C(/server_info) version wins where it answers). Where the canary's release differs
        from the baseline's, greedy outputs are compared by log-probability distance, else
        exactly.
      - C(baselines) are the servers still on the baseline, each like C(canary).
      - C(router_metrics) are the base URLs of its routers' Prometheus endpoints
        (C(/metrics) is appended).
      - C(settings) are the sglang_bench_canary_* variables (window, min_requests, probes,
        probe_tokens and the thresholds) by their full names; absent ones take their
        defaults. A threshold that could never fail, an empty or too large probe set, or a
        window that is not positive is refused, naming the variable. Each job ends at its
        own window.
    type: list
    elements: dict
    required: true
  api_keys:
    description: Each canary host's servers' API key (sglang_server_api_key), sent as a
      bearer token to it and to its baselines.
    type: dict
    default: {}
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
- name: Judge two canaries in one window
  sglang.fleet.sglang_canary:
    jobs:
      - canary: {host: node1, url: "http://10.0.0.1:30000"}
        baselines:
          - {host: node3, url: "http://10.0.0.3:30000"}
        router_metrics: ["http://10.0.0.9:29000"]
        settings:
          sglang_bench_canary_window: 300
          sglang_bench_canary_max_ttft_p99_ratio: 1.15
      - canary: {host: node2, url: "http://10.0.0.2:30000"}
        baselines:
          - {host: node3, url: "http://10.0.0.3:30000"}
        router_metrics: ["http://10.0.0.9:29000"]
        settings:
          sglang_bench_canary_window: 300
  register: judged
"""

RETURN = r"""
judgements:
  description: Each canary host's judgement, or C(error) where the window could not be run
    (a server or router that did not answer).
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
    live_requests: {description: Live requests each side served in the window (every
      probe taken off)., type: dict}
    window: {description: The window in seconds., type: float}
    seconds: {description: How long the window took., type: float}
    error: {description: Why it was not judged (no other key then)., type: str}
"""

from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import (
    controller_only,
)


def main():
    controller_only("sglang_canary", dict(
        jobs=dict(type="list", elements="dict", required=True),
        api_keys=dict(type="dict", default={}, no_log=True)))


if __name__ == "__main__":
    main()
