"""Shared test helpers: real ansible-playbook runs against a simulated fleet in a temp folder."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
ROLE_DEFAULTS = REPO / "roles" / "sglang_server" / "defaults" / "main.yml"
_RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                    r"\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)


# Stall windows short enough for a test to see a hang in seconds, long enough for the simulated
# phases at test time factors.
FAST_GATE = {"sglang_server_gate_stall_windows": {
    "launching": 20, "loading_weights": 3, "allocating_kv_cache": 5,
    "capturing_cuda_graph": 3, "starting_http": 5, "warming_up": 5}}


def role_defaults() -> dict[str, Any]:
    return yaml.safe_load(ROLE_DEFAULTS.read_text())


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")})
    return env


@dataclass
class PlaybookRun:
    rc: int
    output: str
    recap: dict[str, dict[str, int]] = field(default_factory=dict)

    def changed_hosts(self) -> set[str]:
        return {h for h, r in self.recap.items() if r["changed"]}

    def failed_hosts(self) -> set[str]:
        return {h for h, r in self.recap.items() if r["failed"] or r["unreachable"]}


def run_playbook(playbook: str, inventory: Path | str, extra: dict[str, Any] | None = None,
                 *args: str, timeout: float = 600) -> PlaybookRun:
    cmd = [str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, *args]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(), capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    recap = {m[0]: dict(zip(("ok", "changed", "unreachable", "failed", "skipped", "rescued",
                             "ignored"), map(int, m[1:]), strict=True))
             for m in _RECAP.findall(out)}
    return PlaybookRun(proc.returncode, out, recap)


def sglang_fleet(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """The sglang-fleet command line, as a user runs it (stdout and stderr together)."""
    return subprocess.run([str(BIN / "sglang-fleet"), *args], cwd=REPO, env=ansible_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def _below_ephemeral_ports() -> int:
    """The first port the kernel hands out to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Every port this process has handed out: a block is chosen before its programs bind it (a
# staged deploy binds its servers' ports minutes later), so a free-looking port may be promised.
_HANDED_OUT: set[int] = set()


def _port_range(low: int, top: int) -> range:
    """This process's share of [low, top): under pytest-xdist each worker draws from a slice of
    its own, so that no two workers promise the same port (each only sees bound ports)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2:
        return range(low, top)
    width = (top - low) // count
    start = low + int(worker[2:]) % count * width
    return range(start, start + width)


def own_ports() -> range:
    """The ports this process draws its blocks from: its share of those below the ephemeral
    range."""
    return _port_range(10000, max(_below_ephemeral_ports(), 12000))


def free_port_block(count: int) -> int:
    """A base port with `count` free consecutive loopback ports, below the ephemeral range
    (a port in it can be taken by any outgoing connection, a health probe's or Ansible's,
    between this check and the server's bind), none of them handed out before by this process,
    and in this pytest-xdist worker's own slice."""
    ports = own_ports()
    for _ in range(200):
        base = random.randint(ports.start, ports.stop - count)
        block = set(range(base, base + count))
        if block & _HANDED_OUT:
            continue
        try:
            for port in block:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        _HANDED_OUT.update(block)
        return base
    raise RuntimeError("no free port block")


@dataclass
class SimFleet:
    """A copy of the default inventory whose nodes live under a temp root on free ports."""

    inventory: Path
    root: Path
    base_port: int
    hosts: list[str]
    extra: dict[str, Any]
    # Hosts that serve on another host's port: the nodes of a multi-node group share rank 0's.
    shared_port: dict[str, str] = field(default_factory=dict, kw_only=True)
    # Hosts that serve another model than Kimi-K2.5 (its served name names the deployment).
    served_names: dict[str, str] = field(default_factory=dict, kw_only=True)
    # Routers of their own (make_models_fleet): each router host's port.
    router_ports: dict[str, int] = field(default_factory=dict, kw_only=True)
    # make_pd_fleet's prefills' KV bootstrap ports start here, one each.
    bootstrap_base: int = field(default=0, kw_only=True)

    def host_root(self, host: str) -> Path:
        return self.root / host

    def port(self, host: str) -> int:
        return self.base_port + self.hosts.index(self.shared_port.get(host, host))

    def deployment(self, host: str) -> str:
        """The deployment's name on its node: served model name and port."""
        return f"{self.served_names.get(host, 'Kimi-K2.5')}-{self.port(host)}"

    def marker(self, host: str) -> str:
        return f"{host}:{self.deployment(host)}"

    def url(self, host: str) -> str:
        return f"http://127.0.0.1:{self.port(host)}"

    def deploy(self, *args: str, extra: dict[str, Any] | None = None) -> PlaybookRun:
        return run_playbook("deploy.yml", self.inventory, {**self.extra, **(extra or {})}, *args)

    def stop(self, *args: str) -> PlaybookRun:
        return run_playbook("playbooks/stop.yml", self.inventory, self.extra, *args)

    def with_stores(self, **more: Any) -> dict[str, Any]:
        """The fleet's extra vars (its ledger, results store and evidence are inside its own
        folder, as make_fleet sets them) with more on top."""
        return {**self.extra, **more}

    def read_store(self, name: str) -> list[dict[str, Any]]:
        path = self.root.parent / name
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def set_host_vars(self, host: str, values: dict[str, Any]) -> None:
        path = self.inventory / "host_vars" / f"{host}.yml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(values))

    def update_group_vars(self, group: str, values: dict[str, Any]) -> None:
        """Set `values` in the group's vars file, beside what it holds (secrets go here, where
        an operator keeps them: ansible-vault on a real fleet)."""
        path = self.inventory / "group_vars" / f"{group}.yml"
        data = yaml.safe_load(path.read_text()) if path.exists() else None
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump({**(data or {}), **values}, sort_keys=False))

    def main_pid(self, host: str) -> int | None:
        state = self.host_root(host) / "run" / f"{self.deployment(host)}.pid"
        try:
            return json.loads(state.read_text())["pid"]
        except (OSError, ValueError, KeyError):
            return None

    def log_file(self, host: str) -> Path:
        return self.host_root(host) / "logs" / f"{self.deployment(host)}.log"

    def processes(self, host: str) -> list[dict[str, Any]]:
        from sglang_fleet.node.process.procs import deployment_processes
        return deployment_processes(self.marker(host))

    def server_processes(self, host: str) -> list[dict[str, Any]]:
        """The server's own processes, without the supervisor's waiting shell."""
        return [p for p in self.processes(host) if not p["cmdline"].startswith("/bin/sh -c")]

    def server_pid(self, host: str) -> int:
        """The sglang-sim main process (the supervisor's own pid is its waiting shell)."""
        for p in self.server_processes(host):
            if "sglang_fleet.sim.launch_server" in p["cmdline"]:
                return int(p["pid"])
        raise RuntimeError(f"no server process for {host}")

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.extra['sglang_fleet_router_port']}"

    @property
    def router_log(self) -> Path:
        port = self.extra["sglang_fleet_router_port"]
        return self.router_root / "logs" / f"sglang-router-{port}.log"

    @property
    def router_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.extra['sglang_router_prometheus_port']}/metrics"

    @property
    def router_root(self) -> Path:
        return self.root / "sim-router"

    def routed_at(self, router: str) -> str:
        """The URL of a router of its own (make_models_fleet)."""
        return f"http://127.0.0.1:{self.router_ports[router]}"

    def router_marker(self) -> str:
        return f"sim-router:sglang-router-{self.extra['sglang_fleet_router_port']}"

    def kill_leftovers(self) -> None:
        """Safety net after a test: end processes carrying this fleet's markers, nothing else."""
        from sglang_fleet.node.process.procs import stop_deployment
        for host in self.hosts:
            stop_deployment(self.marker(host), term_timeout=5)
        if "sglang_fleet_router_port" in self.extra:
            stop_deployment(self.router_marker(), term_timeout=5)
        for name, port in self.router_ports.items():
            stop_deployment(f"{name}:sglang-router-{port}", term_timeout=5)


