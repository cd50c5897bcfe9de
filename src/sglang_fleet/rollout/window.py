"""The canary's window under live traffic, on the controller: each server's /metrics and each
router's scraped at its start and end, and the greedy probe prompts sent to every server one
after another all through it (their answers, with their tokens' logprobs, compared; their
failures counted). The controller must reach the servers' and routers' HTTP ports, as the
router does."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests

from sglang_fleet.rollout.judge import Answer, Side, judge
from sglang_fleet.rollout.metrics import router_outcomes, server_sample
from sglang_fleet.rollout.plan import CanaryPlan


@dataclass(frozen=True)
class Target:
    host: str
    url: str  # where the controller reaches the server
    worker_url: str  # the URL its routers know it by
    release: str | None = None  # the SGLang release its LaunchSpec pins


class ScrapeError(RuntimeError):
    pass


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def scrape(url: str, api_key: str | None = None, timeout: float = 10.0) -> str:
    try:
        answer = requests.get(url.rstrip("/") + "/metrics", headers=_headers(api_key),
                              timeout=timeout)
    except requests.RequestException as exc:
        raise ScrapeError(f"{url}/metrics did not answer: {type(exc).__name__}") from exc
    if answer.status_code != 200:
        raise ScrapeError(f"{url}/metrics answered HTTP {answer.status_code}")
    return answer.text


def _json_body(answer: requests.Response) -> dict[str, Any] | None:
    """The answer's JSON object, read once; None when it is not one."""
    try:
        body = answer.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _finish_reason(body: dict[str, Any]) -> Any:
    return (body.get("meta_info") or {}).get("finish_reason") or {}


def _probe_failed(status: int, body: dict[str, Any] | None) -> bool:
    """A 5xx, or a 200 whose request SGLang ended with an internal error's abort."""
    if status >= 500:
        return True
    if body is None:
        return status != 200
    reason = _finish_reason(body)
    return isinstance(reason, dict) and (reason.get("status_code") or 0) >= 500


# Top logprobs asked per output position: enough to find a near tie's rank.
TOP_LOGPROBS = 5


def answer_of(body: dict[str, Any]) -> Answer | None:
    """A /generate answer's text, token ids and logprobs (meta_info's output_token_logprobs
    and output_top_logprobs, [logprob, token_id, text] each); None without text."""
    text, meta = body.get("text"), body.get("meta_info") or {}
    if not isinstance(text, str):
        return None
    chosen = meta.get("output_token_logprobs") or []
    top = meta.get("output_top_logprobs") or []
    return Answer(text, tuple(int(e[1]) for e in chosen),
                  tuple(float(e[0]) if e[0] is not None else float("-inf") for e in chosen),
                  tuple({int(e[1]): float(e[0]) for e in row or [] if e[0] is not None}
                        for row in top))


def server_release(url: str, api_key: str | None, timeout: float = 10.0) -> str | None:
    """The SGLang release the server says it runs: /server_info's `version` (0.5.23), or
    /get_server_info's (0.5.4.post3 has no /server_info); None where neither answers."""
    for path in ("/server_info", "/get_server_info"):
        try:
            answer = requests.get(url.rstrip("/") + path, headers=_headers(api_key),
                                  timeout=timeout)
            if answer.status_code == 200:
                version = answer.json().get("version")
                return str(version) if version else None
        except (requests.RequestException, ValueError, AttributeError):
            return None
    return None


class Prober(threading.Thread):
    """Greedy probe prompts to one server, one after another, until told to stop."""

    def __init__(self, target: Target, plan: CanaryPlan, api_key: str | None) -> None:
        super().__init__(daemon=True, name=f"probe-{target.host}")
        self.target, self.plan, self.api_key = target, plan, api_key
        self.stop_event = threading.Event()
        self.sent = self.failed = 0
        self.outputs: dict[str, Answer] = {}

    def run(self) -> None:
        session = requests.Session()
        for prompt in itertools.cycle(self.plan.probes):
            if self.stop_event.is_set():
                return
            self._one(session, prompt)

    def _one(self, session: requests.Session, prompt: str) -> None:
        body = {"text": prompt, "sampling_params": {
            "max_new_tokens": self.plan.probe_tokens, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": TOP_LOGPROBS}
        self.sent += 1
        try:
            answer = session.post(self.target.url.rstrip("/") + "/generate", json=body,
                                  headers=_headers(self.api_key), timeout=60)
        except requests.RequestException:
            self.failed += 1
            self.stop_event.wait(0.5)  # a server that refuses connections is not hammered
            return
        body = _json_body(answer)
        if _probe_failed(answer.status_code, body):
            self.failed += 1
        elif answer.status_code == 200 and body is not None:
            got = answer_of(body)
            if got is not None and _finish_reason(body).get("type") != "abort":
                self.outputs.setdefault(prompt, got)


def _router_counts(urls: list[str]) -> dict[str, dict[str, float]]:
    total: dict[str, dict[str, float]] = {}
    for url in urls:
        for worker, outcomes in router_outcomes(scrape(url)).items():
            for outcome, n in outcomes.items():
                total.setdefault(worker, {})
                total[worker][outcome] = total[worker].get(outcome, 0.0) + n
    return total


def _side(target: Target, start: str, end: str, prober: Prober,
          routers: tuple[dict, dict], release: str | None) -> Side:
    worker = target.worker_url.rstrip("/")
    before, after = routers[0].get(worker, {}), routers[1].get(worker, {})
    return Side(sample=server_sample(end).minus(server_sample(start)),
                router_success=after.get("success", 0.0) - before.get("success", 0.0),
                router_failure=after.get("failure", 0.0) - before.get("failure", 0.0),
                probes_sent=prober.sent, probes_failed=prober.failed,
                outputs=dict(prober.outputs), release=release)


def observe(plan: CanaryPlan, canary: Target, baselines: list[Target], router_metrics: list[str],
            api_key: str | None = None, sleep=time.sleep) -> dict[str, Any]:
    """Run the window and judge it: the judgement (judge.judge) with the targets named."""
    targets = [canary, *baselines]
    starts = {t.host: scrape(t.url, api_key) for t in targets}
    # A baseline's LaunchSpec is the configuration this run will give it, not the one it
    # runs: the server's own word decides, the LaunchSpec's release where it says nothing.
    releases = {t.host: server_release(t.url, api_key) or t.release for t in targets}
    routers_before = _router_counts(router_metrics)
    probers = {t.host: Prober(t, plan, api_key) for t in targets}
    for p in probers.values():
        p.start()
    started = time.monotonic()
    try:
        sleep(plan.window)
    finally:
        for p in probers.values():
            p.stop_event.set()
        for p in probers.values():
            p.join(timeout=70)
    # Scraped after the probes ended, so every probe sent is in the counters.
    ends = {t.host: scrape(t.url, api_key) for t in targets}
    routers_after = _router_counts(router_metrics)
    sides = {t.host: _side(t, starts[t.host], ends[t.host], probers[t.host],
                           (routers_before, routers_after), releases[t.host])
             for t in targets}
    result = judge(sides[canary.host], [sides[b.host] for b in baselines], plan)
    result.update(canary=canary.host, baselines=[b.host for b in baselines],
                  seconds=round(time.monotonic() - started, 1))
    return result
