# -*- coding: utf-8 -*-
# SGLang's router (sglang-router 0.3.x, the SGLang Model Gateway) seen from the fleet: its worker
# API (GET/POST /workers, DELETE /workers/{id}: adds and removes are queued jobs, so every change
# is followed by polling the list), the in-flight requests of a worker (SGLang's own
# sglang:num_running_reqs + sglang:num_queue_reqs on the worker's /metrics, or the router's
# smg_worker_requests_active gauge for it), a bounded drain, and how the router's view of a
# worker compares with the gate's verdict. Standard library only: it runs on the router host.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re
import shlex
import time

try:  # Python 3
    from urllib.error import HTTPError, URLError
    from urllib.request import Request, urlopen
except ImportError:  # pragma: no cover - Python 2 has no place on a fleet node
    raise

from ..common.secrets import SECRET_PREFIXES

WORKER_INFLIGHT_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
ROUTER_ACTIVE_METRIC = "smg_worker_requests_active"
_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def recorded_admin_key(env_file):
    """The admin key a router was started with, as its env file on its host records it (each
    control-plane key `PREFIX<n>='id:name:role:key'`, shell-quoted), or "" when the file is
    missing, unreadable or holds no admin key: what a stop leaves the router with when the
    inventory's key is unset or refused."""
    try:
        with open(env_file) as f:
            lines = f.read().splitlines()
    except (IOError, OSError):
        return ""
    for line in lines:
        name, eq, value = line.partition("=")
        if not eq or not name.startswith(SECRET_PREFIXES):
            continue
        try:
            words = shlex.split(value)
        except ValueError:
            continue
        parts = words[0].split(":", 3) if len(words) == 1 else []
        if len(parts) == 4 and parts[2] == "admin" and parts[3]:
            return parts[3]
    return ""


class RouterError(Exception):
    """The router answered in a way the fleet cannot work with (auth, an error status)."""


class RouterUnreachable(RouterError):
    """Nothing answers at the router's address."""


def normalize(url):
    return str(url or "").rstrip("/")