def tp_settings(tp: int | None) -> dict[str, Any]:
    """Settings that size every server of a test fleet at `tp` GPUs. Below Kimi-K2.5's TP=8
    (whose weights fit no fewer 96 GB GPUs) the servers load a stand-in of a model the
    toolkit does not know, so no model check refuses a layout that a fleet of many small
    simulated nodes uses only to spare the test machine."""
    if not tp:
        return {}
    settings: dict[str, Any] = dict(sglang_server_tp=tp, sglang_server_gpu_count=tp,
                                    sglang_server_sim_gpu_count=tp)
    if tp < 8:
        settings["sglang_server_model_path"] = "{{ sglang_server_root }}/models/sim-model"
    return settings


SOAK_REQUESTS = 10

# The size of a test's servers where what it checks does not depend on Kimi-K2.5's TP=8: a
# simulated server starts a scheduler per TP rank, a fresh interpreter each.
SMALL_TP = 4


def make_fleet(tmp: Path, hosts: int = 4, time_factor: float = 0.01,
               tp: int | None = None, router: Path | None = None,
               gate_poll_interval: int | None = None) -> SimFleet:
    """A copy of the default inventory with `hosts` simulated nodes (sim-node-1...), each on
    its own free loopback port under `tmp`; `tp` sizes every server (and its node's GPUs). Its
    router (sim-router) is kept only when `router` names a virtualenv with sglang-router
    installed (testfleet.router.router_venv): the role's pip step then finds the pinned release
    there instead of installing it."""
    inventory = tmp / "inventory"
    shutil.copytree(REPO / "inventory" / "local", inventory)
    names = [f"sim-node-{i}" for i in range(1, hosts + 1)]
    data = yaml.safe_load((inventory / "hosts.yml").read_text())
    data["all"]["children"]["sglang_servers"]["hosts"] = {
        name: {"sglang_sim_node_index": i} for i, name in enumerate(names)}
    if router is None:
        del data["all"]["children"]["sglang_routers"]
    (inventory / "hosts.yml").write_text(yaml.safe_dump(data))
    base = free_port_block(len(names))
    # Test speed settings go in the group's vars, so that a host's own vars can override them.
    group_vars = inventory / "group_vars" / "sglang_servers.yml"
    settings = yaml.safe_load(group_vars.read_text())
    settings.update(sglang_server_sim_time_factor=time_factor)
    # The role's default interval (the local inventory's 1 s shows progress every second):
    # each observation returns at once on a verdict or a phase change anyway, and a shorter
    # interval only re-runs the module more often, most of a first deploy's controller CPU at
    # 1 s. A test that reads the progress lines of each poll asks for 1.
    settings.update(sglang_server_gate_poll_interval=gate_poll_interval or 10)
    settings.update(tp_settings(tp))
    # A recovered server's soak: SOAK_REQUESTS, not the role's 150. What a test checks (it
    # is soaked before it rejoins, and said so) does not depend on the count, and each
    # simulated request costs a fifth of a second of a test's wall time.
    settings.update(sglang_recover_soak_requests=SOAK_REQUESTS)
    group_vars.write_text(yaml.safe_dump(settings, sort_keys=False))
    extra = {"sglang_fleet_sim_root": str(tmp / "nodes"), "sglang_fleet_sim_base_port": base,
             **own_stores(tmp)}
    if router is not None:
        port = free_port_block(2)
        extra.update(sglang_fleet_router_port=port, sglang_router_prometheus_port=port + 1,
                     sglang_router_venv=str(router))
    return SimFleet(inventory, tmp / "nodes", base, names, extra)


