"""Issue 13's trials, one line each, against a simulated node: processes of others killed (by
PID reuse, in aggressive mode), secrets found outside their files, the time to recover after a
recovery was killed midway, the controller's time and memory on a YAML alias bomb, and the
checks made before a server is stopped.

    .venv/bin/python bench/safety_trials.py [--checkout PATH] [TRIAL ...]

Trials: pid_reuse, aggressive, killed_recovery, string_vars, full_log, port, model_path,
secrets, alias_bomb; the node's own safety: lock_namespace (a live lock held from another PID
namespace), empty_lock, shm_shared (cleanup in a shm folder shared with others), symlink_logs,
stop_recovery, port_change (a port change would orphan the old server),
unit_paths (a root with a space and a systemd specifier, on an isolated systemd test node);
the controller's own: orphan_run (the CLI SIGKILLed mid-gate), check_bounds (a 200,000-item
setting, a !!python/object tag), symlink_run, host_path (a host named ../escape),
lock_folder, stop_silent_lock (a stop and the 4.6-hour lock of a dead run it cannot check).
--checkout runs the playbooks of another checkout of this repository (e.g. a `git worktree`
of an older commit) with this environment, to show the same trial before a change.

Needs root: PID reuse writes /proc/sys/kernel/ns_last_pid, the full log filesystem is a
tmpfs mounted (and unmounted) in a temporary folder, lock_namespace runs a controller in a PID
namespace of its own (unshare), unit_paths boots the isolated systemd test node. Servers and
GPUs are simulated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sglang_fleet.node.process import procs
from sglang_fleet.testfleet import local as helpers

HOST = "sim-node-1"
UNHEALTHY = {"sglang_server_sim_fault": "hang_generation",
             "sglang_server_extra_env": {"SGLANG_HEALTH_CHECK_TIMEOUT": 1}}


def flat(text: str) -> str:
    return " ".join(text.split())


def failure(output: str, width: int = 160) -> str:
    """The first failure message: `FAILED! => <text>` (this project's callback) or
    `msg: <text>` (Ansible's YAML results, older checkouts)."""
    text = flat(output)
    for mark in ("FAILED! => ", "msg: "):
        at = text.find(mark)
        if at >= 0:
            return text[at + len(mark):at + len(mark) + width]
    return "-"


def host_line(output: str, host: str) -> str:
    """The health playbook's line for `host`, in either output format (a failed host's block
    starts on the line after `FAILED! =>`, indented)."""
    for line in output.splitlines():
        for mark in ("=> ", "msg: '", "    "):
            if mark + host + ":" in line:
                return line.split(mark + host + ":", 1)[1].rstrip("'").strip()
    return "-"


def session_of(sid: int) -> set[int]:
    """Live processes of a session (a killed child of this script stays a zombie)."""
    return {p for p in procs.all_pids()
            if (procs.process_info(p) or {}).get("sid") == sid
            and procs.process_info(p)["state"] not in ("Z", "X")}


def run_sessions(cli_pid: int) -> set[int]:
    """The sessions of a CLI's run: ansible-playbook's (a child of the CLI leading its own
    session) and its workers' (they call setsid)."""
    table = {p: info for p in procs.all_pids() if (info := procs.process_info(p))}
    found = {p for p, info in table.items() if info["ppid"] == cli_pid and info["sid"] == p}
    found |= {p for p, info in table.items() if info["ppid"] in found and info["sid"] == p}
    return found


def members(sessions: set[int]) -> list[dict]:
    return [info for p in procs.all_pids() if (info := procs.process_info(p))
            and info["sid"] in sessions and info["state"] not in ("Z", "X")]


def take_pid(pid: int) -> subprocess.Popen:
    """An unrelated session whose leader gets exactly `pid` (ns_last_pid + 1 is next)."""
    for _ in range(200):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(["/bin/sh", "-c", "sleep 600 & wait"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    raise RuntimeError(f"PID {pid} could not be taken")


class Trials:
    def __init__(self, work: Path):
        self.work = work

    def fleet(self, name: str) -> helpers.SimFleet:
        folder = self.work / name
        folder.mkdir()
        fleet = helpers.make_fleet(folder, hosts=1)
        fleet.extra.update(sglang_fleet_ledger=str(folder / "ledger.jsonl"),
                           sglang_fleet_evidence_dir=str(folder / "evidence"))
        return fleet

    @staticmethod
    def done(fleet: helpers.SimFleet) -> None:
        helpers.run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
        procs.stop_deployment(fleet.marker(HOST), 2, uid=None)

    @staticmethod
    def crash(fleet: helpers.SimFleet) -> int:
        recorded = fleet.main_pid(HOST)
        main = next(p for p in fleet.processes(HOST) if "launch_server" in p["cmdline"])
        os.kill(main["pid"], signal.SIGKILL)
        helpers.wait_for(lambda: procs.process_info(recorded) is None, 30)
        return recorded

    def pid_reuse(self) -> str:
        fleet = self.fleet("pid_reuse")
        try:
            fleet.deploy()
            recorded = self.crash(fleet)
            session = take_pid(recorded)
            members = helpers.wait_for(lambda: len(session_of(recorded)) == 2
                                       and session_of(recorded))
            health = helpers.run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra)
            verdict = host_line(health.output, HOST)
            helpers.run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
            killed = len(members - session_of(recorded))
            if session.poll() is None:
                os.killpg(session.pid, signal.SIGKILL)
            session.wait()
            return (f"PID reuse after a crash: gate says {verdict!r}; stop.yml killed "
                    f"{killed} of the unrelated session's {len(members)} processes")
        finally:
            self.done(fleet)

    def aggressive(self) -> str:
        fleet = self.fleet("aggressive")
        others: list[subprocess.Popen] = []
        try:
            fleet.deploy()
            node = fleet.host_root(HOST)
            for i in range(3):
                env = {"PATH": os.environ["PATH"], "SPT_NOENV": "1",
                       "SGLANG_SIM_GPU_DIR": str(node / "sim" / "gpus"),
                       "SGLANG_SIM_SHM_DIR": str(self.work), "SGLANG_SIM_TIME_FACTOR": "0.005",
                       procs.MARKER_VAR: f"{HOST}:other-{i}"}
                with open(self.work / f"other-{i}.log", "wb") as log:
                    others.append(subprocess.Popen(
                        [sys.executable, "-m", "sglang_fleet.sim.launch_server",
                         "--model-path", str(node / "models" / "Kimi-K2.5"),
                         "--port", str(helpers.free_port_block(1)), "--tp-size", "2",
                         "--base-gpu-id", str(2 * i), "--attention-backend", "triton",
                         "--disable-custom-all-reduce"],
                        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            for i in range(3):
                helpers.wait_for(lambda i=i: "fired up" in (self.work / f"other-{i}.log")
                                 .read_text(), 120)
            before = sum(len(procs.deployment_processes(f"{HOST}:other-{i}")) for i in range(3))
            self.crash(fleet)
            run = helpers.run_playbook("playbooks/recover.yml", fleet.inventory,
                                       {**fleet.extra, "sglang_recover_aggressive": True})
            after = sum(len(procs.deployment_processes(f"{HOST}:other-{i}")) for i in range(3))
            return (f"aggressive recovery beside 3 other deployments: killed {before - after} "
                    f"of their {before} processes; recover exit {run.rc}")
        finally:
            for proc in others:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self.done(fleet)

    def killed_recovery(self) -> str:
        fleet = self.fleet("killed_recovery")
        extra = {**fleet.extra, **helpers.FAST_GATE, "sglang_recover_on_failure": True}
        try:
            fleet.deploy(extra=UNHEALTHY)
            cmd = [str(helpers.BIN / "ansible-playbook"), "-i", str(fleet.inventory),
                   "playbooks/recover.yml", "-e", json.dumps(extra)]
            first = subprocess.Popen(cmd, cwd=helpers.REPO, env=helpers.ansible_env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
            # SIGKILL once its stop is done (the server is down), before its redeploy.
            helpers.wait_for(lambda: not [p for p in fleet.processes(HOST)
                                          if "launch_server" in p["cmdline"]], 300, 0.01)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            started = time.monotonic()
            run = helpers.run_playbook("playbooks/recover.yml", fleet.inventory, extra)
            took = time.monotonic() - started
            ready = helpers.http_status(fleet.url(HOST) + "/health", timeout=5) == 200
            kinds = [e["kind"] for e in fleet.read_store("ledger.jsonl")]
            return (f"recovery SIGKILLed after its stop; the next recover run: exit {run.rc} "
                    f"after {took:.0f} s, server {'ready' if ready else 'DOWN'}, ledger "
                    f"{kinds.count('recovery')} recovery / {kinds.count('recovery_outcome')} "
                    f"outcome; {failure(run.output, 90) if run.rc else ''}")
        finally:
            self.done(fleet)

    def string_vars(self) -> str:
        fleet = self.fleet("string_vars")
        try:
            fleet.deploy(extra=UNHEALTHY)
            run = helpers.run_playbook("playbooks/recover.yml", fleet.inventory, fleet.extra,
                                       "-e", "sglang_recover_max_attempts=50")
            return (f"recover -e sglang_recover_max_attempts=50: exit {run.rc}"
                    f"{'; ' + failure(run.output, 110) if run.rc else ''}")
        finally:
            self.done(fleet)

    def full_log(self) -> str:
        fleet = self.fleet("full_log")
        logs = fleet.host_root(HOST) / "logs"
        try:
            fleet.deploy()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(logs)],
                           check=True)
            with open(logs / "filler", "ab", buffering=0) as f, \
                    contextlib.suppress(OSError):
                while True:
                    f.write(b"x" * 512)
            run = fleet.deploy(extra={"sglang_server_extra_env": {
                "SGLANG_ENABLE_JIT_DEEPGEMM": 0, "SGLANG_HEALTH_CHECK_TIMEOUT": 30}})
            serving = helpers.http_status(fleet.url(HOST) + "/health", timeout=5) == 200
            return (f"deploy a change onto a full 64 KiB log filesystem: exit {run.rc}, old "
                    f"server {'still serving' if serving else 'STOPPED'}; "
                    f"{failure(run.output, 150)}")
        finally:
            subprocess.run(["umount", "-l", str(logs)], check=False)
            self.done(fleet)

    def port(self) -> str:
        fleet = self.fleet("port")
        try:
            fleet.deploy()
            fleet.stop()
            with socket.socket() as other:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                other.bind(("127.0.0.1", fleet.port(HOST)))
                other.listen()
                started = time.monotonic()
                run = fleet.deploy()
            return (f"deploy with the port held by another program: exit {run.rc} after "
                    f"{time.monotonic() - started:.0f} s; {failure(run.output, 130)}")
        finally:
            self.done(fleet)

    def model_path(self) -> str:
        fleet = self.fleet("model_path")
        outside = self.work / "model_path" / "elsewhere" / "Kimi-K2.5"
        try:
            fleet.deploy()
            run = fleet.deploy(extra={"sglang_server_model_path": str(outside)})
            written = len(list(outside.glob("*"))) if outside.exists() else 0
            return (f"deploy with a model path outside the node: exit {run.rc}, "
                    f"{written} files written outside the node root")
        finally:
            self.done(fleet)


    def secrets(self) -> str:
        """A key and a token through deploy, a refused overrides path, a recovery with its
        evidence; then every file the controller and the node wrote, and all output, scanned."""
        fleet = self.fleet("secrets")
        key, token = "sk-trial-7f3a9c1e5b2d4f60", "hf_trialTOKEN9x8y7z6w5v"
        for name, value in (("sglang_server_api_key", key), ("sglang_server_hf_token", token)):
            fleet.set_host_vars(HOST, {**yaml_host_vars(fleet), name: value})
        extra = {**fleet.extra, **helpers.FAST_GATE, "sglang_server_extra_env": {
            "SGLANG_ENABLE_JIT_DEEPGEMM": 0, "SGLANG_HEALTH_CHECK_TIMEOUT": 1}}
        runs = self.work / "secrets-runs"
        try:
            outputs = [cli("deploy", fleet, extra, runs / "deploy")]
            outputs.append(cli("deploy", fleet, {**extra, "sglang_server_overrides": {
                "sglang_server_api_key": key}}, runs / "refused"))
            main = next(p["pid"] for p in fleet.server_processes(HOST)
                        if "sglang_fleet.sim.launch_server" in p["cmdline"])
            os.kill(main, signal.SIGUSR1)  # generation hangs: unhealthy, recovered
            outputs.append(cli("recover", fleet, extra, runs / "recover"))
            env_file = fleet.host_root(HOST) / "conf" / f"Kimi-K2.5-{fleet.port(HOST)}.env"
            found, scanned = [], 0
            for path in [*self.work.rglob("*"), *fleet.host_root(HOST).rglob("*")]:
                # The secrets' own files: the inventory they are written in, the env file.
                if not path.is_file() or path == env_file or path.is_symlink() or \
                        path.is_relative_to(fleet.inventory):
                    continue
                scanned += 1
                data = path.read_bytes()
                found += [f"{path.name}: {n}" for n, v in (("key", key), ("token", token))
                          if v.encode() in data]
            found += [f"output of run {i}" for i, out in enumerate(outputs)
                      if key in out or token in out]
            return (f"secrets found outside their files: {len(found)} (scanned {scanned} "
                    f"files and 3 runs' output){': ' + ', '.join(found[:5]) if found else ''}")
        finally:
            self.done(fleet)

    def alias_bomb(self) -> str:
        """A YAML alias bomb in sglang_server_extra_args: the CLI and ansible-playbook."""
        inventory = self.work / "bomb"
        inventory.mkdir()
        lines = ['a0: &a0 ["--log-level", "info"]']
        lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 40)]
        (inventory / "hosts.yml").write_text(
            "all:\n  vars:\n" + "".join(f"    {x}\n" for x in lines)
            + "  children:\n    sglang_servers:\n      hosts:\n        n1:\n"
            + "          sglang_server_extra_args: *a39\n")
        figures = []
        # (Ansible reading the same file directly grew past 10 GB in 10 minutes here, even an
        # ad-hoc `ansible -m ping` that runs none of this project's code: ansible-core's own
        # handling of the inventory expands it. The CLI refuses the file before Ansible reads
        # it.)
        deploy = [str(helpers.BIN / "sglang-fleet"), "deploy", "-i", str(inventory),
                  "--run-dir", str(self.work / "bomb-run")]
        for label, cmd in (("sglang-fleet deploy", deploy),):
            started = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=helpers.REPO, env=helpers.ansible_env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            timer = threading.Timer(600, lambda p=proc: os.killpg(p.pid, signal.SIGKILL))
            timer.start()
            _, status, usage = os.wait4(proc.pid, 0)
            timer.cancel()
            figures.append(f"{label}: exit {os.waitstatus_to_exitcode(status)} in "
                           f"{time.monotonic() - started:.2f} s, peak {usage.ru_maxrss // 1024} MB")
        return "alias bomb (2**39 strings): " + "; ".join(figures)

    # ---- the node's own safety: locks, shared memory, links, orphans, units ----------------

    def lock_namespace(self) -> str:
        """A live lock held from another PID namespace (a container with host networking),
        renewed each second; then its holder killed."""
        fleet = self.fleet("lock_namespace")
        declares = "lease" in (helpers.REPO / "plugins" / "modules" / "sglang_lock.py").read_text()
        playbook = self.work / "lock-holder.yml"
        playbook.write_text(LOCK_HOLDER.replace("LEASE", "lease: 8" if declares else ""))
        holder = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", str(helpers.BIN / "ansible-playbook"),
             "-i", str(fleet.inventory), str(playbook), "-e", json.dumps(fleet.extra)],
            cwd=helpers.REPO, env=helpers.ansible_env(), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        lock = lock_file(fleet)
        try:
            helpers.wait_for(lambda: lock.exists() and "container" in lock.read_text(), 120)
            first = fleet.deploy()
            verdict = ("REFUSED (the holder is alive)" if first.rc else
                       "TOOK OVER the live lock and deployed")
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
            stop = helpers.run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
            time.sleep(9)  # past the 8 s lease
            second = fleet.deploy()
            taken = [e for e in ledger_of(fleet) if e.get("kind") == "lock_taken_over"]
            return (f"deploy while a run in another PID namespace renews its lock: {verdict}; "
                    f"stop.yml at once after that run is killed: exit {stop.rc}; then deploy: "
                    f"exit {second.rc}, {len(taken)} take-over(s) in the ledger")
        finally:
            if holder.poll() is None:
                os.killpg(holder.pid, signal.SIGKILL)
                holder.wait()
            self.done(fleet)

    def empty_lock(self) -> str:
        fleet = self.fleet("empty_lock")
        lock = lock_file(fleet)
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_bytes(b"")
        os.utime(lock, (time.time() - 60,) * 2)
        try:
            started = time.monotonic()
            run = fleet.deploy()
            return (f"deploy with an empty lock file: exit {run.rc} after "
                    f"{time.monotonic() - started:.0f} s; "
                    f"{failure(run.output, 110) if run.rc else 'the lock was taken over'}")
        finally:
            self.done(fleet)

    def shm_shared(self) -> str:
        """Bystanders in the deployment's shm folder, as fresh and of the same user as its
        own segments; the server SIGKILLed, then deployed again (the cleanup runs)."""
        fleet = self.fleet("shm_shared")
        try:
            fleet.deploy()
            shm = fleet.host_root(HOST) / "shm"
            own = set(shm.iterdir())
            gone = subprocess.Popen(["/bin/true"])
            gone.wait()
            bystanders = [shm / n for n in ("psm_bystander", f"torch_{gone.pid}_1804289383_0",
                                            f"sgl_shm_mq_{gone.pid}_0a1b2c3d", "nccl-Xy12")]
            for path in bystanders:
                path.write_bytes(b"x")
            self.crash(fleet)
            run = fleet.deploy()
            lost = [p.name for p in bystanders if not p.exists()]
            return (f"shm cleanup in a shared folder: {len(lost)} of {len(bystanders)} "
                    f"bystanders removed{' (' + ', '.join(lost) + ')' if lost else ''}, "
                    f"{sum(1 for p in own if not p.exists())} of the run's own {len(own)}; "
                    f"deploy exit {run.rc}")
        finally:
            self.done(fleet)

    def symlink_logs(self) -> str:
        fleet = self.fleet("symlink_logs")
        private = self.work / "symlink_logs" / "private"
        helpers.link_node_folder(fleet, HOST, "logs", private)
        try:
            run = fleet.deploy()
            return (f"logs folder a link to a 0700 folder: deploy exit {run.rc}, target now "
                    f"{os.stat(private).st_mode & 0o777:04o}, {len(list(private.iterdir()))} "
                    f"files written into it; {failure(run.output, 100) if run.rc else ''}")
        finally:
            self.done(fleet)

    def stop_recovery(self) -> str:
        from sglang_fleet.node.deploy import lock as lk
        fleet = self.fleet("stop_recovery")
        gone = subprocess.Popen(["/bin/true"])
        gone.wait()
        lock = lock_file(fleet)
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text(json.dumps({
            "owner": "recovery of sim-node-1", "purpose": "recover", "since": time.time(),
            "run": {**lk.run_identity(os.getpid()), "pid": gone.pid, "run_id": "killed"},
            "recovery": {"stage": "stopped", "failed_config_hash": "0123456789ab",
                         "verdict": {"verdict": "stalled"}, "stop": {"killed": []}}}))
        try:
            run = helpers.run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
            kinds = [e.get("kind") for e in ledger_of(fleet)]
            return (f"stop.yml after a recovery killed after its stop: exit {run.rc}, ledger "
                    f"{kinds.count('recovery')} recovery / {kinds.count('lock_taken_over')} "
                    "take-over entries")
        finally:
            self.done(fleet)

    def port_change(self) -> str:
        fleet = self.fleet("port_change")
        new_port = helpers.free_port_block(1)
        moved = f"{HOST}:Kimi-K2.5-{new_port}"
        try:
            fleet.deploy()
            run = fleet.deploy(extra={"sglang_server_port": new_port})
            old = len(fleet.server_processes(HOST))
            new = len([p for p in procs.deployment_processes(moved)
                       if not p["cmdline"].startswith("/bin/sh -c")])
            return (f"deploy again on another port: exit {run.rc}; old server "
                    f"{old} processes, new {new}"
                    f"{' (BOTH on the same GPUs)' if old and new else ''}; "
                    f"{failure(run.output, 150) if run.rc else ''}")
        finally:
            procs.stop_deployment(moved, 2, uid=None)
            self.done(fleet)

    def unit_paths(self) -> str:
        """sglang_server_root with a space and a systemd specifier, deployed onto an isolated
        systemd test node; its unit checked there with systemd-analyze verify."""
        from sglang_fleet.testfleet import systemd_node
        why = systemd_node.unavailable()
        if why:
            return f"skipped: {why}"
        fleet = systemd_node.make_systemd_fleet(self.work / "unit_paths", hosts=1)
        host = "systemd-node-1"
        try:
            root = f"{fleet.extra['sglang_fleet_sim_root']}/{host}/sglang fleet/50%d"
            fleet.set_host_vars(host, {"sglang_server_root": root})
            run = helpers.run_playbook("deploy.yml", fleet.inventory, fleet.extra)
            verify = fleet.machine(host).run("systemd-analyze", "verify", "--man=no",
                                             f"/etc/systemd/system/{fleet.unit(host)}")
            said = flat(verify.stdout + verify.stderr)[:120]
            return (f'root "/.../sglang fleet/50%d" under systemd: deploy exit {run.rc}; '
                    f"systemd-analyze verify exit {verify.returncode}{': ' + said if said else ''}")
        finally:
            helpers.run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
            fleet.close()

    # ---- the controller's own safety: runs that outlive the CLI, inputs without bound -------

    def orphan_run(self) -> str:
        """`sglang-fleet deploy` SIGKILLed mid-gate (a CI job cancelled, the OOM killer);
        then stop.yml. Only this trial's run is looked at (and killed, should it stay)."""
        folder = self.work / "orphan_run"
        folder.mkdir()
        fleet = helpers.make_fleet(folder, hosts=1, time_factor=0.05)  # slow: mid-gate
        fleet.extra.update(sglang_fleet_ledger=str(folder / "ledger.jsonl"),
                           sglang_fleet_evidence_dir=str(folder / "evidence"))
        output = folder / "out.txt"
        sessions: set[int] = set()
        run: set[tuple[int, int]] = set()  # (pid, start time) of the run's processes
        try:
            with open(output, "w") as out:
                cli_proc = subprocess.Popen(
                    [str(helpers.BIN / "sglang-fleet"), "deploy", "-i", str(fleet.inventory),
                     "--run-dir", str(folder / "run"), "-e", json.dumps(fleet.extra)],
                    cwd=helpers.REPO, env=helpers.ansible_env(), stdout=out,
                    stderr=subprocess.STDOUT)

            def gating() -> bool:
                sessions.update(run_sessions(cli_proc.pid))
                return f"GATE [{HOST}]" in output.read_text() and len(sessions) > 1

            helpers.wait_for(gating, 180, 0.2)
            run.update((p["pid"], p["start_ticks"]) for p in members(sessions))
            cli_proc.kill()
            cli_proc.wait()
            started = time.monotonic()
            left = run
            while left and time.monotonic() - started < 120:
                time.sleep(0.2)
                left = {(p["pid"], p["start_ticks"]) for p in members(sessions)} & run
            ended = (f"its {len(run)} Ansible processes ended "
                     f"{time.monotonic() - started:.1f} s after the CLI" if not left else
                     f"{len(left)} of its {len(run)} Ansible processes STILL RUNNING after "
                     "120 s")
            stop = helpers.run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
            return (f"CLI SIGKILLed mid-gate: {ended}; stop.yml exit {stop.rc}"
                    f"{'; ' + failure(stop.output, 110) if stop.rc else ''}")
        finally:
            procs.signal_pids([p["pid"] for p in members(sessions)
                               if (p["pid"], p["start_ticks"]) in run],
                              signal.SIGKILL)
            self.done(fleet)

    def check_bounds(self) -> str:
        """`sglang-fleet check` on a 200,000-item sglang_server_extra_args, and on a
        !!python/object tag."""
        figures = []
        for name, text in (("200,000-item extra_args",
                            "sglang_server_extra_args:\n" + "  - --x\n" * 200_000),
                           ("!!python/object tag",
                            "sglang_server_extra_env: !!python/object/apply:os.getcwd []\n")):
            inventory = self.work / f"check-{len(figures)}"
            (inventory / "group_vars").mkdir(parents=True)
            (inventory / "hosts.yml").write_text(
                "all:\n  children:\n    sglang_servers:\n      hosts:\n        n1:\n")
            (inventory / "group_vars" / "sglang_servers.yml").write_text(text)
            started = time.monotonic()
            proc = subprocess.Popen(
                [str(helpers.BIN / "sglang-fleet"), "check", "-i", str(inventory)],
                cwd=helpers.REPO, env=helpers.ansible_env(), stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True, start_new_session=True)
            timer = threading.Timer(900, lambda p=proc: os.killpg(p.pid, signal.SIGKILL))
            timer.start()
            said = proc.stderr.read()
            _, status, usage = os.wait4(proc.pid, 0)
            timer.cancel()
            figures.append(f"{name}: exit {os.waitstatus_to_exitcode(status)} in "
                           f"{time.monotonic() - started:.1f} s, peak "
                           f"{usage.ru_maxrss // 1024} MB "
                           f"({flat(said)[flat(said).find('sglang_server_'):][:100]})")
        return "check: " + "; ".join(figures)

    def symlink_run(self) -> str:
        fleet = self.fleet("symlink_run")
        target = self.work / "symlink_run" / "private"
        run_dir = helpers.link_node_folder(fleet, HOST, "run", target)
        try:
            run = fleet.deploy()
            written = sorted(p.name for p in target.iterdir())
            return (f"run folder a link to a 0700 folder: deploy exit {run.rc}, "
                    f"{len(written)} files written into the target"
                    f"{' (' + ', '.join(written) + ')' if written else ''}; "
                    f"{failure(run.output, 100) if run.rc else ''}")
        finally:
            run_dir.unlink()
            self.done(fleet)

    def host_path(self) -> str:
        """A host named `../escape`: its evidence would be kept in evidence/../escape/."""
        inventory = self.work / "host_path"
        inventory.mkdir()
        (inventory / "hosts.yml").write_text(
            "all:\n  children:\n    sglang_servers:\n      hosts:\n        ../escape:\n"
            "          ansible_connection: local\n")
        run = subprocess.run([str(helpers.BIN / "sglang-fleet"), "check", "-i", str(inventory)],
                             cwd=helpers.REPO, env=helpers.ansible_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=600)
        said = flat(run.stdout)
        at = said.find("inventory_hostname")
        return (f"host named ../escape: check exit {run.returncode}"
                f"{'; ' + said[at:at + 120] if at >= 0 else ''}")

    def lock_folder(self) -> str:
        fleet = self.fleet("lock_folder")
        lock = lock_file(fleet)
        lock.mkdir(parents=True)
        try:
            run = fleet.deploy()
            said = flat(run.output)
            at = said.find("is a folder")
            return (f"lock path a folder: deploy exit {run.rc}; "
                    f"{said[at:at + 130] if at >= 0 else failure(run.output, 130)}")
        finally:
            lock.rmdir()
            self.done(fleet)

    def stop_silent_lock(self) -> str:
        """A 4.6-hour lock of a dead controller this one cannot check (another machine, or a
        container seen from another container), silent for 1000 s: a deploy, then stop.yml."""
        from sglang_fleet.node.deploy import lock as lk
        fleet = self.fleet("stop_silent_lock")
        run = dict(lk.run_identity(os.getpid()), boot_id="another-kernel", pid=41,
                   host="ci-runner", run_id="container-run")
        record = lk.lock_record(f"{HOST}:Kimi-K2.5-{fleet.port(HOST)}", "deploy", run,
                                "a deploy from a container", lease=16560)
        record.update(renewed=time.time() - 1000, since=time.time() - 1000,
                      renewed_uptime=time.clock_gettime(time.CLOCK_BOOTTIME) - 1000)
        lock = lock_file(fleet)
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text(json.dumps(record))
        try:
            deploy = fleet.deploy()
            stop = helpers.run_playbook("playbooks/stop.yml", fleet.inventory, fleet.extra)
            taken = [e for e in ledger_of(fleet) if e.get("kind") == "lock_taken_over"]
            return (f"lock of a dead run it cannot check (lease 16560 s, silent 1000 s): deploy "
                    f"exit {deploy.rc}; stop.yml exit {stop.rc}, {len(taken)} take-over(s) in "
                    f"the ledger{'; ' + failure(stop.output, 100) if stop.rc else ''}")
        finally:
            self.done(fleet)


LOCK_HOLDER = """\
- hosts: sglang_servers
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: sglang.fleet.sglang_server, tasks_from: spec.yml}
    - sglang.fleet.sglang_lock:
        path: "{{ sglang_server_launch_spec.paths.recover_lock }}"
        name: "{{ sglang_server_launch_spec.marker }}"
        purpose: deploy
        owner: a deploy from a container
        LEASE
      loop: "{{ range(600) | list }}"
      loop_control: {pause: 1}
"""


def lock_file(fleet: helpers.SimFleet) -> Path:
    return fleet.host_root(HOST) / "run" / f"Kimi-K2.5-{fleet.port(HOST)}.recover.lock"


def ledger_of(fleet: helpers.SimFleet) -> list[dict]:
    path = Path(fleet.extra["sglang_fleet_ledger"])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def yaml_host_vars(fleet: helpers.SimFleet) -> dict:
    import yaml
    path = fleet.inventory / "host_vars" / f"{HOST}.yml"
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def cli(command: str, fleet: helpers.SimFleet, extra: dict, run_dir: Path, *more: str) -> str:
    proc = subprocess.run([str(helpers.BIN / "sglang-fleet"), command, "-i",
                           str(fleet.inventory), "-e", json.dumps(extra), "--run-dir",
                           str(run_dir), *more], cwd=helpers.REPO, env=helpers.ansible_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=900)
    return proc.stdout


def main() -> None:
    names = ["pid_reuse", "aggressive", "killed_recovery", "string_vars", "full_log", "port",
             "model_path", "secrets", "alias_bomb", "lock_namespace", "empty_lock", "shm_shared",
             "symlink_logs", "stop_recovery", "port_change", "unit_paths", "orphan_run",
             "check_bounds", "symlink_run", "host_path", "lock_folder", "stop_silent_lock"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=helpers.REPO)
    parser.add_argument("trials", nargs="*", metavar="TRIAL", help=", ".join(names))
    args = parser.parse_args()
    unknown = [t for t in args.trials if t not in names]
    if unknown:
        parser.error(f"unknown trial {unknown[0]!r}: choose from {', '.join(names)}")
    helpers.REPO = args.checkout.resolve()
    with tempfile.TemporaryDirectory(prefix="safety-trials-") as folder:
        trials = Trials(Path(folder))
        print(f"SIMULATED node (sglang-sim, Kimi-K2.5 TP=8), playbooks of {helpers.REPO}")
        for name in args.trials or names:
            print(f"{name:16} {getattr(trials, name)()}", flush=True)


if __name__ == "__main__":
    main()
