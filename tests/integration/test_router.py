"""The real router (the pinned sglang-router wheel, in its own virtualenv) in front of a simulated
fleet: the gate decides membership, a rolling change drops no request, a hung worker leaves the
router before it is killed, bad router settings are refused before anything is touched, and the
router's keys never show."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import requests
import yaml

from sglang_fleet.bench.loadgen import Load, summarize
from sglang_fleet.node.process import procs
from sglang_fleet.runs.runner import playbook_run
from sglang_fleet.testfleet.local import (
    BIN,
    REPO,
    ansible_env,
    free_port_block,
    loopback_http_server,
    make_fleet,
    run_playbook,
    sglang_fleet,
    wait_for,
)
from sglang_fleet.testfleet.router import registered, router_venv

pytestmark = pytest.mark.integration

ROUTER_KEY = "rk" + secrets.token_hex(12)
ADMIN_KEY = "cp" + secrets.token_hex(12)
SERVER_KEY = "sk" + secrets.token_hex(12)
KEYS = {"router client key": ROUTER_KEY, "control-plane key": ADMIN_KEY,
        "server key": SERVER_KEY}


@pytest.fixture(scope="session")
def venv(tmp_path_factory):
    return router_venv(tmp_path_factory.getbasetemp().parent)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, venv):
    tmp = tmp_path_factory.mktemp("routed")
    fleet = make_fleet(tmp, hosts=2, time_factor=0.005, router=venv)
    # Secrets in the inventory, where an operator keeps them (ansible-vault on a real fleet).
    fleet.update_group_vars("sglang_routers", {
        "sglang_router_api_key": ROUTER_KEY,
        "sglang_router_control_plane_api_keys": [
            {"id": "fleet", "name": "sglang-fleet", "role": "admin", "key": ADMIN_KEY}]})
    fleet.update_group_vars("sglang_servers", {
        "sglang_server_api_key": SERVER_KEY,
        # SGLang's /health answers 503 after this long when generation hangs (20 s by default).
        "sglang_server_extra_env": {"SGLANG_ENABLE_JIT_DEEPGEMM": 0,
                                    "SGLANG_HEALTH_CHECK_TIMEOUT": 2}})
    fleet.outputs = []
    fleet.first = fleet.deploy()
    fleet.outputs.append(fleet.first.output)
    yield fleet
    fleet.outputs.append(fleet.stop().output)
    fleet.kill_leftovers()


def view(fleet) -> dict[str, bool]:
    return registered(fleet.router_url, ADMIN_KEY)


def router_pid(fleet) -> int:
    port = fleet.extra["sglang_fleet_router_port"]
    return json.loads((fleet.router_root / "run" / f"sglang-router-{port}.pid").read_text())["pid"]


# Tasks that run on the controller only: everything else is a module run on a host.
_CONTROLLER_ACTIONS = {"set_fact", "assert", "debug", "fail", "include_tasks", "include_role",
                       "import_tasks", "validate_argument_spec", "meta"}


def module_runs(events: list[dict], host: str, play: str) -> list[str]:
    """The modules run for one host (its delegated runs included) in the plays whose name
    starts with `play`."""
    out = []
    for event in events:
        data = event.get("event_data") or {}
        if event["event"] not in ("runner_on_ok", "runner_on_failed") or \
                data.get("host") != host or not str(data.get("play")).startswith(play):
            continue
        action = str(data.get("task_action")).rpartition(".")[2]
        if action not in _CONTROLLER_ACTIONS:
            out.append(action)
    return out


def deploy_events(fleet, *cmdline: str) -> tuple[int, list[dict], str]:
    """deploy.yml run through ansible-runner: its rc, events and output."""
    with playbook_run("deploy.yml", inventory=str(fleet.inventory), extravars=fleet.extra,
                      cmdline=" ".join(cmdline) or None) as run:
        events = list(run.events)
        rc = run.rc
    output = "\n".join(e.get("stdout", "") for e in events)
    fleet.outputs.append(output)
    return rc, events, output


def changed_hosts(events: list[dict]) -> set[str]:
    stats = next(e["event_data"] for e in events if e["event"] == "playbook_on_stats")
    return {h for h, n in (stats.get("changed") or {}).items() if n}


def cli(fleet, *args: str):
    run = sglang_fleet(*args, "-i", str(fleet.inventory), "-e", json.dumps(fleet.extra))
    fleet.outputs.append(run.stdout)
    return run


def test_deploy_brings_up_the_router_and_answers_through_it(fleet):
    run = fleet.first
    assert run.rc == 0, run.output[-3000:]
    assert not run.failed_hosts() and set(run.recap) == {*fleet.hosts, "sim-router"}
    assert (f"sim-router: serving at {fleet.router_url} (sglang-router 0.3.2, policy "
            "cache_aware): 2 workers registered, 2 healthy; one request answered through it: "
            "8 tokens") in " ".join(run.output.split())
    for host in fleet.hosts:
        assert f"{host}: joined router sim-router ({fleet.url(host)})" in run.output
    assert view(fleet) == {fleet.url(h): True for h in fleet.hosts}
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
    assert requests.post(f"{fleet.router_url}/generate", json=body, timeout=30).status_code == 401
    answer = requests.post(f"{fleet.router_url}/generate", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {ROUTER_KEY}"})
    assert answer.status_code == 200 and answer.json()["meta_info"]["completion_tokens"] == 4
    # The worker API wants the control-plane key, not the clients' one.
    assert requests.get(f"{fleet.router_url}/workers", timeout=10, headers={
        "Authorization": f"Bearer {ROUTER_KEY}"}).status_code == 401

    pid, chats = router_pid(fleet), router_chats(fleet)
    rc, events, output = deploy_events(fleet)
    assert rc == 0 and changed_hosts(events) == set(), output[-3000:]
    assert router_pid(fleet) == pid
    # A re-run with nothing to change: one module run on the router's host, in the servers'
    # play and the task that checks their nodes (sglang_node runs sglang_router_node there),
    # to check, write and start it (it asks /liveness) and to make the report's one visit; the
    # report shows that visit without asking again, and no server asks the router again.
    assert module_runs(events, "sim-router", "Deploy SGLang's router") == []
    assert module_runs(events, "sim-router", "Deploy SGLang servers") == ["sglang_node"]
    node_check = {e["event_data"]["host"] for e in events if e["event"] == "runner_on_ok"
                  and e["event_data"].get("task") == "Check the node for this deployment, "
                  "in one pass"}
    assert node_check == {*fleet.hosts, "sim-router"}
    assert module_runs(events, "sim-router", "Show each router") == []
    assert router_chats(fleet) == chats + 1
    for host in fleet.hosts:
        assert "sglang_router_member" not in module_runs(events, host, "Deploy SGLang servers")
    text = " ".join(output.split())
    assert "sim-router: router running at" in text
    assert "2 workers registered, 2 healthy; one request answered through it" in text


def router_chats(fleet) -> int:
    """The chat requests the router finished (its access log's lines)."""
    return sum("uri=/v1/chat/completions" in line and "finished processing" in line
               for line in fleet.router_log.read_text(errors="replace").splitlines())


def router_starts(fleet) -> int:
    return fleet.router_log.read_text(errors="replace").count("===== sglang-fleet: start")


def test_a_changed_router_setting_restarts_the_router_once(fleet):
    pid, starts = router_pid(fleet), router_starts(fleet)
    script = next((fleet.router_root / "conf").glob("*.launch.sh"))
    fleet.update_group_vars("sglang_routers", {"sglang_router_health_check_interval_secs": 7})

    rc, events, output = deploy_events(fleet, "--check", "--diff")
    assert rc == 0 and changed_hosts(events) == {"sim-router"}, output[-3000:]
    assert "-    --health-check-interval-secs 5 \\" in output
    assert "+    --health-check-interval-secs 7 \\" in output
    # The env file's diff: its keys as fingerprints (the keys test scans this output too).
    assert "SGLANG_ROUTER_API_KEY=******** (sha256:" in output
    assert router_pid(fleet) == pid and "--health-check-interval-secs 5" in script.read_text()

    rc, events, output = deploy_events(fleet, "--diff")
    text = " ".join(output.split())
    assert rc == 0, output[-3000:]
    assert router_pid(fleet) != pid and router_starts(fleet) == starts + 1
    assert text.count("sim-router: router restarted at") == 1
    assert module_runs(events, "sim-router", "Deploy SGLang servers") == ["sglang_node"]
    # It starts with no workers: each ready server joins it again in the same run.
    for host in fleet.hosts:
        assert f"{host}: joined router sim-router" in text
    assert view(fleet) == {fleet.url(h): True for h in fleet.hosts}
    # The servers joined after the router's check: the report asks the router itself.
    assert module_runs(events, "sim-router", "Show each router") == ["sglang_router_probe"]
    assert "2 workers registered, 2 healthy; one request answered through it" in text

    pid = router_pid(fleet)
    rc, events, output = deploy_events(fleet)
    assert rc == 0 and changed_hosts(events) == set(), output[-3000:]
    assert router_pid(fleet) == pid and router_starts(fleet) == starts + 1


def test_a_rolling_change_drains_each_worker_and_drops_no_request(fleet):
    before = {h: fleet.server_pid(h) for h in fleet.hosts}
    for host in fleet.hosts:
        fleet.set_host_vars(host, {"sglang_server_num_continuous_decode_steps": 2})
    load = Load(fleet.router_url, clients=3, max_new_tokens=24, duration=300,
                api_key=ROUTER_KEY).start()
    time.sleep(1.5)
    run = fleet.deploy("-e", "sglang_fleet_serial=1")
    fleet.outputs.append(run.output)
    time.sleep(1.5)
    load.stop()
    result = summarize(load.wait())
    assert run.rc == 0, run.output[-3000:]
    assert all(fleet.server_pid(h) != before[h] for h in fleet.hosts)
    assert result["failed"] == 0, result["failures"][:5]
    assert result["sent"] >= 10
    text = " ".join(run.output.split())
    one, two = fleet.hosts
    # Each worker leaves and drains, restarts, is gated and rejoins before the next one leaves.
    order = [text.index(f"{one}: left router sim-router"), text.index(f"{one}: ready at"),
             text.index(f"{one}: joined router sim-router"),
             text.index(f"{two}: left router sim-router"), text.index(f"{two}: ready at"),
             text.index(f"{two}: joined router sim-router")]
    assert order == sorted(order)
    assert text.count("; drained in ") == 2
    assert view(fleet) == {fleet.url(h): True for h in fleet.hosts}


def test_a_hung_worker_leaves_the_router_before_it_is_killed_and_rejoins(fleet, tmp_path):
    host = fleet.hosts[0]
    url, pid = fleet.url(host), fleet.server_pid(host)
    samples: list[tuple[float, bool, bool]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                listed = url in view(fleet)
            except requests.RequestException:
                continue
            info = procs.process_info(pid)
            samples.append((time.monotonic(), listed, bool(info) and info["state"] != "Z"))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    os.kill(pid, signal.SIGUSR1)  # generation hangs from now on, requests in flight included
    run = cli(fleet, "watch", "--recover", "--count", "1", "--interval", "1",
              "--run-dir", str(tmp_path / "watch"))
    stop.set()
    sampler.join()
    assert f"{host} unhealthy" in run.stdout, run.stdout[-3000:]
    assert f"{host}: router sim-router: registered" in run.stdout and "removed it" in run.stdout
    assert f"{host}: recovered" in run.stdout
    removed = next(t for t, listed, _ in samples if not listed)
    killed = next(t for t, _, alive in samples if not alive)
    assert removed < killed, "the worker was killed while the router still listed it"
    # It came back only as a new server, once recovery had redeployed it and its gate said ready.
    rejoined = next((t for t, listed, _ in samples if t > removed and listed), None)
    assert rejoined is None or rejoined > killed
    wait_for(lambda: view(fleet).get(url), timeout=30)
    assert fleet.server_pid(host) != pid


def test_a_recovery_limited_to_one_server_takes_it_out_of_its_router_and_back(fleet, tmp_path):
    """`recover --limit HOST` leaves the router's host out of the run: the hung server still
    leaves its router before it is stopped, and joins it again once recovered ready."""
    host = fleet.hosts[1]
    url, pid = fleet.url(host), fleet.server_pid(host)
    os.kill(pid, signal.SIGUSR1)  # generation hangs from now on
    run = cli(fleet, "recover", "--limit", host, "--run-dir", str(tmp_path / "recover"))
    out = " ".join(run.stdout.split())
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"HEALTH [{host}] unhealthy" in run.stdout
    assert out.index(f"[{host}] left router sim-router") < out.index(f"[{host}] joined router")
    assert f"[{host}] recovered: configuration" in out and "restart on the same" in out
    assert fleet.server_pid(host) != pid
    wait_for(lambda: view(fleet).get(url), timeout=30)


def test_membership_follows_the_verdict_and_health_reports_the_disagreement(fleet, tmp_path):
    host = fleet.hosts[1]
    url = fleet.url(host)
    procs.signal_pids([p["pid"] for p in fleet.processes(host)], signal.SIGKILL)
    wait_for(lambda: not fleet.processes(host), timeout=10)

    health = run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra)
    fleet.outputs.append(health.output)
    text = " ".join(health.output.split())
    assert f"{host}: router sim-router: registered" in text
    assert "(gate: crashed); FINDING: the gate says crashed but the router still lists it" in text
    assert url in view(fleet), "health.yml reports; it does not change membership"

    watched = cli(fleet, "watch", "--count", "1", "--run-dir", str(tmp_path / "watch"))
    assert f"{host} crashed" in watched.stdout and "removed it" in watched.stdout
    assert url not in view(fleet) and view(fleet).get(fleet.url(fleet.hosts[0]))

    # playbooks/router.yml reconciles the same way: the crashed server stays out.
    reconciled = run_playbook("playbooks/router.yml", fleet.inventory, fleet.extra)
    fleet.outputs.append(reconciled.output)
    assert reconciled.rc == 0 and reconciled.changed_hosts() == set(), reconciled.output[-3000:]
    assert ("1 workers registered, 1 healthy; one request answered through it" in
            " ".join(reconciled.output.split()))
    assert url not in view(fleet)

    again = fleet.deploy("--limit", host)
    fleet.outputs.append(again.output)
    assert again.rc == 0, again.output[-3000:]
    text = " ".join(again.output.split())
    assert text.index(f"{host}: ready at") < text.index(f"{host}: joined router sim-router")
    assert view(fleet) == {fleet.url(h): True for h in fleet.hosts}


def _router_metrics(fleet, folder: Path) -> str:
    prom = folder / "fleet.prom"
    watched = cli(fleet, "watch", "--count", "1", "--run-dir", str(folder),
                  "--metrics-file", str(prom))
    assert prom.is_file(), watched.stdout[-3000:]
    return prom.read_text()


def test_health_judges_the_router_and_a_router_deployed_alone_takes_its_servers_back(
        fleet, tmp_path):
    """health (the CLI and the playbook) and watch give the router a row, a verdict and
    metrics, with one line per host before the table; a router that is down fails health;
    deployed alone (`deploy.yml --limit sim-router`) it observes the servers the run did not
    deploy and adds the ready ones back before it reports ok."""
    hosts = [*fleet.hosts, "sim-router"]
    run = cli(fleet, "health", "--run-dir", str(tmp_path / "up"))
    assert run.returncode == 0, run.stdout[-3000:]
    # The CLI's heartbeat ("... still running (30 s so far)") comes as often as the run is
    # slow: counted out.
    lines = [x for x in run.stdout.strip().splitlines() if not x.startswith("... still running")]
    for host in hosts:
        assert len([x for x in lines if f"[{host}]" in x]) == 1, (host, run.stdout)
    # One line per host, a blank line, the table's header and rows, the result line.
    assert len(lines) == len(hosts) + 1 + 1 + len(hosts) + 1, run.stdout
    assert not [x for x in lines if "deploy:" in x or x.startswith("PLAY ")], run.stdout
    assert (f"[{fleet.hosts[0]}] ready: /health answered 200; router sim-router: registered, "
            "healthy") in run.stdout
    assert re.search(r"^sim-router +ok +ready +2 of 2 workers healthy$", run.stdout, re.M)

    stopped = fleet.stop("--limit", "sim-router")
    fleet.outputs.append(stopped.output)
    assert stopped.rc == 0, stopped.output[-3000:]
    down = cli(fleet, "health", "--run-dir", str(tmp_path / "down"))
    assert down.returncode == 1, down.stdout[-3000:]
    summary = json.loads((tmp_path / "down" / "summary.json").read_text())
    assert {h: r["verdict"] for h, r in summary["hosts"].items()} == {
        **{h: "ready" for h in fleet.hosts}, "sim-router": "absent"}
    said = " ".join(down.stdout.split())
    assert f"nothing answers at {fleet.router_url}" in said and "no client reaches the fleet" \
        in said
    assert "Fix: start it: ansible-playbook deploy.yml --limit sim-router" in said
    playbook = run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra)
    fleet.outputs.append(playbook.output)
    assert playbook.rc != 0 and playbook.failed_hosts() == {"sim-router"}, playbook.output[-3000:]
    metrics = _router_metrics(fleet, tmp_path / "watch-down")
    assert 'sglang_fleet_router_ready{router="sim-router"} 0' in metrics
    assert 'sglang_fleet_router_verdict{router="sim-router",verdict="absent"} 1' in metrics

    alone = fleet.deploy("--limit", "sim-router")
    fleet.outputs.append(alone.output)
    assert alone.rc == 0, alone.output[-3000:]
    text = " ".join(alone.output.split())
    assert (f"sim-router: 2 ready server(s) this run did not deploy added back "
            f"({', '.join(fleet.hosts)})") in text
    assert "2 workers registered, 2 healthy; one request answered through it" in text
    assert view(fleet) == {fleet.url(h): True for h in fleet.hosts}
    metrics = _router_metrics(fleet, tmp_path / "watch-up")
    assert 'sglang_fleet_router_ready{router="sim-router"} 1' in metrics
    assert 'sglang_fleet_router_workers{router="sim-router",state="healthy"} 2' in metrics
    again = fleet.deploy("--limit", "sim-router")
    fleet.outputs.append(again.output)
    assert again.rc == 0 and again.changed_hosts() == set(), again.output[-3000:]