def http(method, url, key=None, body=None, timeout=10.0):
    """(status, parsed body) of one request; raises RouterUnreachable when nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    request = Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", "Bearer %s" % key)
    try:
        with urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (URLError, OSError) as exc:
        raise RouterUnreachable("%s %s: %s" % (method, url, getattr(exc, "reason", exc))) \
            from exc
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


class Router(object):
    """The worker API of one router."""

    def __init__(self, url, key=None, timeout=10.0, clock=time.monotonic, sleep=time.sleep):
        self.url = normalize(url)
        self.key = key or None
        self.timeout = timeout
        self.clock = clock
        self.sleep = sleep

    def _call(self, method, path, body=None):
        status, answer = http(method, self.url + path, self.key, body, self.timeout)
        if status in (401, 403):
            raise RouterError(
                "the router at %s refused the fleet's key (%d %s): set an admin key in "
                "sglang_router_control_plane_api_keys, the same the router runs with"
                % (self.url, status, str(answer)[:200]))
        if status >= 400:
            raise RouterError("%s %s%s answered %d: %s" % (method, self.url, path, status,
                                                          str(answer)[:300]))
        return answer

    def workers(self):
        answer = self._call("GET", "/workers")
        if not isinstance(answer, dict) or not isinstance(answer.get("workers"), list):
            raise RouterError("GET %s/workers: not the router's worker list: %s"
                              % (self.url, str(answer)[:200]))
        return answer["workers"]

    def find(self, worker_url):
        wanted = normalize(worker_url)
        for worker in self.workers():
            if normalize(worker.get("url")) == wanted:
                return worker
        return None

    def add(self, worker_url, worker_api_key=None, worker_type="regular", bootstrap_port=None):
        """POST /workers; a prefill or decode server of a PD deployment is added as such (a
        router in PD mode sends each request to one of each), a prefill with the port of its
        KV bootstrap server, which the router passes to the decode in every request."""
        body = {"url": normalize(worker_url)}
        if worker_api_key:
            body["api_key"] = worker_api_key
        if worker_type != "regular":
            body["worker_type"] = worker_type
        if worker_type == "prefill" and bootstrap_port:
            body["bootstrap_port"] = int(bootstrap_port)
        return self._call("POST", "/workers", body)

    def remove(self, worker_id):
        return self._call("DELETE", "/workers/%s" % worker_id)

    def wait_for(self, worker_url, present, healthy=None, timeout=60.0, interval=0.2):
        """Poll the list until the worker is (or is no longer) in it; returns its entry."""
        deadline = self.clock() + timeout
        while True:
            entry = self.find(worker_url)
            if present and entry is not None and (healthy is None or
                                                  bool(entry.get("is_healthy")) == healthy):
                return entry
            if not present and entry is None:
                return None
            if self.clock() >= deadline:
                return entry  # the caller judges what it found at the deadline
            self.sleep(interval)


def server_mode(worker_url, key=None, timeout=10.0):
    """The server's own disaggregation_mode (its /server_info): "null", "prefill" or
    "decode"; raises RouterError when the server does not say."""
    url = normalize(worker_url) + "/server_info"
    try:
        status, info = http("GET", url, key, timeout=timeout)
    except RouterUnreachable as exc:
        raise RouterError("%s did not answer before its registration: %s" % (url, exc)) \
            from exc
    if status != 200 or not isinstance(info, dict) or "disaggregation_mode" not in info:
        raise RouterError("GET %s answered %s without disaggregation_mode: %s"
                          % (url, status, str(info)[:200]))
    return str(info["disaggregation_mode"] or "null")


def mode_refusal(worker_url, said, worker_type):
    """Why a server whose /server_info says `said` is not registered as `worker_type`, or
    None when the two agree."""
    expected = "null" if worker_type == "regular" else worker_type
    if said == expected:
        return None
    return ("%s says disaggregation_mode=%s in /server_info, and the inventory makes it %s "
            "(sglang_server_disaggregation_mode: %s): not registered, or the router would "
            "send it requests of the wrong side. Fix: deploy it again so that it runs the "
            "inventory's mode, or correct the inventory"
            % (normalize(worker_url), said,
               "a regular server" if worker_type == "regular" else "a " + worker_type,
               "null" if worker_type == "regular" else worker_type))


def view_of(entry):
    """The router's view of one worker, in the fleet's words."""
    if entry is None:
        return {"registered": False, "healthy": None, "load": None, "id": None,
                "worker_type": None}
    load = entry.get("load")
    return {"registered": True, "healthy": bool(entry.get("is_healthy")),
            "load": load if isinstance(load, int) and load >= 0 else None,
            "id": entry.get("id"), "worker_type": entry.get("worker_type") or "regular"}


def describe_view(view):
    if not view.get("registered"):
        return "not registered"
    load = view.get("load")
    side = view.get("worker_type")
    return "registered%s, %s, load %s" % (
        " as " + side if side in ("prefill", "decode") else "",
        "healthy" if view.get("healthy") else "unhealthy", "n/a" if load is None else load)


def finding(verdict, view):
    """A disagreement between the gate's verdict and the router's view, or None."""
    ready = verdict == "ready"
    if ready and not view.get("registered"):
        return ("the gate says ready but the router does not list it: it serves no traffic "
                "through the router (join it: playbooks/router.yml, or sglang-fleet watch)")
    if ready and view.get("healthy") is False:
        return ("the gate says ready but the router marks it unhealthy: the router cannot "
                "reach it or its health check fails from the router (address, key, network)")
    if not ready and view.get("registered"):
        return ("the gate says %s but the router still lists it%s: clients can be sent to it "
                "(take it out: sglang-fleet watch, or playbooks/recover.yml)"
                % (verdict, " as healthy" if view.get("healthy") else ""))
    return None


def parse_prometheus(text):
    """{(name, frozenset(labels)): value} of a Prometheus text exposition."""
    samples = {}
    for line in str(text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        labels = frozenset(_LABEL.findall(match.group(3) or ""))
        try:
            samples[(match.group(1), labels)] = float(match.group(4))
        except ValueError:
            continue
    return samples


def worker_inflight(metrics_text):
    """Running plus queued requests by SGLang's own gauges (None when it exports neither)."""
    samples = parse_prometheus(metrics_text)
    found = [v for (name, _), v in samples.items() if name in WORKER_INFLIGHT_METRICS]
    return int(sum(found)) if found else None


