"""sglang-sim: the simulated `sglang serve` main process (HTTP server + tokenizer manager).

Takes SGLang 0.5.23's flags, starts the scheduler workers (through a data-parallel controller
when dp_size > 1) and the detokenizer, waits for them to load, then serves SGLang's HTTP
endpoints. Decode speed comes from the simulator profile and is SIMULATED. Faults come from
SGLANG_SIM_FAULT or from one of SGLang's known bugs (data/sim_bugs.yml).

Process life modelled on sglang/srt/entrypoints/engine.py (_launch_subprocesses,
_launch_scheduler_processes, _wait_for_scheduler_ready, _scheduler_died_error, the
launch-phase SIGQUIT handler, the non-zero node rank's SIGTERM handler and
launch_dummy_health_check_server), sglang/srt/utils/watchdog.py (SubprocessWatchdog),
sglang/srt/utils/common.py (kill_process_tree), sglang/srt/managers/tokenizer_manager.py
(SignalHandler, sigterm_watchdog) and sglang/srt/entrypoints/http_server.py
(_execute_server_warmup, _wait_and_warmup).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import resource_tracker
from typing import Any

from sglang_fleet.sim.args.server_args import prepare_server_args
from sglang_fleet.sim.engine.controller import spawn_scheduler
from sglang_fleet.sim.engine.failures import (
    SCHEDULER_DIED_FRAMES,
    SGLANG_ROOT,
    SGLangError,
    frames_traceback,
)
from sglang_fleet.sim.engine.handoff import spawn_with_args
from sglang_fleet.sim.engine.runtime import (
    SimRuntime,
    default_backend,
    effective_backend,
    load_runtime,
    log,
    resolved_args,
)
from sglang_fleet.sim.frontend.control import Hub
from sglang_fleet.sim.frontend.http_api import Handler
from sglang_fleet.sim.frontend.serving import UNHEALTHY, UP, Replica, ServerState
from sglang_fleet.sim.pd.bootstrap import (
    FAKE_BOOTSTRAP_HOST,
    PD_WARMUP_DONE,
    PD_WARMUP_END,
    PD_WARMUP_FAILED,
    PD_WARMUP_START,
    start_bootstrap_server,
)
from sglang_fleet.sim.pd.kv_receiver import PrefillInfoTable
from sglang_fleet.sim.pd.kv_sender import KVSender

WARMUP_TEXT = "The capital city of France is"
# entrypoints/engine.py _set_startup_time's format, as logged.
STARTUP_TIMINGS = ("Engine startup timings (s): load_weight=%.2f, "
                   "kv_cache_allocation=%.2f, scheduler_e2e=%.2f, "
                   "cuda_graph={%s}, tokenizer_e2e=%.2f")


def scheduler_died(rank: int, exit_code: int | None) -> str:
    """entrypoints/engine.py _scheduler_died_error."""
    return (f"Rank {rank} scheduler died during initialization (exit code: {exit_code}). "
            f"If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run "
            f"`dmesg -T | grep -i oom` to check.")


def subprocess_crashed(name: str, pid: int, exit_code: int) -> str:
    """utils/watchdog.py SubprocessWatchdog._check_once."""
    return (f"Subprocess {name} (pid={pid}) crashed with exit code {exit_code}. "
            f"Triggering SIGQUIT for cleanup...")


def kill_process_tree_called(pid: int, include_parent: bool) -> str:
    """utils/common.py kill_process_tree's first line, called on the process itself."""
    return f"kill_process_tree called: parent_pid={pid}, include_parent={include_parent}, pid={pid}"