def test_a_deploy_of_one_host_never_takes_another_hosts_server_out_of_the_router(fleet):
    """The router lists workers by URL only. When another host's server serves the URL a host
    was configured for, that host's deploy leaves the URL in the router: its node says the
    port is served by another deployment (by the marker its processes carry)."""
    first, second = fleet.hosts
    taken = fleet.url(first)
    stopped = fleet.stop("--limit", f"{first},{second}")
    fleet.outputs.append(stopped.output)
    assert stopped.rc == 0, stopped.output[-3000:]
    # The second host's server moves to the port the first host is configured for, while the
    # first is configured elsewhere (one inventory with both on one port is refused by
    # `check`); then the inventory is put back with the second's server still running there,
    # as after a port change that was reverted without a deploy.
    elsewhere = free_port_block(1)

    def second_on_firsts_port() -> None:
        fleet.set_host_vars(first, {"sglang_server_port": elsewhere})
        fleet.set_host_vars(second, {"sglang_server_port": fleet.port(first)})

    def inventory_put_back() -> None:
        for host in (first, second):
            (fleet.inventory / "host_vars" / f"{host}.yml").unlink(missing_ok=True)

    second_on_firsts_port()
    try:
        moved = fleet.deploy("--limit", second)
        fleet.outputs.append(moved.output)
        assert moved.rc == 0, moved.output[-3000:]
        assert view(fleet) == {taken: True}, "the second host's server now serves that URL"
        inventory_put_back()

        clash = fleet.deploy("--limit", first)
        fleet.outputs.append(clash.output)
        text = " ".join(clash.output.split())
        assert f"{first}: left router sim-router ({taken})" not in text
        assert (f"{first}: left {taken} in router sim-router: another deployment serves that "
                f"URL (pid ") in text
        assert f"deployment {second}:Kimi-K2.5-{fleet.port(first)}, " in text
        assert view(fleet) == {taken: True}, "the other host's healthy server stays in"
        second_on_firsts_port()
        moved_back = fleet.stop("--limit", second)
        fleet.outputs.append(moved_back.output)
        assert moved_back.rc == 0, moved_back.output[-3000:]
    finally:
        inventory_put_back()
    back = fleet.deploy()
    fleet.outputs.append(back.output)
    assert back.rc == 0, back.output[-3000:]
    assert view(fleet) == {fleet.url(h): True for h in fleet.hosts}