def router_active(metrics_text, worker_url):
    """The router's count of requests it has running on this worker (None when absent)."""
    wanted = normalize(worker_url)
    for (name, labels), value in parse_prometheus(metrics_text).items():
        if name == ROUTER_ACTIVE_METRIC and normalize(dict(labels).get("worker")) == wanted:
            return int(value)
    return None


def read_inflight(worker_metrics_url, router_metrics_url, worker_url, timeout=5.0):
    """(count, sources) of the requests still running on a worker: the larger of what the worker
    reports and what the router counts, from whichever answers; count None when neither."""
    counts, sources = [], []
    for url, reader, label in ((worker_metrics_url, worker_inflight, "worker /metrics"),
                               (router_metrics_url, None, "router gauge")):
        if not url:
            continue
        try:
            status, text = http("GET", url, timeout=timeout)
        except RouterUnreachable:
            continue
        if status != 200:
            continue
        value = reader(text) if reader else router_active(text, worker_url)
        if value is not None:
            counts.append(value)
            sources.append(label)
    return (max(counts) if counts else None), sources


def drain(read, timeout, interval, clock=time.monotonic, sleep=time.sleep):
    """Wait until the worker has nothing in flight (two readings in a row, `interval` apart: a
    request routed just before the removal may still be on its way), or until `timeout`.
    `read()` returns (count or None, sources). Returns the report."""
    start = clock()
    first, sources = read()
    last, zeros, readings = first, 1 if first == 0 else 0, 1
    while zeros < 2 and clock() - start < timeout:
        sleep(min(interval, max(0.0, timeout - (clock() - start))))
        value, now = read()
        readings += 1
        if value is not None:
            last, sources = value, now
            first = value if first is None else first
        zeros = zeros + 1 if value == 0 else 0
    report = {"seconds": round(clock() - start, 2), "inflight_at_start": first,
              "inflight_left": last, "timed_out": zeros < 2 and timeout > 0,
              "sources": sources, "readings": readings}
    if timeout <= 0:
        report["note"] = "no drain (sglang_router_drain_timeout is 0)"
    elif last is None:
        report["note"] = ("no in-flight count available (the worker's /metrics needs "
                          "--enable-metrics; the router counts load only for cache_aware and "
                          "power_of_two): waited the whole drain timeout of %ss" % timeout)
    elif report["timed_out"]:
        report["note"] = ("drain timeout of %ss hit with %s request(s) still running: the "
                          "restart cuts them" % (timeout, last))
    return report


# ---- the router report: asked by the router's check when it changed nothing (routernode),
# ---- else in its own module run, which needs nothing else of the node

# One short request answered through the router: the smallest proof it serves.
PROMPT = {"messages": [{"role": "user", "content": "Say hello in eight tokens."}],
          "max_tokens": 8, "temperature": 0}


def ask(url, admin_key=None, api_key=None, timeout=60.0, request=None):
    """The router's workers and one request answered through it, in one visit: {workers,
    workers_error, status (None when nothing answered), answer, error}. `request(workers)`
    says whether to send the request, given the workers listed (always, without it)."""
    out = {"workers": [], "workers_error": None, "status": None, "answer": None, "error": None}
    try:
        status, body = http("GET", url + "/workers", admin_key, timeout=10)
        if status == 200 and isinstance(body, dict):
            out["workers"] = list(body.get("workers") or [])
        else:
            out["workers_error"] = "%s %s" % (status, str(body)[:200])
    except RouterUnreachable as exc:
        out["workers_error"] = str(exc)
    if request is not None and not request(out["workers"]):
        return out
    try:
        out["status"], body = http("POST", url + "/v1/chat/completions", api_key, PROMPT,
                                   timeout=timeout)
    except RouterUnreachable as exc:
        out["error"] = str(exc)
        return out
    if out["status"] == 200 and isinstance(body, dict):
        out["answer"] = body
    else:
        error = body.get("error") if isinstance(body, dict) else None
        out["error"] = str(error if error is not None else body)
    return out


