#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_bench
short_description: Measure a ready SGLang server's decode speed, single-stream and batched
description:
  - Sends streaming C(/generate) requests with C(ignore_eos) and temperature 0, the way
    SGLang 0.5.23's C(bench_one_batch_server) does, from the node itself (servers listen on
    the node's loopback). At concurrency 1 each run is one request with a fixed prompt; at
    concurrency N each run is one request carrying N distinct prompts of random token ids.
  - For each run it reports TTFT (at concurrency N, the time until every prompt has its first
    token), latency, output tok/s = output tokens / (latency - TTFT) (SGLang's own figure),
    input tok/s = input tokens / TTFT and overall tok/s = all tokens / latency; per prompt,
    TPOT and decode tok/s = 1 / TPOT, and ITL per token as C(bench_serving) counts it (each
    chunk's gap spread over the tokens it brings). Repetitions give a median and spread; ITL
    p50/p95/p99 cover every token of every repetition.
  - The prefix cache is flushed before each repetition, so every one pays the same prefill.
  - The API key, when the deployment has one, is read from the deployment's 0600 env file on
    the node, so it never travels through Ansible's arguments.
  - In check mode nothing is sent.
version_added: "0.1.0"
author: sglang-fleet maintainers
extends_documentation_fragment:
  - sglang.fleet.sglang_fleet.attributes
options:
  host:
    description: Address the server listens on, as seen from the node.
    type: str
    default: 127.0.0.1
  port:
    description: Server port.
    type: int
    required: true
  env_file:
    description: The deployment's env file, read for the API key variable when present.
    type: path
  api_key_var:
    description: Name of the API key variable in I(env_file).
    type: str
    default: SGLANG_FLEET_API_KEY
  input_len:
    description: Prompt length in tokens.
    type: int
    default: 1024
  output_len:
    description: Tokens to generate per request (at least 2, so that decode is measured).
    type: int
    default: 256
  warmup:
    description: Requests sent and discarded before measuring.
    type: int
    default: 1
  repetitions:
    description: Measured runs per concurrency level.
    type: int
    default: 3
  concurrency:
    description:
      - Concurrency levels. 1 is single-stream decode; N > 1 sends, per repetition, one
        request with N distinct prompts (a batch of N, as C(bench_one_batch_server)).
    type: list
    elements: int
    default: [1]
  timeout:
    description: Seconds one request may take.
    type: float
    default: 300
"""

EXAMPLES = r"""
- name: Single-stream decode speed, 3 repetitions after one warm-up
  sglang.fleet.sglang_bench:
    port: 30000
    env_file: /opt/sglang-fleet/etc/Kimi-K2.5-30000.env
    output_len: 256
    repetitions: 3

- name: Add batch levels (one request of 4, then of 16 distinct prompts)
  sglang.fleet.sglang_bench:
    port: 30000
    concurrency: [1, 4, 16]
"""

RETURN = r"""
benchmark:
  description: >-
    input_len, output_len, warmup, repetitions and one entry per concurrency level in levels,
    each with concurrency, mode (single_stream or batch), output_tok_s, input_tok_s,
    overall_tok_s, ttft_s, latency_s (median, min, max, stdev, n over repetitions),
    decode_tok_s and tpot_s (over every prompt), itl_s (p50, p95, p99, n over every token) and
    the raw runs (ttft_s, latency_s, output_tok_s, input_tok_s, overall_tok_s).
  returned: success, not in check mode
  type: dict
output_tok_s:
  description: >-
    Median output tok/s at the first concurrency level (the headline figure; at concurrency 1,
    single-stream decode speed).
  returned: success, not in check mode
  type: float
"""

import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sglang.fleet.plugins.module_utils.bench.client import (
    BenchError,
    run_benchmark,
)
from ansible_collections.sglang.fleet.plugins.module_utils.common.failing import failing

_LIMITS = {"input_len": (1, 1000000), "output_len": (2, 100000), "warmup": (0, 100),
           "repetitions": (1, 1000)}


def _api_key(path, name):
    if not path:
        return None
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep and key == name:
                    return shlex.split(value)[0] if value else ""
    except (OSError, IOError, ValueError):
        return None
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", required=True),
            env_file=dict(type="path"),
            api_key_var=dict(type="str", default="SGLANG_FLEET_API_KEY", no_log=False),
            input_len=dict(type="int", default=1024),
            output_len=dict(type="int", default=256),
            warmup=dict(type="int", default=1),
            repetitions=dict(type="int", default=3),
            concurrency=dict(type="list", elements="int", default=[1]),
            timeout=dict(type="float", default=300.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for name, (low, high) in _LIMITS.items():
        if not low <= p[name] <= high:
            module.fail_json(msg="%s=%r is out of range %d..%d; set a value in that range"
                             % (name, p[name], low, high))
    if not p["concurrency"] or any(not 1 <= c <= 1024 for c in p["concurrency"]):
        module.fail_json(msg="concurrency=%r: give one or more levels in 1..1024"
                         % (p["concurrency"],))
    if module.check_mode:
        module.exit_json(changed=False, msg="check mode: nothing sent")
    with failing(module, (BenchError, OSError, ValueError),
                 "benchmark of %s:%d failed" % (p["host"], p["port"])):
        result = run_benchmark(p["host"], p["port"], p["input_len"], p["output_len"],
                               p["warmup"], p["repetitions"], p["concurrency"],
                               api_key=_api_key(p["env_file"], p["api_key_var"]),
                               timeout=p["timeout"])
    module.exit_json(changed=False, benchmark=result,
                     output_tok_s=result["levels"][0]["output_tok_s"]["median"])


if __name__ == "__main__":
    main()