def _node_state(fleet) -> dict[str, tuple[int, int]]:
    """Every file of the nodes and the router, with its size and modification time."""
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns)
            for root in (fleet.root, fleet.router_root) for path in root.rglob("*")
            if path.is_file() and "logs" not in path.parts}


def test_a_mistake_on_the_last_host_touches_no_host_at_all(fleet):
    """The whole inventory is checked before any play touches a node: a host refused for a
    layout its model cannot run stops the run, and every other host's files, processes and
    router membership stay as they were."""
    before = _node_state(fleet)
    pids = {host: fleet.server_pid(host) for host in fleet.hosts}
    members = view(fleet)
    last = fleet.hosts[-1]
    fleet.set_host_vars(last, {"sglang_server_tp": 3})
    try:
        run = fleet.deploy("-v")  # every play and task that ran is named
    finally:
        (fleet.inventory / "host_vars" / f"{last}.yml").unlink()
    fleet.outputs.append(run.output)
    assert run.rc == 2, run.output[-3000:]
    assert f"fatal: [{last}]: LaunchSpec refused:" in run.output
    assert "Kimi-K2.5 has 64 attention heads, which TP 3 does not divide" in run.output
    assert (f"not started: the inventory has problems on {last} (above); no node was "
            "contacted") in run.output
    for play in ("PLAY [Deploy SGLang servers]", "PLAY [Show each router"):
        assert play not in run.output
    assert _node_state(fleet) == before
    assert {host: fleet.server_pid(host) for host in fleet.hosts} == pids
    assert view(fleet) == members


