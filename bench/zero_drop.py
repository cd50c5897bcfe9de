"""Zero-drop: client requests through SGLang's real router while the fleet changes under them,
with the fleet's router-aware procedures and with naive ones, side by side.

    .venv/bin/python bench/zero_drop.py [--clients 8] [--tokens 48] [--scenarios a,b,c]
                                        [--pd] [--api generate|chat] [-e VAR=VALUE]
                                        [--json PATH]

One simulated fleet (four sglang-sim nodes, Kimi-K2.5 TP=8 profile) behind the real router
(the pinned sglang-router wheel, in its own virtualenv; set SGLANG_FLEET_TEST_ROUTER_VENV to
reuse one). A bounded number of streaming clients send /generate (or, with --api chat, OpenAI
chat completions) through the router, one request after another, while each scenario runs:

  (a) a rolling one-variable change across the four nodes (deploy.yml, serial 1);
  (b) a worker that hangs mid-serve (sglang-sim's SIGUSR1 switch), under `sglang-fleet watch
      --recover`;
  (c) a worker killed outright (SIGKILL to every process of its deployment), under `sglang-fleet
      watch --recover`.

"router-aware" runs the fleet's own tools on the inventory with its router: a worker leaves the
router and drains before a restart, a failed one is cut out before anything is killed, and each
rejoins once its gate says ready. "naive" runs the same tools on the same fleet through an
inventory without the router: servers restart in place and the router learns only from its own
health checks and retries.

A request counts as completed only when its stream ends with SGLang's final chunk and [DONE].
With --pd the fleet is a PD deployment behind the router in PD mode: two prefill servers
(sim-node-1, sim-node-2) and two decode servers (sim-node-3, sim-node-4), each request going
through one of each; (a) changes the prefills only (deploy.yml --limit kimi_prefill, serial 1),
and the victim of (b) and (c) is a decode (sim-node-4).

Each failed request is named, with the worker(s) the router sent it to (the router's debug log
records the worker per request id) and whether it was already running when the event began.
Servers are simulated; the router, the HTTP traffic and every time are real, on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from sglang_fleet.bench.loadgen import (
    APIS,
    Load,
    Request,
    RouterSampler,
    out_of_rotation,
    percentile,
    routed_to,
    send,
    summarize,
)
from sglang_fleet.node.process import procs
from sglang_fleet.node.router.api import parse_prometheus
from sglang_fleet.runs.store import STATE_DIR_VAR
from sglang_fleet.testfleet.local import (
    BIN,
    REPO,
    SimFleet,
    ansible_env,
    make_fleet,
    make_pd_fleet,
    run_playbook,
)
from sglang_fleet.testfleet.router import VERSION as ROUTER_VERSION
from sglang_fleet.testfleet.router import registered, router_venv

# The bench fleet: SGLang answers /health within 3 s (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s by
# default) so that a hang is called in seconds; the router logs the worker of each request
# (debug); the crash-loop guard lets the victim be recovered once per case.
BENCH_VARS = {
    "sglang_server_extra_env": {"SGLANG_ENABLE_JIT_DEEPGEMM": 0,
                                "SGLANG_HEALTH_CHECK_TIMEOUT": 3},
    "sglang_router_log_level": "debug",
    "sglang_recover_max_attempts": 10,
}
SCENARIOS = {"a": "rolling one-variable change", "b": "worker hangs mid-serve",
             "c": "worker killed outright"}
VICTIM = "sim-node-2"
# The PD fleet (--pd): its prefills' group, which (a) changes, and the decode (b) and (c) strike.
PD_PREFILLS = "kimi_prefill"
PD_VICTIM = "sim-node-4"


# SGLang's answer to a full waiting queue (scheduler.py _abort_on_queued_limit, 503): its
# clients send the request again a moment later. An overloaded fleet is not a dropped request.
QUEUE_FULL = "The request queue is full."


class OverloadRetryingLoad(Load):
    """Clients that resend a request SGLang refused with its queue-full 503 (an HTTP 503, or a
    stream ended with an abort of status 503), after a backoff, up to `retries` times; the
    request counts once, by its last attempt."""

    retries = 5

    def _send(self, session: requests.Session, record: Request, text: str) -> None:
        for attempt in range(self.retries + 1):
            super()._send(session, record, text)
            refused = record.error if record.status == 503 else record.abort
            if QUEUE_FULL not in refused or attempt == self.retries:
                break
            record.status, record.error, record.abort, record.tokens = None, "", "", 0
            time.sleep(min(0.05 * 2 ** attempt, 2.0))


def naive_inventory(fleet: SimFleet) -> Path:
    """The same fleet without its router: the tools restart servers in place, router unaware."""
    folder = fleet.inventory.parent / "inventory-naive"
    if not folder.exists():
        subprocess.run(["cp", "-r", str(fleet.inventory), str(folder)], check=True)
        hosts = yaml.safe_load((folder / "hosts.yml").read_text())
        del hosts["all"]["children"]["sglang_routers"]
        (folder / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return folder


def watch(inventory: Path, extra: dict[str, Any], run_dir: Path, count: int = 2) -> str:
    proc = subprocess.run(
        [str(BIN / "sglang-fleet"), "watch", "--recover", "--interval", "1", "--count",
         str(count), "-i", str(inventory), "-e", json.dumps(extra), "--run-dir", str(run_dir)],
        cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=600)
    return proc.stdout


def all_back(fleet: SimFleet, timeout: float = 120.0) -> str:
    """Wait until the router lists every worker healthy with its circuit closed, so that the
    next case starts from a clean router; '' or what is still missing."""
    start = time.monotonic()
    urls = {fleet.url(h) for h in fleet.hosts}
    view: dict[str, bool] = {}
    while time.monotonic() - start < timeout:
        try:
            view = registered(fleet.router_url)
            metrics = parse_prometheus(requests.get(fleet.router_metrics_url, timeout=5).text)
            # 0 closed, 1 open, 2 half-open (sglang-router's smg_worker_cb_state)
            open_circuits = {dict(labels).get("worker") for (name, labels), value
                             in metrics.items() if name == "smg_worker_cb_state" and value}
            if all(view.get(u) for u in urls) and not open_circuits & urls:
                return ""
        except requests.RequestException:
            pass
        time.sleep(0.2)
    missing = ", ".join(f"{_host(fleet, u)} {'unhealthy' if u in view else 'absent'}"
                        for u in sorted(urls) if not view.get(u))
    return f"after {timeout:.0f} s the router still lists {missing}"


def victim_of(args: argparse.Namespace) -> str:
    """The server (b) and (c) strike: a decode in a PD fleet."""
    return PD_VICTIM if args.pd else VICTIM


def run_case(fleet: SimFleet, scenario: str, procedure: str, args: argparse.Namespace,
             work: Path, step: int) -> dict[str, Any]:
    victim_host = victim_of(args)
    inventory = fleet.inventory if procedure == "router-aware" else naive_inventory(fleet)
    extra = {**fleet.extra, **BENCH_VARS}
    log_path = fleet.router_log
    log_start = log_path.stat().st_size
    victim = fleet.url(victim_host)
    load = OverloadRetryingLoad(fleet.router_url, clients=args.clients,
                                max_new_tokens=args.tokens, duration=args.max_seconds,
                                prefix=f"{scenario}{procedure[0]}", api=args.api).start()
    sampler = RouterSampler(fleet.router_url, interval=0.1).start()
    time.sleep(args.warmup)
    event = time.time()
    detail = transcript = ""
    if scenario == "a":
        limit = ("--limit", PD_PREFILLS) if args.pd else ()
        run = run_playbook("deploy.yml", inventory, {
            **extra, "sglang_server_num_continuous_decode_steps": step + 1}, "-e",
            "sglang_fleet_serial=1", *limit)
        detail = f"deploy rc {run.rc}, restarted {len(run.changed_hosts())}"
        transcript = run.output
    else:
        if scenario == "b":
            os.kill(fleet.server_pid(victim_host), signal.SIGUSR1)
        else:
            procs.signal_pids([p["pid"] for p in fleet.processes(victim_host)], signal.SIGKILL)
        out = watch(inventory, extra, work / f"watch-{scenario}-{procedure}")
        detail = next((line.split("] ", 1)[-1] for line in out.splitlines()
                       if f"{victim_host}: " in line and "recover" in line), out[-200:])
        transcript = out
    procedure_s = time.time() - event
    missing = all_back(fleet, args.rejoin_timeout)
    time.sleep(args.tail)
    load.stop()
    records = load.wait()
    samples = sampler.stop()
    with open(log_path, "rb") as f:
        f.seek(log_start)
        routes = routed_to(f.read().decode(errors="replace"))
    summary = summarize(records)
    failures = []
    for r in (x for x in records if not x.completed):
        failures.append({"rid": r.rid, "sent_s": round(r.start - event, 2),
                         "ended_s": round(r.end - event, 2), "tokens": r.tokens,
                         "error": r.error, "workers": [_host(fleet, u) for u in
                                                       routes.get(r.rid, [])],
                         "running_at_event": r.start < event})
    hosts_out = {h: round(out_of_rotation(samples, fleet.url(h)), 1) for h in fleet.hosts}
    # Requests the victim was serving when the event began (the router's log names the worker).
    on_victim = sum(1 for r in records if r.start < event < (r.end or event + 1)
                    and routes.get(r.rid, [""])[-1] == victim)
    return {"scenario": scenario, "procedure": procedure, "sent": summary["sent"],
            "completed": summary["completed"], "failed": summary["failed"],
            "p50_s": summary["p50_s"], "p99_s": summary["p99_s"],
            "out_of_rotation_s": hosts_out, "procedure_s": round(procedure_s, 1),
            "on_victim_at_event": on_victim if scenario != "a" else None,
            "victim": victim_host, "detail": detail, "not_back": missing, "failures": failures,
            "transcript": transcript, "event_at": time.strftime("%H:%M:%S", time.localtime(event))}


def _host(fleet: SimFleet, url: str) -> str:
    for host in fleet.hosts:
        if fleet.url(host) == url.rstrip("/"):
            return host
    return url


def router_overhead(fleet: SimFleet, n: int) -> dict[str, Any]:
    """Direct to a worker versus through the router, alternating, one-token /generate."""
    times: dict[str, list[float]] = {"direct": [], "router": []}
    sessions = {"direct": requests.Session(), "router": requests.Session()}
    urls = {"direct": fleet.url(fleet.hosts[0]), "router": fleet.router_url}
    for i in range(n):
        for side in (("direct", "router") if i % 2 == 0 else ("router", "direct")):
            r = Request(f"lat-{side}-{i}", time.time())
            t0 = time.perf_counter()
            send(sessions[side], urls[side], r, f"latency probe {i}", 1)
            if r.completed:
                times[side].append(time.perf_counter() - t0)
    med = {k: percentile(v, 50) for k, v in times.items()}
    p99 = {k: percentile(v, 99) for k, v in times.items()}
    return {"n": n, "direct_p50_ms": med["direct"] * 1e3, "router_p50_ms": med["router"] * 1e3,
            "direct_p99_ms": p99["direct"] * 1e3, "router_p99_ms": p99["router"] * 1e3,
            "added_p50_ms": (med["router"] - med["direct"]) * 1e3,
            "added_p99_ms": (p99["router"] - p99["direct"]) * 1e3,
            "completed": {k: len(v) for k, v in times.items()}}


def fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def table(rows: list[dict[str, Any]], victim: str) -> str:
    head = ("| scenario | procedure | sent | completed | failed | running on the victim at the "
            f"event | p50 s | p99 s | out of rotation s ({victim}; others) |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        others = [v for h, v in r["out_of_rotation_s"].items() if h != victim]
        rotation = f"{r['out_of_rotation_s'][victim]:.1f}; " + \
            "/".join(f"{v:.1f}" for v in others)
        lines.append(f"| ({r['scenario']}) {SCENARIOS[r['scenario']]} | {r['procedure']} | "
                     f"{r['sent']} | {r['completed']} | {r['failed']} | "
                     f"{'-' if r['on_victim_at_event'] is None else r['on_victim_at_event']} | "
                     f"{fmt(r['p50_s'])} | "
                     f"{fmt(r['p99_s'])} | {rotation} |")
    return "\n".join(lines)


def failure_lines(rows: list[dict[str, Any]], each: int = 12) -> list[str]:
    """Every failed request by name; beyond `each` in one case, the rest counted by cause."""
    out = []
    for r in rows:
        rest: dict[str, int] = {}
        for i, f in enumerate(r["failures"]):
            where = " then ".join(f["workers"]) or "answered by the router itself"
            if i >= each:
                key = f"{where}: {f['error'][:60]}"
                rest[key] = rest.get(key, 0) + 1
                continue
            when = ("running when the event began" if f["running_at_event"] else
                    f"sent {f['sent_s']:+.2f} s after the event")
            out.append(f"({r['scenario']}) {r['procedure']}: {f['rid']} -> {where}, {when}, "
                       f"ended {f['ended_s']:+.2f} s: {f['error']}")
        for key, n in sorted(rest.items(), key=lambda kv: -kv[1]):
            out.append(f"({r['scenario']}) {r['procedure']}: ... and {n} more -> {key}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="concurrent streaming clients")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per request")
    parser.add_argument("--api", choices=APIS, default="generate",
                        help="what the clients stream: SGLang's /generate, or the OpenAI "
                             "chat completions")
    parser.add_argument("--scenarios", default="a,b,c")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before")
    parser.add_argument("--tail", type=float, default=3.0, help="seconds of load after")
    parser.add_argument("--max-seconds", type=float, default=600.0,
                        help="bound on one case's load")
    parser.add_argument("--latency-requests", type=int, default=60)
    parser.add_argument("--rejoin-timeout", type=float, default=90.0,
                        help="seconds to wait for every worker to be back in rotation")
    parser.add_argument("--pd", action="store_true",
                        help="a PD deployment: two prefills and two decodes behind the router "
                             "in PD mode")
    parser.add_argument("--json", help="write every figure and failure here")
    parser.add_argument("-e", "--extra", action="append", default=[], metavar="VAR=VALUE",
                        help="inventory variable for the run, e.g. "
                             "sglang_router_cb_failure_threshold=10 (the router's default)")
    args = parser.parse_args()
    for item in args.extra:
        name, _, value = item.partition("=")
        BENCH_VARS[name] = yaml.safe_load(value)
    with tempfile.TemporaryDirectory(prefix="zero-drop-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ[STATE_DIR_VAR] = str(tmp / "state")
        router = router_venv(tmp)
        fleet = (make_pd_fleet(tmp, router=router, prefills=2, decodes=2) if args.pd else
                 make_fleet(tmp, hosts=4, time_factor=0.01, router=router))
        try:
            first = fleet.deploy(extra=BENCH_VARS)
            if first.rc != 0:
                print(first.output[-3000:])
                return 1
            all_back(fleet)
            # A request straight to one PD server is not a request SGLang serves alone.
            latency = None if args.pd else router_overhead(fleet, args.latency_requests)
            rows = []
            for step, scenario in enumerate(args.scenarios.split(",")):
                for procedure in ("router-aware", "naive"):
                    # (a) sets a new value each time, so that every run restarts all four.
                    rows.append(run_case(fleet, scenario, procedure, args, tmp,
                                         2 + 2 * step + (procedure == "naive")))
                    print(f"({scenario}) {procedure}: {rows[-1]['sent']} sent, "
                          f"{rows[-1]['failed']} failed; {rows[-1]['detail']} "
                          f"{rows[-1]['not_back']}", flush=True)
        finally:
            fleet.stop()
            fleet.kill_leftovers()
    print()
    victim = victim_of(args)
    shape = ("a PD deployment: prefills sim-node-1/2, decodes sim-node-3/4, the router in PD "
             "mode; (a) changes the prefills only" if args.pd else "4 nodes")
    print(f"SIMULATED workers (sglang-sim, Kimi-K2.5 TP=8 profile; {shape}) behind the real "
          f"router (sglang-router {ROUTER_VERSION}); {args.clients} clients streaming "
          f"{'/generate' if args.api == 'generate' else 'chat completions'}, "
          f"{args.tokens} tokens per request; victim of (b) and (c): {victim}; "
          f"{' '.join(args.extra) or 'default inventory settings'}")
    print(table(rows, victim))
    print()
    for line in failure_lines(rows):
        print(line)
    print()
    if latency:
        lat = latency
        print(f"router overhead on loopback, one-token /generate, {lat['n']} requests each way, "
              f"alternating: direct p50 {lat['direct_p50_ms']:.2f} ms, through the router p50 "
              f"{lat['router_p50_ms']:.2f} ms (+{lat['added_p50_ms']:.2f} ms); p99 "
              f"{lat['direct_p99_ms']:.2f} / {lat['router_p99_ms']:.2f} ms "
              f"(+{lat['added_p99_ms']:.2f} ms)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "latency": latency}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