def make_pd_fleet(tmp: Path, decode_vars: dict[str, Any] | None = None,
                  prefill_vars: dict[str, Any] | None = None,
                  router: Path | None = None, prefills: int = 1, decodes: int = 1,
                  time_factor: float = 0.01, tp: int | None = None) -> SimFleet:
    """Simulated servers forming PD deployment kimi_pd, nixl between them: the first
    `prefills` hosts (sim-node-1...) its prefills (group kimi_prefill, each with its KV
    bootstrap server on pd_bootstrap_port(fleet, i)), the next `decodes` its decodes (group
    kimi_decode); with `router` (a virtualenv with sglang-router), sim-router in PD mode in
    front. `prefill_vars` and `decode_vars` go in each side's group_vars file, which wins over
    group_vars/sglang_servers.yml (a child group's), as an operator's would."""
    fleet = make_fleet(tmp, hosts=prefills + decodes, router=router, time_factor=time_factor,
                       tp=tp)
    fleet.bootstrap_base = free_port_block(prefills)
    hosts = fleet.inventory / "hosts.yml"
    data = yaml.safe_load(hosts.read_text())
    index = data["all"]["children"]["sglang_servers"]["hosts"]
    prefill_hosts = {name: {**index[name], "sglang_server_disaggregation_bootstrap_port":
                            pd_bootstrap_port(fleet, i)}
                     for i, name in enumerate(fleet.hosts[:prefills])}
    decode_hosts = {name: index[name] for name in fleet.hosts[prefills:]}
    data["all"]["children"]["sglang_servers"]["children"] = {"kimi_pd": {
        "vars": {"sglang_server_pd_deployment": "kimi_pd",
                 "sglang_server_disaggregation_transfer_backend": "nixl"},
        "children": {
            "kimi_prefill": {"hosts": prefill_hosts},
            "kimi_decode": {"hosts": decode_hosts}}}}
    del data["all"]["children"]["sglang_servers"]["hosts"]
    for side, own in (("prefill", prefill_vars), ("decode", decode_vars)):
        (fleet.inventory / "group_vars" / f"kimi_{side}.yml").write_text(yaml.safe_dump(
            {"sglang_server_disaggregation_mode": side, **(own or {})}))
    if router is not None:
        routers = data["all"]["children"]["sglang_routers"]
        # In PD mode the router charges a failure to both sides; the breaker would open
        # every prefill's circuit for one dead decode, and without it cache_aware re-sends a
        # request to the same decode every attempt (router_spec._warn_pd_breaker).
        routers["vars"] = {**(routers.get("vars") or {}),
                           "sglang_router_pd_disaggregation": True,
                           "sglang_router_disable_circuit_breaker": True,
                           "sglang_router_extra_args": ["--decode-policy", "round_robin"]}
    hosts.write_text(yaml.safe_dump(data))
    return fleet


