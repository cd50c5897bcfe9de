"""The canaries' window under live traffic, on the controller: each server's /metrics and each
router's scraped at its start and end, and the greedy probe prompts sent to every server one
after another all through it (their answers, with their tokens' logprobs, compared; their
failures counted). Every server a batch judges (several canaries, or a batch's servers) shares
one window and one prober per server: a baseline behind two canaries is probed once, and every
probe it got is taken off its live requests. The controller must reach the servers' and
routers' HTTP ports, as the router does."""

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
    """Greedy probe prompts to one server, one after another, until told to stop. `hold`
    then `wait_idle` keep it between two probes until `release`: a window's end is read with
    no probe in flight."""

    def __init__(self, target: Target, plan: CanaryPlan, api_key: str | None) -> None:
        super().__init__(daemon=True, name=f"probe-{target.host}")
        self.target, self.plan, self.api_key = target, plan, api_key
        self.stop_event = threading.Event()
        self._turn = threading.Condition()
        self._held = self._busy = False
        self.sent = self.failed = 0
        self.outputs: dict[str, Answer] = {}

    def run(self) -> None:
        session = requests.Session()
        for prompt in itertools.cycle(self.plan.probes):
            with self._turn:
                self._turn.wait_for(lambda: not self._held or self.stop_event.is_set())
                if self.stop_event.is_set():
                    return
                self._busy = True
            try:
                self._one(session, prompt)
            finally:
                with self._turn:
                    self._busy = False
                    self._turn.notify_all()

    def hold(self) -> None:
        """No probe starts after this one (the probe in flight, if any, runs on)."""
        with self._turn:
            self._held = True

    def wait_idle(self) -> None:
        """Returns once the probe in flight, if any, has its answer."""
        with self._turn:
            self._turn.wait_for(lambda: not self._busy)

    def release(self) -> None:
        with self._turn:
            self._held = False
            self._turn.notify_all()

    def stop(self) -> None:
        self.stop_event.set()
        self.release()

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


def _router_scrapes(urls: list[str]
                    ) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, str]]:
    """Each router's per-worker outcomes by its metrics URL, and why each that did not answer
    did not."""
    counts, missing = {}, {}
    for url in urls:
        try:
            counts[url] = router_outcomes(scrape(url))
        except ScrapeError as exc:
            missing[url] = str(exc)
    return counts, missing


def _router_delta(worker: str, urls: tuple[str, ...], before: dict, after: dict
                  ) -> dict[str, float]:
    """The worker's outcomes over the window, summed over the job's routers."""
    delta: dict[str, float] = {}
    for url in urls:
        now, then = after[url].get(worker, {}), before[url].get(worker, {})
        for outcome in ("success", "failure"):
            delta[outcome] = delta.get(outcome, 0.0) + now.get(outcome, 0.0) - then.get(
                outcome, 0.0)
    return delta


@dataclass(frozen=True)
class Job:
    """One server to judge: its plan, itself, its baseline servers, its routers' metrics."""

    plan: CanaryPlan
    canary: Target
    baselines: tuple[Target, ...]
    router_metrics: tuple[str, ...] = ()
    api_key: str | None = None

    @property
    def targets(self) -> tuple[Target, ...]:
        return (self.canary, *self.baselines)


def _prober_key(target: Target, plan: CanaryPlan) -> tuple:
    return target.host, plan.probes, plan.probe_tokens


@dataclass(frozen=True)
class _Probed:
    """What the probers had from one server when a window ended."""

    sent: int
    failed: int
    outputs: dict[str, Answer]
    others: int  # probes other jobs' probers sent it (other prompts or token counts)


def _side(target: Target, metrics: tuple[str, str], probed: _Probed,
          routed: dict[str, float], release: str | None) -> Side:
    return Side(sample=server_sample(metrics[1]).minus(server_sample(metrics[0])),
                router_success=routed.get("success", 0.0),
                router_failure=routed.get("failure", 0.0),
                probes_sent=probed.sent, probes_failed=probed.failed,
                other_probes=probed.others, outputs=probed.outputs, release=release)


def unjudged(host: str, why: str) -> dict[str, Any]:
    """The judgement of a server that could not be judged (its window's error)."""
    return {"error": f"{host}: not judged under live traffic: {why}"}


