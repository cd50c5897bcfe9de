# -*- coding: utf-8 -*-
# The benchmark client: streaming /generate requests with token ids and ignore_eos, as SGLang's
# bench_one_batch_server sends them, timed per chunk: at concurrency 1 one prompt, at
# concurrency N one request carrying N distinct prompts (sglang/benchmark/one_batch_server.py
# run_one_case). Standard library only, because it runs on the node (servers listen on the
# node's loopback) and in the controller's scripts.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import random
import socket
import time
from http.client import HTTPConnection

from .streammetrics import (
    batch_metrics,
    request_metrics,
    summarize,
    summarize_batches,
)


class BenchError(Exception):
    pass


def fixed_input_ids(length):
    """The same prompt every time, so that runs compare (prefix cache flushed before each)."""
    return [1000 + (i * 7919) % 30000 for i in range(length)]


def distinct_input_ids(count, length):
    """`count` different prompts of `length` random token ids, the same on every run, as the
    random-ids dataset gives bench_one_batch_server (no shared prefix to cache)."""
    return [[random.Random(k).randrange(1000, 31000) for _ in range(length)]
            for k in range(count)]


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


def _stream(host, port, body, api_key, timeout, on_event):
    """POST one streaming /generate; on_event(arrival time, event) for each chunk.
    Returns (sent_at, done_at)."""
    conn = HTTPConnection(host, port, timeout=timeout)
    count = 0
    try:
        sent_at = time.perf_counter()
        conn.request("POST", "/generate", body=json.dumps(body).encode(),
                     headers=_headers(api_key))
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchError("POST /generate answered %d: %s"
                             % (resp.status, resp.read(300).decode("utf-8", "replace")))
        while True:
            line = resp.readline()
            if not line:
                raise BenchError("the stream ended without [DONE] after %d chunks" % count)
            now = time.perf_counter()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return sent_at, now
            event = json.loads(data)
            if "error" in event:
                raise BenchError("the server reported an error: %s" % event["error"])
            count += 1
            on_event(now, event)
    finally:
        conn.close()


def _sampling(output_len):
    return {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}


def stream_generate(host, port, input_ids, output_len, api_key=None, timeout=300.0):
    """One streaming /generate; the chunk timings and the request's figures."""
    chunks = []
    body = {"input_ids": input_ids, "sampling_params": _sampling(output_len), "stream": True}

    def record(now, event):
        chunks.append((now, int(event["meta_info"]["completion_tokens"])))

    sent_at, done_at = _stream(host, port, body, api_key, timeout, record)
    metrics = request_metrics(sent_at, chunks, done_at, input_tokens=len(input_ids))
    if metrics["output_tokens"] != output_len:
        raise BenchError("asked for %d tokens with ignore_eos, got %d: the server clamped "
                         "max_new_tokens" % (output_len, metrics["output_tokens"]))
    metrics["sent_at"], metrics["done_at"] = sent_at, done_at
    return metrics


def batch_generate(host, port, prompts, output_len, api_key=None, timeout=300.0):
    """One streaming /generate carrying every prompt; each chunk names its prompt by `index`."""
    streams = [[] for _ in prompts]
    body = {"input_ids": prompts, "sampling_params": _sampling(output_len), "stream": True}

    def record(now, event):
        streams[int(event["index"])].append((now, int(event["meta_info"]["completion_tokens"])))

    sent_at, done_at = _stream(host, port, body, api_key, timeout, record)
    metrics = batch_metrics(sent_at, streams, done_at, sum(len(p) for p in prompts))
    if metrics["output_tokens"] != output_len * len(prompts):
        raise BenchError("asked for %d tokens for each of %d prompts with ignore_eos, got %d in "
                         "all: the server clamped max_new_tokens"
                         % (output_len, len(prompts), metrics["output_tokens"]))
    return metrics


def _flushed(generate, host, port, prompts, output_len, api_key, timeout):
    """One measured request, the prefix cache flushed before it."""
    flush_cache(host, port, api_key, timeout)
    return generate(host, port, prompts, output_len, api_key, timeout)


class _Tally(object):
    """Counts the requests answered, so that a server that goes quiet partway (one reported
    to after 80-140 requests) fails naming the request and how many were answered."""

    def __init__(self, total, timeout):
        self.total, self.timeout, self.answered = total, timeout, 0

    def run(self, call, *args):
        try:
            result = call(*args)
        except socket.timeout as exc:
            raise BenchError("request %d of %d got no answer within %g s (%d answered)"
                             % (self.answered + 1, self.total, self.timeout,
                                self.answered)) from exc
        except (BenchError, OSError, ValueError) as exc:
            raise BenchError("request %d of %d failed (%d answered): %s"
                             % (self.answered + 1, self.total, self.answered, exc)) from exc
        self.answered += 1
        return result


def run_benchmark(host, port, input_len, output_len, warmup, repetitions, concurrency,
                  api_key=None, timeout=300.0):
    """Warm-up requests, then `repetitions` runs at each concurrency level.

    Concurrency 1 is single-stream: one prompt per request. Concurrency N sends one request
    with N distinct prompts, as bench_one_batch_server does at batch size N. Each level reports
    the median and spread of every figure and ITL percentiles per token.
    """
    input_ids = fixed_input_ids(input_len)
    tally = _Tally(warmup + repetitions * len(concurrency), timeout)
    for _ in range(warmup):
        tally.run(stream_generate, host, port, input_ids, output_len, api_key, timeout)
    levels = []
    for count in concurrency:
        runs = []
        for _ in range(repetitions):
            if count == 1:
                runs.append(tally.run(_flushed, stream_generate, host, port, input_ids,
                                      output_len, api_key, timeout))
            else:
                runs.append(tally.run(_flushed, batch_generate, host, port,
                                      distinct_input_ids(count, input_len), output_len,
                                      api_key, timeout))
        level = summarize(runs) if count == 1 else summarize_batches(runs)
        level.update(concurrency=count, mode="single_stream" if count == 1 else "batch",
                     runs=[{k: round(r[k], 6) for k in ("ttft_s", "latency_s", "output_tok_s",
                                                        "input_tok_s", "overall_tok_s")
                            if r.get(k) is not None} for r in runs])
        levels.append(level)
    return {"input_len": input_len, "output_len": output_len, "warmup": warmup,
            "repetitions": repetitions, "levels": levels}