def test_the_routers_log_reads_as_plain_text(fleet):
    """sglang-router colours its log whatever NO_COLOR says; the log the toolkit writes has
    its lines without the escape codes."""
    log = max((fleet.router_root / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
    text = log.read_text(errors="replace")
    assert "Starting router on 127.0.0.1" in text, text[:2000]
    assert "\x1b" not in text, repr(text[:400])
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +INFO ", text, re.M), text[:2000]


def test_the_routers_keys_never_show(fleet):
    members = procs.deployment_processes(fleet.router_marker())
    assert any(p["cmdline"] == "sglang::router" for p in members), members
    for p in members:  # what `ps` shows to every local user
        raw = Path(f"/proc/{p['pid']}/cmdline").read_bytes().decode(errors="replace")
        for name, key in KEYS.items():
            assert key not in raw, f"{name} on the router's command line: {raw}"
    env_file = next((fleet.router_root / "conf").glob("*.env"))
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    leaks = []
    for name, key in KEYS.items():
        for i, output in enumerate(fleet.outputs):
            if key in output:
                leaks.append(f"{name} in playbook/CLI output #{i}")
    roots = [fleet.root, fleet.root.parent]  # nodes, router, ledger, evidence, CLI run folders
    for root in roots:
        for path in root.rglob("*"):
            if not path.is_file() or path.suffix == ".env" or "inventory" in path.parts:
                continue
            if path.name.endswith(".config.yaml"):  # the server's --config file: 0600, as its env
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
                continue
            data = path.read_bytes()
            for name, key in KEYS.items():
                if key.encode() in data:
                    leaks.append(f"{name} in {path}")
    assert not leaks, leaks


def test_bad_router_settings_are_refused_before_anything_is_touched(tmp_path, venv):
    fleet = make_fleet(tmp_path, hosts=1, router=venv)
    fleet.update_group_vars("sglang_routers", {
        "sglang_router_policy": "cache_awre",
        "sglang_router_retry_max_retries": "lots",
        "sglang_router_extra_args": ["--worker-urls", "http://10.0.0.1:30000"]})
    run = fleet.deploy("-v")  # every play and task that ran is named
    assert run.rc != 0
    text = " ".join(run.output.split())
    for line in (
            "host sim-router: sglang_router_policy='cache_awre': is not one of sglang-router "
            "0.3.2's choices for --policy. Fix: did you mean 'cache_aware'?",
            "host sim-router: sglang_router_retry_max_retries='lots': must be an integer. "
            "Fix: set an integer in 1..100",
            "sglang_router_extra_args=['--worker-urls', 'http://10.0.0.1:30000']: "
            "--worker-urls: the router starts with no workers"):
        assert line in text, text[-3000:]
    assert "PLAY [Deploy SGLang servers]" not in run.output, \
        "a server play ran after the router was refused"
    assert not fleet.root.exists()


def test_the_shipped_catalogue_is_the_installed_routers_parser(venv):
    check = subprocess.run([sys.executable, "-m", "sglang_fleet.router.catalogue", "check",
                            "--python", str(venv / "bin" / "python")],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr


def test_a_router_beside_a_server_on_one_host_is_checked_in_the_same_task(tmp_path, venv):
    """A host in both groups: the node check's task checks its router first, then its server
    (sglang_node's action runs both modules), and a re-run changes nothing."""
    fleet = make_fleet(tmp_path, hosts=2, time_factor=0.005, router=venv)
    hosts = fleet.inventory / "hosts.yml"
    data = yaml.safe_load(hosts.read_text())
    data["all"]["children"]["sglang_routers"]["hosts"] = {"sim-node-1": None}
    hosts.write_text(yaml.safe_dump(data))
    # Its own folder beside the server's, as a real node would have (/opt/sglang-router).
    fleet.set_host_vars("sim-node-1", {"sglang_router_root": str(tmp_path / "router-on-node-1")})
    try:
        first = fleet.deploy()
        text = " ".join(first.output.split())
        assert first.rc == 0, first.output[-3000:]
        assert "sim-node-1: router started at" in text
        assert "NODE [sim-node-1]: " in text and "NODE [sim-node-2]: " in text
        assert "2 workers registered, 2 healthy; one request answered through it" in text
        again = fleet.deploy()
        assert again.rc == 0 and again.changed_hosts() == set(), again.output[-3000:]
        assert "sim-node-1: router running at" in " ".join(again.output.split())
    finally:
        # stop.yml: the router runs as sim-node-1's, outside the fleet's own markers.
        fleet.stop()
        fleet.kill_leftovers()


def test_the_routers_first_install_says_what_it_does_and_how_long_it_took(tmp_path):
    """A router host without the pinned release installs it with pip (about a minute from the
    package index): the run says so before pip starts and how long it took after. A re-run
    finds it installed and says nothing of it."""
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.005, router=tmp_path / "fresh-venv")
    try:
        first = fleet.deploy()
        text = " ".join(first.output.split())
        assert first.rc == 0, first.output[-3000:]
        said = (f"sim-router: installing sglang-router==0.3.2 with pip into {tmp_path}/fresh-venv "
                "(about a minute, from the package index; docs/router.md says how to "
                "pre-install it)")
        assert said in text
        took = re.search(r"sim-router: installed sglang-router==0.3\.2 in (\d+) s", text)
        assert took and text.index(said) < took.start() < text.index("sim-router: router "
                                                                     "started at"), text[-3000:]
        assert (tmp_path / "fresh-venv" / "bin" / "sglang-router").exists()
        again = fleet.deploy()
        assert again.rc == 0 and "installing sglang-router" not in again.output
    finally:
        fleet.kill_leftovers()


class _RouterDyingOnRemoval(BaseHTTPRequestHandler):
    """A router that lists one worker, then dies as the worker's removal reaches it."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"workers": [{"id": "w1", "url": "http://10.0.0.1:30000",
                                        "is_healthy": True, "worker_type": "regular"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def do_DELETE(self):  # noqa: N802
        self.close_connection = True  # no answer: the router is gone
        self.connection.close()

    def log_message(self, *args):
        pass


def test_a_router_killed_mid_roll_is_named_with_what_to_do():
    """A router that stops answering while a server leaves it fails the membership step with
    the router's name and the fix, not with a bare "One or more items failed"."""
    args = {"router_url": "", "router_name": "sim-router", "worker_url": "http://10.0.0.1:30000",
            "state": "absent", "timeout": 5}
    with loopback_http_server(_RouterDyingOnRemoval) as url:
        proc = subprocess.run(
            [str(BIN / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
             "-e", f"ansible_python_interpreter={sys.executable}", "-m",
             "sglang.fleet.sglang_router_member", "-a", json.dumps({**args, "router_url": url})],
            cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=120)
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, said[-2000:]
    assert ("router sim-router stopped answering while http://10.0.0.1:30000 left it (DELETE "
            f"{url}/workers/w1") in said, said[-2000:]
    assert ("no client reaches the fleet through it. Fix: start it again with ansible-playbook "
            "deploy.yml --limit sim-router (it adds back every ready server), then re-run this "
            "deploy") in said