class _Window:
    """The shared window: every job's servers and routers scraped at its start, one prober per
    server (and probe set) running until the last job ends, each job judged at its own end. A
    server or router that does not answer leaves unjudged only the jobs that read it."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self.unjudged: dict[str, dict[str, Any]] = {}
        self.probers: dict[tuple, Prober] = {}

    def begin(self) -> list[Job]:
        """Scrape every server and router once; start the probers of the jobs whose servers
        and routers all answered; those jobs, to be ended."""
        targets: dict[str, tuple[Target, str | None]] = {}
        for job in self.jobs:
            for t in job.targets:
                targets.setdefault(t.host, (t, job.api_key))
        self.starts, missing = {}, {}
        for host, (t, key) in targets.items():
            try:
                self.starts[host] = scrape(t.url, key)
            except ScrapeError as exc:
                missing[host] = str(exc)
        self.routers_before, missing_routers = _router_scrapes(
            sorted({u for job in self.jobs for u in job.router_metrics}))
        missing.update(missing_routers)
        # A baseline's LaunchSpec is the configuration this run will give it, not the one it
        # runs: the server's own word decides, the LaunchSpec's release where it says nothing.
        self.releases = {h: server_release(t.url, key) or t.release
                         for h, (t, key) in targets.items() if h in self.starts}
        viable = []
        for job in self.jobs:
            lost = [missing[k] for k in (*(t.host for t in job.targets), *job.router_metrics)
                    if k in missing]
            if lost:
                self.unjudged[job.canary.host] = unjudged(job.canary.host, lost[0])
                continue
            viable.append(job)
            for t in job.targets:
                key = _prober_key(t, job.plan)
                if key not in self.probers:
                    self.probers[key] = Prober(t, job.plan, targets[t.host][1])
        for p in self.probers.values():
            p.start()
        return viable

    def _probed(self, target: Target, plan: CanaryPlan) -> _Probed:
        own = self.probers[_prober_key(target, plan)]
        others = sum(p.sent for k, p in self.probers.items()
                     if k[0] == target.host and p is not own)
        return _Probed(own.sent, own.failed, dict(own.outputs), others)

    def _read_end(self, job: Job) -> dict[str, Side]:
        """Each side of the job at its end (a ScrapeError where one does not answer)."""
        ends = {t.host: scrape(t.url, job.api_key) for t in job.targets}
        after, missing = _router_scrapes(list(job.router_metrics))
        if missing:
            raise ScrapeError(next(iter(missing.values())))
        return {t.host: _side(t, (self.starts[t.host], ends[t.host]), self._probed(t, job.plan),
                              _router_delta(t.worker_url.rstrip("/"), job.router_metrics,
                                            self.routers_before, after),
                              self.releases[t.host])
                for t in job.targets}

    def end(self, job: Job) -> dict[str, Any]:
        """The job's judgement, read with every prober held between two probes (all told to
        hold first, then each waited for), so that every probe sent is in the servers'
        counters."""
        for p in self.probers.values():
            p.hold()
        try:
            for p in self.probers.values():
                p.wait_idle()
            sides = self._read_end(job)
        except ScrapeError as exc:
            return unjudged(job.canary.host, str(exc))
        finally:
            for p in self.probers.values():
                p.release()
        result = judge(sides[job.canary.host], [sides[b.host] for b in job.baselines],
                       job.plan)
        result.update(canary=job.canary.host, baselines=[b.host for b in job.baselines])
        return result

    def stop(self) -> None:
        for p in self.probers.values():
            p.stop()
        for p in self.probers.values():
            if p.is_alive():
                p.join(timeout=70)


def observe(jobs: list[Job], sleep=time.sleep) -> dict[str, dict[str, Any]]:
    """Run one window for every job and judge each at the end of its own: by canary host,
    the judgement (judge.judge, with the targets named and the seconds run), or {"error"}
    where a server or router it reads did not answer (the other jobs are judged anyway)."""
    window = _Window(jobs)
    viable = window.begin()
    started = time.monotonic()
    judgements = dict(window.unjudged)
    try:
        for job in sorted(viable, key=lambda j: j.plan.window):
            sleep(max(job.plan.window - (time.monotonic() - started), 0.0))
            judged = window.end(job)
            if "error" not in judged:
                judged["seconds"] = round(time.monotonic() - started, 1)
            judgements[job.canary.host] = judged
    finally:
        window.stop()
    return judgements
