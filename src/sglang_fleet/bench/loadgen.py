"""A bounded streaming load on SGLang's /generate (through the router or straight to a worker),
and a sampler of the router's worker list: what the zero-drop benchmark and the router tests
measure with.

Each request carries its own id in `x-request-id` (the router logs it with the worker it sends
the request to) and counts as completed only when its stream ends with SGLang's final chunk
(`finish_reason` set, every requested token there) and `data: [DONE]`: a stream cut when a
worker dies returns 200 too, with fewer chunks and no end.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import requests


@dataclass
class Request:
    rid: str
    start: float  # epoch seconds
    end: float = 0.0
    status: int | None = None
    tokens: int = 0
    completed: bool = False
    error: str = ""
    abort: str = ""  # "<status>: <message>" of a stream SGLang ended with an abort

    @property
    def latency(self) -> float:
        return self.end - self.start


@dataclass
class Load:
    """`clients` threads, each sending one streaming request after another for `duration`
    seconds (or until stop())."""

    url: str
    clients: int = 4
    max_new_tokens: int = 32
    duration: float = 30.0
    api_key: str | None = None
    timeout: float = 120.0
    prefix: str = "req"
    api: str = "generate"  # one of APIS
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._count = 0

    def start(self) -> Load:
        self._deadline = time.monotonic() + self.duration
        for i in range(self.clients):
            thread = threading.Thread(target=self._client, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()

    def wait(self) -> list[Request]:
        for thread in self._threads:
            thread.join()
        return self.requests

    def _next_id(self) -> str:
        with self._lock:
            self._count += 1
            return f"{self.prefix}-{self._count:05d}"

    def _client(self, index: int) -> None:
        session = requests.Session()
        rng = random.Random(index)
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            record = Request(self._next_id(), time.time())
            with self._lock:
                self.requests.append(record)
            # Prompts with no common prefix, so a cache-aware router spreads them over its
            # workers instead of keeping each client on one.
            text = f"{rng.getrandbits(64):016x} from client {index}: say something"
            self._send(session, record, text)

    def _send(self, session: requests.Session, record: Request, text: str) -> None:
        """One request's life, recorded in `record` (a subclass may resend it)."""
        send(session, self.url, record, text, self.max_new_tokens, self.api_key, self.timeout,
             self.api)


# The streaming request each API takes: SGLang's own /generate, or the OpenAI-compatible chat
# completions (whose 200 SGLang sends only with the first chunk, /generate's at once).
APIS = ("generate", "chat")


def request_body(api: str, text: str, max_new_tokens: int) -> tuple[str, dict[str, Any]]:
    """The path and body of one streaming request of `api` (one of APIS)."""
    if api == "chat":
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": text}], "stream": True,
            "max_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    return "/generate", {"text": text, "stream": True,
                         "sampling_params": {"max_new_tokens": max_new_tokens,
                                             "temperature": 0, "ignore_eos": True}}


def read_chunk(chunk: dict[str, Any], record: Request) -> bool:
    """Record one chunk of either API's stream; True when it carries a finish reason."""
    if chunk.get("error"):
        record.error = f"error event: {str(chunk['error'])[:160]}"
    choices = chunk.get("choices")
    if choices:  # chat: a chunk per token, the last with its finish_reason
        if (choices[0].get("delta") or {}).get("content"):
            record.tokens += 1
        return bool(choices[0].get("finish_reason"))
    meta = chunk.get("meta_info") or {}
    record.tokens = int(meta.get("completion_tokens") or record.tokens)
    reason = meta.get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        record.abort = f"{reason.get('status_code')}: {reason.get('message')}"
    return bool(reason)


def send(session: requests.Session, url: str, record: Request, text: str, max_new_tokens: int,
         api_key: str | None = None, timeout: float = 120.0, api: str = "generate") -> Request:
    headers = {"x-request-id": record.rid}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    path, body = request_body(api, text, max_new_tokens)
    done = finished = False
    try:
        with session.post(f"{url}{path}", json=body, headers=headers, stream=True,
                          timeout=timeout) as answer:
            record.status = answer.status_code
            if answer.status_code != 200:
                record.error = f"HTTP {answer.status_code}: {answer.text.strip()[:120]}"
            for line in answer.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(chunk, dict):
                    finished = read_chunk(chunk, record) or finished
    except requests.RequestException as exc:
        record.error = f"{type(exc).__name__}: {str(exc)[:160]}"
    record.end = time.time()
    record.completed = (record.status == 200 and done and finished
                        and record.tokens == max_new_tokens)
    if not record.completed and not record.error:
        record.error = (f"stream cut after {record.tokens} of {max_new_tokens} tokens"
                        if not done else "ended without its final chunk")
    return record


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summarize(records: list[Request]) -> dict[str, Any]:
    done = [r for r in records if r.completed]
    latencies = [r.latency for r in done]
    return {"sent": len(records), "completed": len(done),
            "failed": len(records) - len(done),
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "failures": [asdict(r) for r in records if not r.completed]}


class RouterSampler:
    """Polls the router's worker list every `interval` seconds: (time, {url: healthy}) samples,
    from which each worker's time out of rotation is measured."""

    def __init__(self, url: str, key: str | None = None, interval: float = 0.1):
        self.url, self.key, self.interval = url, key, interval
        self.samples: list[tuple[float, dict[str, bool]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> RouterSampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, dict[str, bool]]]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def _run(self) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        while not self._stop.is_set():
            try:
                workers = session.get(f"{self.url}/workers", headers=headers, timeout=5).json()
                now = {w["url"].rstrip("/"): bool(w["is_healthy"]) for w in workers["workers"]}
                self.samples.append((time.time(), now))
            except (requests.RequestException, ValueError, KeyError):
                pass
            self._stop.wait(self.interval)


def out_of_rotation(samples: list[tuple[float, dict[str, bool]]], worker: str) -> float:
    """Seconds the worker was not in the router's rotation (not listed, or listed unhealthy)
    over the sampled span."""
    total = 0.0
    for (t0, view), (t1, _) in zip(samples, samples[1:], strict=False):
        if not view.get(worker.rstrip("/"), False):
            total += t1 - t0
    return total


_ROUTED = re.compile(r'request_id="([^"]+)"\}: smg::observability::events: \S+ '
                     r'Sending (?:request url=(\S+)|'
                     r'concurrent requests prefill_url=(\S+) decode_url=(\S+))')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def routed_to(router_log: str) -> dict[str, list[str]]:
    """Request id -> the workers the router sent it to, in order (retries included), from the
    router's debug log ("Sending request url=...", logged inside the request's span; in PD
    mode "Sending concurrent requests prefill_url=... decode_url=...", the prefill then the
    decode)."""
    out: dict[str, list[str]] = {}
    for match in _ROUTED.finditer(_ANSI.sub("", router_log)):
        rid, *urls = match.groups()
        out.setdefault(rid, []).extend(u.rstrip("/") for u in urls if u)
    return out