def make_models_fleet(tmp: Path, models: dict[str, dict[str, Any]], router: Path,
                      time_factor: float = 0.01) -> SimFleet:
    """Several models in one inventory: each key of `models` an inventory group (a deployment)
    of one simulated server (sim-node-1, ... in order) with the value as its group's vars, and
    a router of its own, router-<group>, whose sglang_router_workers_group is that group, on a
    port of its own. `router` is a virtualenv with sglang-router installed."""
    fleet = make_fleet(tmp, hosts=len(models), router=router, time_factor=time_factor)
    hosts = fleet.inventory / "hosts.yml"
    data = yaml.safe_load(hosts.read_text())
    servers = data["all"]["children"]["sglang_servers"]
    index = servers.pop("hosts")
    servers["children"] = {group: {"hosts": {host: index[host]}}
                           for group, host in zip(models, fleet.hosts, strict=True)}
    # Each router's ports are its host's vars: extra vars would give every router the same.
    for key in ("sglang_fleet_router_port", "sglang_router_prometheus_port"):
        del fleet.extra[key]
    base = free_port_block(2 * len(models))
    routers = {}
    for i, group in enumerate(models):
        name = f"router-{group}"
        fleet.router_ports[name] = base + 2 * i
        routers[name] = {"sglang_router_workers_group": group,
                         "sglang_router_port": base + 2 * i,
                         "sglang_router_prometheus_port": base + 2 * i + 1}
    data["all"]["children"]["sglang_routers"]["hosts"] = routers
    hosts.write_text(yaml.safe_dump(data))
    for (group, settings), host in zip(models.items(), fleet.hosts, strict=True):
        (fleet.inventory / "group_vars" / f"{group}.yml").write_text(yaml.safe_dump(settings))
        if "sglang_server_served_model_name" in settings:
            fleet.served_names[host] = settings["sglang_server_served_model_name"]
    return fleet


def pd_bootstrap_port(fleet: SimFleet, prefill: int = 0) -> int:
    """The KV bootstrap port of make_pd_fleet's prefill number `prefill` (from 0)."""
    return fleet.bootstrap_base + prefill


def own_stores(folder: Path) -> dict[str, str]:
    """Extra vars that keep a fleet's ledger, results store and evidence in its own folder,
    never in the repository's stores."""
    return {"sglang_fleet_ledger": str(folder / "ledger.jsonl"),
            "sglang_fleet_results": str(folder / "results.jsonl"),
            "sglang_fleet_evidence_dir": str(folder / "evidence")}


