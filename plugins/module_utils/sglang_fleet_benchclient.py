# -*- coding: utf-8 -*-
# The benchmark client: streaming /generate requests with fixed token ids and ignore_eos, as
# SGLang's bench_one_batch_server sends them, timed per chunk. Standard library only, because
# it runs on the node (servers listen on the node's loopback) and in the controller's scripts.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import threading
import time
from http.client import HTTPConnection

try:
    from ansible.module_utils.sglang_fleet_streammetrics import request_metrics, spread, summarize
except ImportError:  # imported on the controller, outside a module
    from sglang_fleet_node.sglang_fleet_streammetrics import request_metrics, spread, summarize


class BenchError(Exception):
    pass


def fixed_input_ids(length):
    """The same prompt every time, so that runs compare (prefix cache flushed before each)."""
    return [1000 + (i * 7919) % 30000 for i in range(length)]


def _headers(api_key):
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    return headers


def flush_cache(host, port, api_key, timeout):
    conn = HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/flush_cache", body=b"", headers=_headers(api_key))
        conn.getresponse().read()
    finally:
        conn.close()


def stream_generate(host, port, input_ids, output_len, api_key=None, timeout=300.0):
    """One streaming /generate; the chunk timings and the request's figures."""
    body = json.dumps({
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len,
                            "ignore_eos": True},
        "stream": True,
    }).encode()
    conn = HTTPConnection(host, port, timeout=timeout)
    chunks = []
    try:
        sent_at = time.perf_counter()
        conn.request("POST", "/generate", body=body, headers=_headers(api_key))
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchError("POST /generate answered %d: %s"
                             % (resp.status, resp.read(300).decode("utf-8", "replace")))
        while True:
            line = resp.readline()
            if not line:
                raise BenchError("the stream ended without [DONE] after %d chunks"
                                 % len(chunks))
            now = time.perf_counter()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done_at = now
                break
            event = json.loads(data)
            if "error" in event:
                raise BenchError("the server reported an error: %s" % event["error"])
            chunks.append((now, int(event["meta_info"]["completion_tokens"])))
    finally:
        conn.close()
    metrics = request_metrics(sent_at, chunks, done_at)
    if metrics["output_tokens"] != output_len:
        raise BenchError("asked for %d tokens with ignore_eos, got %d: the server clamped "
                         "max_new_tokens" % (output_len, metrics["output_tokens"]))
    metrics["sent_at"], metrics["done_at"] = sent_at, done_at
    return metrics


def _concurrent(host, port, input_ids, output_len, api_key, timeout, count):
    results = [None] * count
    errors = []

    def one(i):
        try:
            results[i] = stream_generate(host, port, input_ids, output_len, api_key, timeout)
        except Exception as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchError("%d of %d concurrent requests failed: %s"
                         % (len(errors), count, errors[0]))
    return results


def run_benchmark(host, port, input_len, output_len, warmup, repetitions, concurrency,
                  api_key=None, timeout=300.0):
    """Warm-up requests, then `repetitions` runs at each concurrency level.

    Each level reports the median and spread of every figure, ITL percentiles, and the
    aggregate output tok/s of all its streams together.
    """
    input_ids = fixed_input_ids(input_len)
    for _ in range(warmup):
        stream_generate(host, port, input_ids, output_len, api_key, timeout)
    levels = []
    for count in concurrency:
        requests, aggregate = [], []
        for _ in range(repetitions):
            flush_cache(host, port, api_key, timeout)
            batch = _concurrent(host, port, input_ids, output_len, api_key, timeout, count)
            wall = max(r["done_at"] for r in batch) - min(r["sent_at"] for r in batch)
            aggregate.append(sum(r["output_tokens"] for r in batch) / wall)
            requests.extend(batch)
        level = summarize(requests)
        level.update(concurrency=count, aggregate_tok_s=spread(aggregate),
                     runs=[{k: round(r[k], 6) for k in ("ttft_s", "latency_s", "output_tok_s")}
                           for r in requests])
        levels.append(level)
    return {"input_len": input_len, "output_len": output_len, "warmup": warmup,
            "repetitions": repetitions, "levels": levels}