def report_line(router, seen):
    """The router's report: where it serves, its workers, and the request answered."""
    workers = seen["workers"]
    answer = seen["answer"] or {}
    usage = answer.get("usage") or {}
    choices = answer.get("choices") or [{}]
    content = str((choices[0].get("message") or {}).get("content") or "").strip()
    if len(content) > 65:  # as Jinja's truncate(60) shortens it
        content = content[:57].rsplit(" ", 1)[0] + "..."
    return ('%s: serving at %s (sglang-router %s, policy %s): %d workers registered, %d '
            'healthy; one request answered through it: %s tokens, "%s"'
            % (router["name"], router["url"], router["version"], router["policy"],
               len(workers), len([w for w in workers if w.get("is_healthy")]),
               usage.get("completion_tokens"), content))


def report_failure(router, seen):
    """Why the report fails: what the router answered, and the fix."""
    return ("%s: the router at %s answered %s to one request (%s); %d workers registered. "
            "Fix: deploy the servers (deploy.yml), then playbooks/router.yml; "
            "`playbooks/health.yml` shows each one's verdict beside the router's view"
            % (router["name"], router["url"], seen["status"] or "nothing",
               str(seen["error"])[:200], len(seen["workers"])))


def router_verdict(router, seen, fleet_stopped=False):
    """The router's own verdict, from one visit (ask()): `ready` when it lists a healthy worker
    and answers a request through it, `unhealthy` when it answers but serves nothing (no healthy
    worker, or the request failed), `absent` when nothing answers at its URL, `stopped` when
    nothing answers and every server of its fleet was stopped by an operator (`fleet_stopped`:
    the fleet is down on purpose). Clients reach the fleet only through it: health fails on
    anything but ready or stopped. Shaped as a server's verdict (verdict, reason, headline,
    progress_text, advice) with its worker counts under `router`."""
    workers = seen["workers"]
    healthy = len([w for w in workers if w.get("is_healthy")])
    counts = "%d of %d workers healthy" % (healthy, len(workers))
    redeploy = ("ansible-playbook deploy.yml --limit %s (it re-adds every ready server of its "
                "fleet)" % router["name"])
    if seen["status"] is None and seen["workers_error"] and not workers and fleet_stopped:
        verdict = "stopped"
        reason = ("nothing answers at %s, and every server of its fleet was stopped by "
                  "stop.yml" % router["url"])
        advice = "start the fleet: ansible-playbook deploy.yml"
    elif seen["status"] is None and seen["workers_error"] and not workers:
        verdict = "absent"
        reason = ("nothing answers at %s (%s): no client reaches the fleet"
                  % (router["url"], seen["error"] or seen["workers_error"]))
        advice = "start it: " + redeploy
    elif not healthy:
        verdict = "unhealthy"
        reason = ("it answers but lists no healthy worker (%d registered): every request "
                  "through it fails (%s %s)" % (len(workers), seen["status"],
                                                str(seen["error"])[:160]))
        advice = ("`sglang-fleet health` shows each server's verdict: deploy or recover the "
                  "servers, or " + redeploy)
    elif seen["status"] != 200:
        verdict = "unhealthy"
        reason = ("%s, but a request through it answered %s (%s)"
                  % (counts, seen["status"] or "nothing", str(seen["error"])[:160]))
        advice = "its log says why; " + redeploy
    else:
        verdict, reason, advice = "ready", counts + "; one request answered through it", None
    gate = {"verdict": verdict, "phase": None, "reason": reason, "progress_text": counts,
            "headline": "%s: %s" % (verdict, reason), "cause": None, "advice": advice,
            "router": {"registered": len(workers), "healthy": healthy}}
    if verdict == "stopped":
        gate["stopped_by"] = "stop.yml"  # with its servers: health passes it, as theirs
    return gate