# managers/tokenizer_manager.py's handlers, registered with loop.add_signal_handler (called
# with no arguments) and engine.py's launch-phase SIGQUIT handler.
RUNNING_SIGQUIT = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
SIGTERM_DRAIN = "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
LAUNCH_SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (psutil's children(recursive=True)), from /proc."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_process_tree(include_parent: bool = True) -> None:
    """utils/common.py kill_process_tree(os.getpid()): SIGKILL the children, then itself."""
    me = os.getpid()
    log(kill_process_tree_called(me, include_parent))
    for child in descendants(me):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    if include_parent:
        sys.stdout.flush()
        os.kill(me, signal.SIGKILL)


class UvicornServer(ThreadingHTTPServer):
    """An HTTP server with uvicorn's listen backlog (2048), not http.server's 5: a burst of
    clients waits to be accepted instead of being reset."""

    request_queue_size = 2048
    daemon_threads = True


class DummyHealthHandler(BaseHTTPRequestHandler):
    """launch_dummy_health_check_server: /ping, /health, /health_generate answer 200, empty.
    Under --enable-metrics it mounts /metrics too (add_prometheus_middleware): the node's
    multiprocess collector, empty here, since only a stats-logging rank (attn_tp_rank 0,
    on node 0) reports scheduler metrics (observability/metrics_collector.py)."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    enable_metrics = False

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - uvicorn at warning
        pass

    def _answer(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        if path in ("/ping", "/health", "/health_generate"):
            self._answer(200)
        elif path.startswith("/metrics") and self.enable_metrics:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._answer(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        known = self.path.split("?", 1)[0] in ("/ping", "/health", "/health_generate")
        self._answer(405 if known else 404,
                     b'{"detail":"Method Not Allowed"}' if known else b'{"detail":"Not Found"}')


class Engine:
    def __init__(self, rt: SimRuntime):
        self.rt = rt
        self.topology = rt.topology
        self.scheduler_procs: list[subprocess.Popen] = []  # schedulers, or the controller
        self.detokenizer: subprocess.Popen | None = None
        self.replicas: list[Replica] = []
        self.state: ServerState | None = None
        self.watchdog_stop = threading.Event()
        self.done = threading.Event()
        self.hub = Hub()
        os.environ.update(self.hub.environment())  # inherited by every worker
        self.scheduler_info: dict[str, Any] = {}
        self.replica_state: dict[Any, dict[str, Any]] = {}
        self.startup_time: dict[str, Any] = {}

    # --- start-up -----------------------------------------------------------------------------
    def spawn(self) -> int:
        # SGLang starts its workers with multiprocessing's spawn method, whose first start
        # launches multiprocessing's resource tracker as a child of the main process.
        resource_tracker.ensure_running()
        read_fd, write_fd = os.pipe()
        me = os.getpid()
        topo = self.topology
        if topo.uses_dp_controller:
            if topo.attention_dp:  # prelaunched: the main process owns the schedulers
                self.scheduler_procs += [spawn_scheduler(me, write_fd, None, r.pp_rank,
                                                         r.tp_rank, self.rt.args)
                                         for r in topo.schedulers(None)]
            self.scheduler_procs.insert(0, spawn_with_args(
                "sglang_fleet.sim.engine.controller",
                ["--status-fd", str(write_fd), "--parent-pid", str(me)], self.rt.args,
                (write_fd,)))
        else:
            self.scheduler_procs = [spawn_scheduler(me, write_fd, None, r.pp_rank, r.tp_rank,
                                                    self.rt.args) for r in topo.schedulers(None)]
        if topo.node_rank == 0:
            self.detokenizer = subprocess.Popen(
                [sys.executable, "-m", "sglang_fleet.sim.engine.detokenizer", str(me)])
        os.close(write_fd)
        return read_fd

    def wait_for_schedulers(self, read_fd: int) -> None:
        """_wait_for_scheduler_ready: poll, and every 5 s look for a child that died."""
        expected = {(r.dp_rank, r.pp_rank, r.tp_rank): r for r in self.topology.all_schedulers()}
        pids: dict[tuple, int] = {}
        buf = b""
        last_check = time.monotonic()
        while len(pids) < len(expected):
            readable, _, _ = select.select([read_fd], [], [], 0.5)
            if readable:
                chunk = os.read(read_fd, 4096)
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    kind, dp, pp, tp, pid = line.decode().split()
                    key = (None if dp == "None" else int(dp), int(pp), int(tp))
                    pids[key] = int(pid)
            if time.monotonic() - last_check >= 5.0:
                last_check = time.monotonic()
                for i, proc in enumerate(self.scheduler_procs):
                    if proc.poll() is not None:
                        raise RuntimeError(scheduler_died(i, proc.returncode))
        os.close(read_fd)
        self.replicas = self.group_replicas(expected, pids)

    def group_replicas(self, expected: dict[tuple, Any], pids: dict[tuple, int]) -> list[Replica]:
        """The DP ranks requests are routed to (data_parallel_controller round-robin): each
        replica's schedulers under pure DP; under attention DP one rank per attention-DP group,
        whose every batch runs on all the schedulers (one TP group), reported by its first."""
        by_replica: dict[Any, Replica] = {}
        every = [pids[key] for key in expected]
        for key, rank in expected.items():
            replica = by_replica.setdefault(rank.dp_rank, Replica(rank.dp_rank, rank.prefix))
            replica.pids[:] = every if self.topology.attention_dp else [*replica.pids, pids[key]]
        return [by_replica[k] for k in sorted(by_replica, key=lambda d: d or 0)]

    def subprocess_watchdog(self) -> None:
        """utils/watchdog.py SubprocessWatchdog over the scheduler procs and the detokenizer."""
        watched = [(f"scheduler_{i}", p) for i, p in enumerate(self.scheduler_procs)]
        if self.detokenizer is not None:
            watched.append(("detokenizer", self.detokenizer))
        while not self.watchdog_stop.wait(1.0):
            for name, proc in watched:
                code = proc.poll()
                if code is None or code == 0 or self.watchdog_stop.is_set():
                    continue
                log(subprocess_crashed(name, proc.pid, code))
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    # --- signals ------------------------------------------------------------------------------
    def launch_phase_sigquit(self, *_: Any) -> None:
        log(LAUNCH_SIGQUIT)
        kill_process_tree()

    def running_phase_sigquit(self, *_: Any) -> None:
        # Registered with loop.add_signal_handler in SGLang: called without arguments.
        log(RUNNING_SIGQUIT)
        self.watchdog_stop.set()
        kill_process_tree()

    def on_sigterm(self, *_: Any) -> None:
        assert self.state is not None
        log(SIGTERM_DRAIN)
        self.state.gracefully_exit = True

    def sigterm_watchdog(self, httpd: ThreadingHTTPServer) -> None:
        """tokenizer_manager.sigterm_watchdog: wakes every 5 s, drains, then stops."""
        st = self.state
        assert st is not None
        while not st.gracefully_exit:
            time.sleep(5)
        while True:
            remaining = list(st.running)
            if st.status == UNHEALTHY:
                log("Signal SIGTERM received while health check failed. Force exiting.")
                break
            if os.environ.get("SGL_FORCE_SHUTDOWN", "").lower() in ("1", "true", "yes"):
                log("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            log(f"Gracefully exiting... Remaining number of requests {len(remaining)}. "
                f"Remaining requests remaining_rids={remaining}.")
            if not remaining:
                break
            time.sleep(5)
        self.watchdog_stop.set()
        # ShutdownReq: the schedulers release their resources and exit.
        for proc in self.scheduler_procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.scheduler_procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        st.stop_event.set()
        kill_process_tree(include_parent=False)
        log("INFO:     Shutting down")
        httpd.shutdown()
        log("INFO:     Waiting for application shutdown.")
        log("INFO:     Application shutdown complete.")
        log(f"INFO:     Finished server process [{os.getpid()}]")
        self.done.set()

    # --- the server ---------------------------------------------------------------------------
    def run(self) -> int:
        self.began = time.perf_counter()
        signal.signal(signal.SIGQUIT, self.launch_phase_sigquit)
        read_fd = self.spawn()
        try:
            self.wait_for_schedulers(read_fd)
        except RuntimeError as exc:
            # _scheduler_died_error, uncaught: launch_server.py's `finally:
            # kill_process_tree(os.getpid(), include_parent=False)` runs, then Python prints
            # the traceback through SGLang's files and the process exits 1.
            kill_process_tree(include_parent=False)
            sys.stderr.write(frames_traceback(SCHEDULER_DIED_FRAMES, exc))
            return 1
        if self.topology.node_rank != 0:
            return self.serve_non_zero_rank()
        self.handshake()
        threading.Thread(target=self.subprocess_watchdog, daemon=True).start()
        return self.serve_http()

    def handshake(self) -> None:
        """Each scheduler's get_init_info; the first one's is the server's scheduler_info,
        and the engine logs the critical path of their start-up times (engine.py
        _set_startup_time, observability/startup_time.py)."""
        pids = sorted({pid for replica in self.replicas for pid in replica.pids})
        infos = self.hub.ask(pids, "init_info", every=True)
        self.scheduler_info = dict(infos[0])
        # Each DP rank's memory, for /metrics (its scheduler's collector reports it).
        self.replica_state = {r.dp_rank: self.hub.ask(r.pids, "internal_state")
                              for r in self.replicas}
        times = [i["startup_time"] for i in infos]
        graphs = {phase: max(t["cuda_graph"][phase] for t in times)
                  for phase in times[0]["cuda_graph"]}
        startup = {key: max(t[key] for t in times)
                   for key in ("load_weight", "kv_cache_allocation", "scheduler_e2e")}
        startup.update(cuda_graph=graphs, tokenizer_e2e=time.perf_counter() - self.began)
        self.startup_time = startup
        log(STARTUP_TIMINGS % (  # noqa: UP031 - SGLang's own %-format
                startup["load_weight"], startup["kv_cache_allocation"],
                startup["scheduler_e2e"],
                ", ".join(f"{k}={v:.2f}" for k, v in graphs.items()),
                startup["tokenizer_e2e"]))

    def serve_non_zero_rank(self) -> int:
        rank = self.topology.node_rank
        signal.signal(signal.SIGTERM, lambda *_: log(
            f"SIGTERM received on node_rank {rank}; waiting for the rank-0 ShutdownReq "
            f"broadcast to stop the schedulers."))
        args = self.rt.args
        try:
            handler = type("DummyHealthHandler", (DummyHealthHandler,),
                           {"enable_metrics": bool(args.enable_metrics)})
            health = UvicornServer((args.host, args.port), handler)
        except OSError as exc:
            log(f"Dummy health check server failed to start: [Errno {exc.errno}] "
                f"{exc.strerror}")
        else:
            health.daemon_threads = True
            threading.Thread(target=health.serve_forever, daemon=True,
                             name="health-check-server").start()
            log(f"Dummy health check server started in background thread at "
                f"{args.host}:{args.port}")
        for proc in self.scheduler_procs:
            while True:
                try:
                    proc.wait()
                    break
                except InterruptedError:
                    continue
            log(f"Scheduler or DataParallelController {proc.pid} terminated with "
                f"{proc.returncode}")
        return 0

    def serve_http(self) -> int:
        rt, args = self.rt, self.rt.args
        self.state = st = ServerState(rt, self.replicas, self.hub)
        st.scheduler_info, st.startup_time = self.scheduler_info, self.startup_time
        st.replica_state = self.replica_state
        if getattr(args, "disaggregation_mode", "null") == "decode":
            st.prefill_info = PrefillInfoTable(self.replicas[0].prefix)
        st.detokenizer_pid = self.detokenizer.pid if self.detokenizer else None
        st.launch_command = self.rt.args._launch_command
        # SIGUSR1 makes the schedulers' batches hang from now on (the running ones included),
        # as a stuck forward does, watchdog and all; a second one ends the hang: for the tests
        # of watch mode and of /health's recovery. Real servers have no such switch.
        signal.signal(signal.SIGUSR1, lambda *_: st.toggle_hang())
        time.sleep(rt.duration("starting_http"))
        fault = rt.fault_at("starting_http")
        if fault and fault.kind == "hang":
            while True:
                signal.pause()
        # The tokenizer manager starts a prefill's KV bootstrap server before the HTTP server.
        self.pd_warmup_failed = False
        prefill = getattr(args, "disaggregation_mode", "null") == "prefill"
        self.bootstrap = start_bootstrap_server(args) if prefill else None
        st.kv_sender = KVSender() if prefill else None
        handler = type("BoundHandler", (Handler,), {"state": st})
        try:
            httpd = UvicornServer((args.host, args.port), handler)
        except OSError as exc:
            log(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                f"('{args.host}', {args.port}): {exc.strerror}")
            self.watchdog_stop.set()
            kill_process_tree(include_parent=False)
            return 1
        httpd.daemon_threads = True
        signal.signal(signal.SIGQUIT, self.running_phase_sigquit)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        log(f"INFO:     Started server process [{os.getpid()}]")
        log("INFO:     Waiting for application startup.")
        log("INFO:     Application startup complete.")
        log(f"INFO:     Uvicorn running on http://{args.host}:{args.port} "
            f"(Press CTRL+C to quit)")
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        threading.Thread(target=self.sigterm_watchdog, args=(httpd,), daemon=True).start()
        threading.Thread(target=self.warm_up, daemon=True).start()
        while not self.done.wait(1.0):
            pass
        return 0

    def warm_up(self) -> None:
        """http_server._wait_and_warmup / _execute_server_warmup, over real HTTP."""
        st, args = self.state, self.rt.args
        assert st is not None
        if not getattr(args, "skip_server_warmup", False):
            time.sleep(1)
            headers = {"Content-Type": "application/json"}
            if args.api_key:
                headers["Authorization"] = f"Bearer {args.api_key}"
            host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
            try:
                for attempt in range(120):  # "Wait until the server is launched"
                    try:
                        self._request(host, "GET", "/model_info", None, headers, 5)
                        break
                    except OSError:
                        if attempt == 119:
                            raise
                        time.sleep(1)
                if getattr(args, "disaggregation_mode", "null") != "null":
                    self.pd_warmup_failed = not self.pd_warm_up(host, headers)
                else:
                    n = len(self.replicas)
                    text: Any = [WARMUP_TEXT] * n if n > 1 else WARMUP_TEXT
                    body = {"sampling_params": {"temperature": 0, "max_new_tokens": 8},
                            "text": text}
                    status, reply = self._request(host, "POST", "/generate", body, headers,
                                                  600)
                    assert status == 200, reply
            except Exception:
                if self.done.is_set() or st.gracefully_exit:
                    return
                log(f"Initialization failed. warmup error: {traceback.format_exc()}")
                kill_process_tree()
                return
        if not self.pd_warmup_failed:
            st.status = UP
        if self.bootstrap is not None and self.rt.has("bootstrap_dead"):
            self.bootstrap.stop_after_first_lookup()
        with contextlib.suppress(OSError):
            # http_server._freeze_gc_after_server_warmup: the admin key, else the API key
            host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
            key = getattr(args, "admin_api_key", None) or args.api_key
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            self._request(host, "POST", "/freeze_gc", None, headers, 10)
        log("The server is fired up and ready to roll!")

    def pd_warm_up(self, host: str, headers: dict[str, str]) -> bool:
        """http_server._execute_server_warmup in PD mode: one request per DP rank with the fake
        bootstrap host (_send_disaggregation_warmup_requests); a failed one leaves the server
        UnHealthy, its /health answering 503."""
        st, args = self.state, self.rt.args
        assert st is not None
        log(PD_WARMUP_START)
        ranks = len(self.replicas)
        codes = []
        for rank in range(ranks):
            body = {"sampling_params": {"temperature": 0.0, "max_new_tokens": 8,
                                        "ignore_eos": True},
                    "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": rank,
                    "input_ids": [10, 11, 12, 13], "routed_dp_rank": rank}
            codes.append(self._request(host, "POST", "/generate", body, headers, 1800)[0])
        failed = [code for code in codes if code != 200]
        if failed:
            log(PD_WARMUP_FAILED % (args.disaggregation_mode, failed))
            st.status = UNHEALTHY
            return False
        log(PD_WARMUP_DONE % ranks)
        log(PD_WARMUP_END)
        return True

    def _request(self, host: str, method: str, path: str, body: Any, headers: dict[str, str],
                 timeout: float) -> tuple[int, str]:
        conn = HTTPConnection(host, self.rt.args.port, timeout=timeout)
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None
                         else b"", headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()


def serve(rt: SimRuntime) -> int:
    # A shared-memory segment like SGLang's: removed on a clean exit, leaked by SIGKILL. Named
    # as 0.5.23 names its message queue's (srt/utils/stale_shm_cleanup.py make_shm_name("mq"):
    # sgl_shm_<kind>_<creator pid>_<8 hex>).
    segment = os.path.join(rt.shm_dir, f"sgl_shm_mq_{os.getpid()}_{os.urandom(4).hex()}")
    with open(segment, "wb") as held:
        held.truncate(1 << 16)
        try:
            return Engine(rt).run()
        finally:
            os.unlink(segment)


# sglang/launch_server.py's `if __name__ == "__main__":` warning, as Python prints it.
ENTRYPOINT_WARNING = ("'python -m sglang.launch_server' is still supported, but 'sglang serve' "
                      "is the recommended entrypoint.\n"
                      "  Example: sglang serve --model-path <model> [options]")


def warn_entrypoint() -> None:
    path = os.path.join(SGLANG_ROOT, "sglang", "launch_server.py")
    sys.stderr.write(f"{path}:71: UserWarning: {ENTRYPOINT_WARNING}\n  warnings.warn(\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> None:
    warn_entrypoint()  # the simulator stands for `python -m sglang.launch_server`
    argv = list(sys.argv[1:] if argv is None else argv)
    args = prepare_server_args(argv)  # argparse: exit 2 with SGLang's message on a bad flag
    try:
        rt = load_runtime(args)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        log(f"{type(exc).__name__}: {exc}")
        sys.exit(1)
    # Server-argument resolution logs its choices before the engine logs the arguments.
    if not args.attention_backend and effective_backend(rt) == default_backend(rt)[0]:
        log(default_backend(rt)[1])
    note = rt.capture_plan().prefill_note
    if note:
        log(note)
    try:
        args.resolve_once()
        args.check_server_args()
    except SGLangError as exc:
        # launch_server.py's `finally: kill_process_tree(os.getpid(), include_parent=False)`
        # runs before the interpreter prints the traceback and exits 1.
        kill_process_tree(include_parent=False)
        sys.stderr.write(exc.traceback_text())
        sys.exit(1)
    log(f"server_args={resolved_args(args, rt)}")
    sys.exit(serve(rt))


if __name__ == "__main__":
    main()