def link_node_folder(fleet: SimFleet, host: str, name: str, target: Path) -> Path:
    """A node's `name` folder made a link to `target`, a new 0700 folder elsewhere: the
    set-up of the trials that a node folder which is a link is refused before anything is
    written through it."""
    target.mkdir()
    os.chmod(target, 0o700)
    link = fleet.host_root(host) / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1):
    """Poll until predicate() is truthy; returns its value or raises on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


@contextmanager
def loopback_http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port in a thread: yields its base URL, and shuts
    the server down on the way out."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def http_status(url: str, **kwargs: Any) -> int | None:
    try:
        return requests.get(url, timeout=kwargs.pop("timeout", 30), **kwargs).status_code
    except requests.RequestException:
        return None


@dataclass
class SimProcess:
    proc: subprocess.Popen
    log_path: Path
    marker: str
    port: int
    gpu_dir: Path
    shm_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_bytes().decode(errors="replace")  # keep \r redraws

    def lines(self) -> list[str]:
        return [x for x in re.split(r"[\r\n]+", self.log()) if x.strip()]

    def gate_params(self, state_file: Path, stacks: bool = False,
                    scale: float = 1.0) -> dict[str, Any]:
        """sglang_health's parameters for this server; with `stacks`, stack sampling on at
        the production interval, scaled (and /health's 25 s timeout with it)."""
        from sglang_fleet.node.health.stacks import SAMPLE_INTERVAL_S
        return {"marker": self.marker, "state_file": str(state_file),
                "manager": "supervisor", "unit_name": None, "log_file": str(self.log_path),
                "serves_http": True, "host": "127.0.0.1", "port": self.port,
                "health_timeout": 25.0 * scale if stacks else 2.0,
                "gpu_backend": "simulated", "sim_dir": str(self.gpu_dir), "gpu_timeout": 5.0,
                # the simulated node's kernel log, read as the gate reads /dev/kmsg
                "kernel_log": str(self.gpu_dir.parent / "kmsg"),
                "stack_sampling": stacks, "stack_interval": SAMPLE_INTERVAL_S * scale}

    def stop(self) -> None:
        from sglang_fleet.node.process.procs import stop_deployment
        stop_deployment(self.marker, term_timeout=5)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_sim(tmp: Path, *flags: str, time_factor: float = 0.005, fault: str = "",
              env: dict[str, str] | None = None, gpus: int = 8,
              model_arch: str = "DeepseekV3ForCausalLM",
              model_config: dict[str, Any] | None = None) -> SimProcess:
    """Start sglang-sim directly (no Ansible) on a provisioned simulated node in `tmp`."""
    from sglang_fleet.sim.engine.runtime import GB
    gpu_dir, model, shm = tmp / "gpus", tmp / "model", tmp / "shm"
    for d in (gpu_dir, model, shm):
        d.mkdir(parents=True, exist_ok=True)
    (gpu_dir / "devices.json").write_text(json.dumps([
        {"index": i, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition (simulated)",
         "uuid": f"GPU-sim-{i}", "compute_capability": [12, 0],
         "memory_total": int(95.59 * GB), "interconnect": "pcie"} for i in range(gpus)]))
    for i in range(gpus):
        (gpu_dir / f"nvidia{i}").touch()
    (model / "config.json").write_text(json.dumps({**(model_config or {}),
                                                   "architectures": [model_arch]}))
    for i in range(1, 5):
        with open(model / f"model-{i:05d}-of-00004.safetensors", "wb") as f:
            f.truncate(65536)
    port = free_port_block(1)
    marker = f"simtest:{port}"
    log_path = tmp / "server.log"
    full_env = dict(os.environ, SGLANG_SIM_GPU_DIR=str(gpu_dir), SGLANG_SIM_SHM_DIR=str(shm),
                    SGLANG_SIM_TIME_FACTOR=str(time_factor), SGLANG_SIM_FAULT=fault,
                    SGLANG_FLEET_DEPLOYMENT=marker, SPT_NOENV="1", **(env or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_fleet.sim.launch_server", "--model-path", str(model),
             "--served-model-name", "Kimi-K2.5", "--port", str(port), *flags],
            stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    return SimProcess(proc, log_path, marker, port, gpu_dir, shm)


def make_tp16_group(tmp: Path) -> SimFleet:
    """Two simulated nodes forming one TP=16 server, sharing model path and port as a real
    group does."""
    return add_tp16_group(make_fleet(tmp, hosts=2), tmp)


def add_tp16_group(fleet: SimFleet, tmp: Path) -> SimFleet:
    """Make the fleet's first two hosts one TP=16 server (inventory group tp16).

    Both nodes use the group's one port, as real nodes do; here they share a machine, so each
    listens on its own loopback address (rank 0 serves HTTP on 127.0.0.1, rank 1's dummy
    health server answers on 127.0.0.2) and the group's dist-init address is rank 0's, on a
    port of its own (rank 0 hosts the group's rendezvous there)."""
    first, second = fleet.hosts[:2]
    (fleet.inventory / "group_vars" / "tp16.yml").write_text(
        "sglang_server_group: tp16\nsglang_server_tp: 16\n"
        "sglang_server_dist_init_host: 127.0.0.1\n"
        f"sglang_server_dist_init_port: {free_port_block(1)}\n"
        f"sglang_server_port: {fleet.port(first)}\n"
        # Shared by the group's nodes, inside the folder that holds their roots.
        f"sglang_server_model_path: {fleet.root}/shared-models/Kimi-K2.5\n")
    hosts = (fleet.inventory / "hosts.yml").read_text()
    (fleet.inventory / "hosts.yml").write_text(
        hosts + "    tp16:\n      hosts:\n"
        f"        {first}:\n          sglang_server_host: 127.0.0.1\n"
        f"        {second}:\n          sglang_server_host: 127.0.0.2\n")
    fleet.shared_port[second] = first
    return fleet
