"""The simulator's failures, overload, watchdogs, auth, metrics and server info against SGLang
0.5.23's own source and the torch it pins (the reference environment): every frame it prints
is at that line of that file and calls the frame after it; every text it prints is the one the
release formats (its f-strings evaluated here; the scheduler watchdog's report, torch's store
and the auth decisions run by the release's own code); its /metrics families, scheduler fields
and queue-full answer are the release's. Texts that live in torch's C++ are checked against the
strings of its shared libraries."""

from __future__ import annotations

import ast
import functools
import http
import importlib.util
import itertools
import json
import math
import re
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_fleet.known import refenv
from sglang_fleet.sim import launch_server
from sglang_fleet.sim.engine import detokenizer, failures, rendezvous, scheduler
from sglang_fleet.sim.frontend import http_api, metrics
from sglang_fleet.sim.frontend.serving import ABORTED, Aborted, InternalError, QueueFull
from sglang_fleet.sim.pd import bootstrap, kv_receiver, kv_sender

VERSION = "0.5.23"


@pytest.fixture(scope="module")
def env():
    return refenv.ensure(VERSION, quiet=True)


@pytest.fixture(scope="module")
def site(env) -> Path:
    """Where the reference environment's torch is installed."""
    out = env.run("-c", "import torch, os; print(os.path.dirname(os.path.dirname("
                        "torch.__file__)))")
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip())


def source(env, file: str) -> str:
    return (env.sglang_dir / file).read_text()


def statement_at(env, site: Path, file: str, line: int) -> str:
    root = env.sglang_dir if file.startswith("sglang/") else site
    return (root / file).read_text().splitlines()[line - 1].strip()


def function_at(path: Path, line: int) -> str:
    tree = ast.parse(path.read_text())
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                node.lineno <= line <= node.end_lineno and (
                    best is None or node.lineno > best.lineno):
            best = node
    return best.name if best else "<module>"


def all_frames() -> set[tuple[str, int, str, str]]:
    stacks = [*failures.ALL_FRAME_STACKS, [*detokenizer.FRAMES, detokenizer.LOOKUP,
                                           detokenizer.RAISE]]
    return {frame for stack in stacks for frame in stack}


def test_every_frame_the_simulator_prints_is_that_line_of_sglang_or_torch(env, site):
    for file, line, function, code in sorted(all_frames()):
        root = env.sglang_dir if file.startswith("sglang/") else site
        assert statement_at(env, site, file, line) == code, (file, line)
        assert function_at(root / file, line) == function, (file, line)


def class_at(path: Path, line: int) -> str | None:
    tree = ast.parse(path.read_text())
    return next((n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                 and n.lineno <= line <= n.end_lineno), None)


# Calls a statement makes that its text does not name: init_process_group is decorated (its
# frame is the decorator's wrapper), torch's logging wrappers call `func`, a generator runs
# under `next`, the detokenizer's dispatcher looks its handler up.
INDIRECT_CALLS = {("sglang/srt/distributed/parallel_state.py", 2517),
                  ("torch/distributed/c10d_logger.py", 83),
                  ("torch/distributed/c10d_logger.py", 97),
                  ("torch/distributed/distributed_c10d.py", 2546),
                  ("sglang/srt/managers/detokenizer_manager.py", 189)}


def test_each_frame_is_called_by_the_one_before_it(env, site):
    """A traceback as Python prints it: every frame's statement calls the next frame's
    function (a constructor: its class's __init__). The stacks of a model's build leave the
    layers between the scheduler and the attention module out, and say so."""
    stacks = [stack for stack in failures.ALL_FRAME_STACKS
              if stack not in failures.HEADS_FRAMES.values()]
    stacks.append([*detokenizer.FRAMES, detokenizer.RAISE])
    for stack in stacks:
        for (file, line, _, code), (callee_file, callee_line, callee, _) in \
                zip(stack, stack[1:], strict=False):
            if (file, line) in INDIRECT_CALLS:
                continue
            if callee == "__init__":
                root = env.sglang_dir if callee_file.startswith("sglang/") else site
                callee = class_at(root / callee_file, callee_line)
            assert re.search(rf"\b{re.escape(callee)}\(", code), (file, line, code, callee)


# ---- f-strings of the release, evaluated ---------------------------------------------------

def fstring_in(text: str, anchor: str) -> ast.expr:
    """The f-string (or concatenation of them) of the first call whose source holds
    `anchor`."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and anchor in ast.unparse(node.args[0]):
            return node.args[0]
    raise AssertionError(f"{anchor!r} not found")


def evaluate(expr: ast.expr, **names) -> str:
    return eval(compile(ast.Expression(expr), "<sglang>", "eval"), {}, names)  # noqa: S307


def test_the_kv_cache_refusal_is_the_configurators_text(env):
    expr = fstring_in(source(env, "sglang/srt/mem_cache/kv_cache_configurator.py"),
                      "Loaded weights leave no GPU memory")
    available, pre = 22.19, 95.59
    minimum = 1 - available / pre
    real = evaluate(expr, get_schedule=lambda: SimpleNamespace(mem_fraction_static=0.7),
                    minimum_mem_fraction_static=minimum,
                    suggested_mem_fraction_static=math.ceil(minimum * 1000) / 1000)
    assert failures.no_kv_memory(0.7, available, pre) == real


def test_the_detokenizers_error_is_its_text(env):
    expr = fstring_in(source(env, "sglang/srt/managers/detokenizer_manager.py"),
                      "Decode status not found")
    real = evaluate(expr, rid="abc", DETOKENIZER_MAX_STATES=detokenizer.DETOKENIZER_MAX_STATES)
    assert f"RuntimeError: {real}\n" in detokenizer.decode_status_lost("abc")
    assert "DETOKENIZER_MAX_STATES = int(os.environ.get(\"SGLANG_DETOKENIZER_MAX_STATES\", " \
           "1 << 16))" in source(env, "sglang/srt/managers/detokenizer_manager.py")


def test_the_watchdog_and_startup_timing_lines_are_sglangs(env):
    watchdog = source(env, "sglang/srt/utils/watchdog.py")
    expr = fstring_in(watchdog, "watchdog timeout")
    raw = SimpleNamespace(debug_name="Scheduler", watchdog_timeout=300, soft=False)
    assert evaluate(expr, self=raw) == failures.watchdog_timeout_lines("Scheduler", 300, False)
    assert "time.sleep(5)\n            self.parent_process.send_signal(signal.SIGQUIT)" in watchdog
    engine = ast.parse(source(env, "sglang/srt/entrypoints/engine.py"))
    formats = [n.args[0].value for n in ast.walk(engine)
               if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant)
               and "Engine startup timings" in str(n.args[0].value)]
    assert formats == [launch_server.STARTUP_TIMINGS]


def test_the_process_lines_are_the_releases(env):
    """What the main process says when a scheduler dies, a subprocess crashes, a signal comes
    and it takes its tree down."""
    engine = source(env, "sglang/srt/entrypoints/engine.py")
    died = evaluate(fstring_in(engine, "scheduler died during initialization"), rank=3,
                    proc=SimpleNamespace(exitcode=-9))
    assert launch_server.scheduler_died(3, -9) == died
    crashed = evaluate(fstring_in(source(env, "sglang/srt/utils/watchdog.py"), "crashed "),
                       name="scheduler_0", proc=SimpleNamespace(pid=4321, exitcode=-6))
    assert launch_server.subprocess_crashed("scheduler_0", 4321, -6) == crashed
    for include_parent in (True, False):
        called = evaluate(fstring_in(source(env, "sglang/srt/utils/common.py"),
                                     "kill_process_tree called"),
                          parent_pid=77, include_parent=include_parent,
                          os=SimpleNamespace(getpid=lambda: 77))
        assert launch_server.kill_process_tree_called(77, include_parent) == called
    tokenizer = source(env, "sglang/srt/managers/tokenizer_manager.py")
    for anchor, ours in (("SIGQUIT received.", launch_server.RUNNING_SIGQUIT),
                         ("SIGTERM received.", launch_server.SIGTERM_DRAIN)):
        assert evaluate(fstring_in(tokenizer, anchor), signum=None, frame=None) == ours
    assert evaluate(fstring_in(engine, "Received sigquit")) == launch_server.LAUNCH_SIGQUIT


def test_the_entrypoint_warning_is_launch_servers(env):
    text = source(env, "sglang/launch_server.py")
    call = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)
                and ast.unparse(n.func) == "warnings.warn")
    assert ast.literal_eval(call.args[0]) == launch_server.ENTRYPOINT_WARNING
    assert call.lineno == 71 and ast.unparse(call.args[1]) == "UserWarning"


def test_the_queue_full_answer_is_the_schedulers_abort_through_the_http_handler(env):
    scheduler = source(env, "sglang/srt/managers/scheduler.py")
    limit = scheduler[scheduler.index("def _abort_on_queued_limit"):]
    limit = limit[:limit.index("\n    def ")]
    assert f'message = "{QueueFull.message}"' in limit
    assert '"status_code": HTTPStatus.SERVICE_UNAVAILABLE' in limit
    assert "len(self.waiting_queue) + 1 <= self.max_queued_requests" in limit
    http_server = source(env, "sglang/srt/entrypoints/http_server.py")
    assert textwrap.dedent("""\
        error = ErrorResponse(
            object="error",
            message=exc.detail,
            type=str(exc.status_code),
            code=exc.status_code,
        )""") in textwrap.dedent(
        http_server[http_server.index("    error = ErrorResponse("):][:200])
    protocol = source(env, "sglang/srt/entrypoints/openai/protocol.py")
    fields = re.search(r"class ErrorResponse\(BaseModel\):\n((?:    .*\n)+)", protocol).group(1)
    assert [f.split(":")[0].strip() for f in fields.strip().splitlines()] == \
        ["object", "message", "type", "param", "code"]
    answer = {"object": "error", "message": QueueFull.message,
              "type": str(int(http.HTTPStatus.SERVICE_UNAVAILABLE)), "param": None, "code": 503}
    assert json.loads(http_api.compact_json(answer)) == answer


def test_regressed_aborts_and_errors_are_the_releases_own(env):
    """SGLANG_SIM_REGRESS: an abort is abort_request's (FINISH_ABORT() run by the release, no
    status, so a 200 with the output so far, and counted), an error the 500 abort of an internal
    error, answered through the same ErrorResponse as the queue-full 503."""
    out = env.run("-c", "import json; from sglang.srt.managers.schedule_batch import "
                        "FINISH_ABORT; print(json.dumps(FINISH_ABORT().to_json()))")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ABORTED
    manager = source(env, "sglang/srt/managers/tokenizer_manager.py")
    abort_request = manager[manager.index("    def abort_request("):]
    assert "self.metrics_collector.observe_one_aborted_request(" in \
        abort_request[:abort_request.index("\n    async def ")]
    handled = manager[manager.index("    async def _handle_abort_finish_reason("):][:1500]
    assert "or status_code is None" in handled and "return None" in handled
    batch = source(env, "sglang/srt/managers/scheduler_components/batch_result_processor.py")
    assert "HTTPStatus.INTERNAL_SERVER_ERROR,\n                \"InternalServerError\"," in batch
    assert (InternalError.status, Aborted.status, QueueFull.status) == (500, 500, 503)


# ---- the scheduler watchdog's report, run by the release's own code ---------------------------

WATCHDOG_PROBE = """
import json, logging, sys, types
from sglang.srt.managers import schedule_batch
from sglang.srt.managers.scheduler_components import invariant_checker as ic
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.watchdog import WatchdogRaw

case = json.loads(sys.argv[1])
params = SamplingParams(max_new_tokens=case["max_new_tokens"], temperature=case["temperature"])
params.normalize(None)  # the tokenizer manager's, without a tokenizer (no stop strings)

class Req:
    __repr__ = schedule_batch.Req.__repr__

req = Req()
req.rid, req.origin_input_ids, req.output_ids = case["rid"], case["input_ids"], []
req.grammar, req.sampling_params = None, params
# The full pool as _check_full_pool reports it (no hybrid pool, no KV sharding).
pool = ic.SchedulerInvariantChecker._check_pool_invariant(
    "full", case["available"], 0, 0, 0, case["total"])[1]
scheduler = types.SimpleNamespace(
    is_initializing=False, forward_ct=7,
    cur_batch_for_debug=types.SimpleNamespace(reqs=[req], batch_size=lambda: 1),
    invariant_checker=types.SimpleNamespace(_check_all_pools=lambda stats: (False, [pool])),
    pool_stats_observer=types.SimpleNamespace(get_pool_stats=lambda: None))
made = {}
ic.WatchdogRaw = lambda **kw: made.update(kw)  # create_scheduler_watchdog's arguments, no thread
ic.create_scheduler_watchdog(scheduler, watchdog_timeout=case["timeout"], soft=True)
watchdog = WatchdogRaw.__new__(WatchdogRaw)
watchdog.__dict__.update(made)
logged = []
handler = logging.Handler()
handler.emit = lambda record: logged.append(record.getMessage())
logging.getLogger().addHandler(handler)
logging.getLogger().setLevel(logging.INFO)
watchdog._watchdog_once()  # soft: reports, signals nothing
print(json.dumps(logged))
"""


@pytest.mark.parametrize("max_new_tokens, temperature", [(1, 0.0), (128, 1.0), (16, 0.7)])
def test_the_scheduler_watchdogs_report_is_the_releases(env, monkeypatch, max_new_tokens,
                                                        temperature):
    # Both sides ask the shell for py-spy; on the system PATH it answers the same for both
    # (a virtualenv's py-spy would dump the probe, alive, and ours a finished process).
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    case = {"rid": "HEALTH_CHECK_0f1e", "input_ids": [0, 11, 12], "total": 5000,
            "available": 4997, "max_new_tokens": max_new_tokens, "temperature": temperature,
            "timeout": 0.05}
    run = env.run("-c", WATCHDOG_PROBE, json.dumps(case), timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    real = json.loads(run.stdout.strip().splitlines()[-1])
    pid = int(re.search(r"--pid (\d+)", real[1]).group(1))  # py-spy ran on the probe itself
    debug = failures.scheduler_debug_info(
        failures.req_repr(case["rid"], case["input_ids"], [],
                          failures.sampling_params_repr(max_new_tokens, temperature)),
        failures.full_pool_line(case["total"], case["available"]))
    ours = scheduler.watchdog_report(debug, pid, case["timeout"], True)
    assert ours == real


# ---- /server_info: the fields the schedulers report ----------------------------------------

def functions_of(tree: ast.AST, names: set[str]) -> list[ast.AST]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names]


def assigned_keys(functions: list[ast.AST]) -> set[str]:
    """`x["key"] = ...` targets and string keys of dict literals in these functions."""
    keys = set()
    for function in functions:
        for node in ast.walk(function):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.slice, ast.Constant):
                keys.add(node.slice.value)
            elif isinstance(node, ast.Dict):
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
    return keys


def test_the_schedulers_init_info_and_internal_state_have_the_releases_fields(env):
    internal = ast.parse(source(env, "sglang/srt/managers/scheduler_components/internal_state.py"))
    # What a server without speculative decoding, elastic EP, step timing, the Rust server
    # or exported environment variables reports (those contributors add nothing then).
    real = assigned_keys(functions_of(internal, {"_add_topology", "_add_memory_usage",
                                                 "_add_disaggregation"}))
    real |= assigned_keys(functions_of(ast.parse(source(
        env, "sglang/srt/managers/scheduler_components/memory_usage.py")),
        {"build_memory_usage"}))
    real.discard("custom_sigquit_handler")
    ours = ast.parse(Path(scheduler.__file__).read_text())
    # last_gen_throughput is the metrics reporter's, which the simulator keeps in the main
    # process and adds there (http_api).
    assert assigned_keys(functions_of(ours, {"internal_state"})) | {"last_gen_throughput"} == real
    init = assigned_keys(functions_of(ast.parse(source(env, "sglang/srt/managers/scheduler.py")),
                                      {"get_init_info"}))
    init.discard("kv_event_sources")  # only with a gRPC port
    assert {"status", "max_total_num_tokens", "max_req_input_len", "startup_time",
            "hicache_object_layout"} == init
    assert init <= assigned_keys(functions_of(ours, {"init_info"}))


# ---- auth ----------------------------------------------------------------------------------

def test_auth_decisions_are_sglangs_for_every_key_and_route(env, monkeypatch):
    # auth.py is pure Python by design (its docstring: "no torch import"), so it loads here;
    # its dataclass needs its module registered while it is executed.
    spec = importlib.util.spec_from_file_location(
        "sglang_auth", env.sglang_dir / "sglang/srt/utils/auth.py")
    real = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, real)
    spec.loader.exec_module(real)
    http_server = source(env, "sglang/srt/entrypoints/http_server.py")
    for path in http_api.ADMIN_OPTIONAL:
        route = rf'@app\.(?:api_route\("{re.escape(path)}", methods=\[[^\]]*\]\)|' \
                rf'(?:get|post)\("{re.escape(path)}"\))\n'
        assert re.search(route + r"@auth_level\(AuthLevel\.ADMIN_OPTIONAL\)", http_server), path
    levels = {http_api.NORMAL: real.AuthLevel.NORMAL,
              http_api.ADMIN_OPTIONAL_LEVEL: real.AuthLevel.ADMIN_OPTIONAL}
    paths = ["/generate", "/server_info", "/flush_cache", "/freeze_gc", "/health",
             "/health_generate", "/ready", "/metrics", "/v1/models",
             "/init_weights_send_group_for_remote_instance"]
    keys = [None, "user", "admin"]
    headers = [None, "Bearer user", "Bearer admin", "bearer admin", "Basic admin", "Bearer"]
    for path, api, admin, header, method in itertools.product(
            paths, keys, keys, headers, ["GET", "POST", "OPTIONS"]):
        level = http_api.auth_level(path)
        want = real.decide_request_auth(method=method, path=path, authorization_header=header,
                                        api_key=api, admin_api_key=admin,
                                        auth_level=levels[level])
        got = http_api.decide_request_auth(method, path, header, api, admin, level)
        assert got == (want.allowed, want.error_status_code), (path, api, admin, header)


# ---- metrics -------------------------------------------------------------------------------

def literal_or_none(node: ast.expr):
    """A help text the release writes as a literal; None for one it formats (those families
    are not served by the simulator)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def collector_families(env) -> dict[str, tuple[str, str, list[str]]]:
    """name -> (type, help, extra label names) as the release's collectors declare them."""
    tree = ast.parse(source(env, "sglang/srt/observability/metrics_collector.py"))
    out = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)
                and n.name in ("SchedulerMetricsCollector", "TokenizerMetricsCollector")):
        for node in ast.walk(cls):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("Gauge", "Counter", "Histogram"):
                kw = {k.arg: k.value for k in node.keywords}
                labels = ast.unparse(kw["labelnames"])
                extra = re.findall(r"'(\w+)'", labels.split("keys()")[-1])
                out[ast.literal_eval(kw["name"])] = (node.func.id.lower(),
                                                     literal_or_none(kw["documentation"]),
                                                     extra)
    return out


def test_every_metric_family_is_the_collectors_own(env):
    real = collector_families(env)
    for name, kind, doc, extra in (*metrics.SCHEDULER_FAMILIES, *metrics.TOKENIZER_FAMILIES):
        assert real.get(name) == (kind, doc, list(extra)), name
    collector = source(env, "sglang/srt/observability/metrics_collector.py")
    for labels in ('"model_name": get_serving().served_model_name', '"tp_rank": parallel.tp_rank',
                   '"pp_rank": parallel.pp_rank', '"moe_ep_rank": parallel.moe_ep_rank',
                   'labels["dp_rank"] = parallel.dp_rank'):
        assert labels in collector
    for name, buckets in metrics.BUCKETS.items():
        key = {"sglang:time_to_first_token_seconds": "bucket_time_to_first_token",
               "sglang:e2e_request_latency_seconds": "bucket_e2e_request_latency",
               "sglang:inter_token_latency_seconds": "bucket_inter_token_latency"}[name]
        found = re.search(rf"if {key} is None:\n\s+{key} = \[([^\]]*)\]", collector).group(1)
        assert tuple(ast.literal_eval(f"[{found}]")) == buckets


# ---- torch: the store, NCCL and CUDA texts ------------------------------------------------------

STORE_PROBE = """
import datetime, json, socket, sys, torch.distributed as dist
out = {}
def attempt(key, **kw):
    try:
        dist.TCPStore(timeout=datetime.timedelta(seconds=1), **kw)
    except Exception as e:
        out[key] = [type(e).__module__ + "." + type(e).__qualname__, str(e)]
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
attempt("wait", host_name="127.0.0.1", port=port, world_size=2, is_master=True)
s = socket.socket(); s.bind(("127.0.0.1", 0)); free = s.getsockname()[1]; s.close()
attempt("connect", host_name="127.0.0.1", port=free, world_size=2, is_master=False)
held = socket.socket(); held.bind(("127.0.0.1", 0)); held.listen(); taken = held.getsockname()[1]
attempt("listen", host_name="127.0.0.1", port=taken, world_size=2, is_master=True)
out["ports"] = [free, taken]
print(json.dumps(out))
"""


def test_the_stores_errors_are_torchs_own(env):
    run = env.run("-c", STORE_PROBE, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    free, taken = out["ports"]
    kind, text = out["wait"]
    elapsed = int(re.search(r"Timed out after (\d+) seconds", text).group(1))
    assert (kind, text) == ("torch.distributed.DistStoreError",
                            failures.store_wait_timeout(elapsed, 1, 2))
    assert elapsed == 2, "whole seconds past a 1 s timeout"
    assert out["connect"] == ["torch.distributed.DistNetworkError",
                              failures.client_connect_timeout(1000, "127.0.0.1", free)]
    assert out["listen"] == ["torch.distributed.DistNetworkError",
                             failures.store_listen_failed(taken, 98)]
    for name in ("DistStoreError", "DistNetworkError"):
        error = failures.sglang_error(name, failures.RENDEZVOUS_FRAMES, "x")
        assert error.final_line == f"torch.distributed.{name}: x"


@functools.lru_cache
def library_strings(path: Path) -> str:
    data = path.read_bytes()
    return "\n".join(s.decode() for s in re.findall(rb"[\x20-\x7e]{12,}", data))


@functools.lru_cache
def library_literals(path: Path) -> set[str]:
    """The shared library's printable runs, each whole (a C++ literal, or its lines)."""
    return {s.decode() for s in re.findall(rb"[\x20-\x7e]{4,}", path.read_bytes())}


def test_nccl_and_cuda_texts_are_in_torchs_libraries(site):
    lib = site / "torch" / "lib"
    nccl = library_strings(lib / "libtorch_cuda.so")
    for line in (failures.NCCL_ASYNC_ERROR, failures.NCCL_TEARDOWN):
        pieces = [p for p in re.split(r"(?<=\. )|(?<=the )|(?<=operations )", line) if p]
        assert all(p.strip() in nccl for p in pieces), line
    assert "Watchdog caught collective operation timeout: " in nccl
    oom = library_strings(lib / "libc10_cuda.so")
    text = failures.cuda_oom(9.87 * (1 << 30), 0, 95.59 * (1 << 30), 22 * (1 << 30),
                             73.4 * (1 << 30), 73.15 * (1 << 30), 1 << 28)
    for piece in ("CUDA out of memory. Tried to allocate ", "Including non-PyTorch memory, "
                  "this process", " is reserved by PyTorch but unallocated.",
                  text[text.index(" If reserved but unallocated"):]):
        assert piece in oom, piece


# What torch's NCCL watchdog writes, in the pieces its C++ joins (c10::str): each must be one
# of libtorch_cuda's strings and in what the simulator writes.
NCCL_PIECES = ("Watchdog caught collective operation timeout: ", "WorkNCCL(", "SeqNum=",
               ", OpType=", ", NumelIn=", ", NumelOut=", ", Timeout(ms)=", " ran for ",
               " milliseconds before timing out.", "[PG ID ", " PG GUID ",
               " failure detected by watchdog at work sequence id: ",
               " PG status: last enqueued work: ", ", last completed work: ",
               "Stack trace of the failed collective not found, ",
               "potentially because FlightRecorder is disabled. ",
               "You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.",
               "Process group watchdog thread terminated with exception: ")


def test_the_nccl_watchdogs_abort_is_made_of_torchs_strings(site, capsys):
    failures.write_nccl_watchdog_abort(3, 600000, 600042, 88211)
    written = capsys.readouterr().err
    nccl = library_literals(site / "torch" / "lib" / "libtorch_cuda.so")
    for piece in NCCL_PIECES:
        assert piece in nccl, piece
        assert piece in written, piece
    assert "Exception raised from " in library_strings(site / "torch" / "lib" / "libc10.so")
    assert "]  failure detected" in written, "logPrefix's space, then the message's own"


def test_the_store_timeout_default_is_torchs_for_nccl(env):
    run = env.run("-c", "from torch.distributed.constants import default_pg_nccl_timeout as t;"
                        "print(int(t.total_seconds()))")
    assert run.returncode == 0 and int(run.stdout) == rendezvous.DEFAULT_STORE_TIMEOUT_S


def test_the_prefills_bootstrap_server_speaks_as_the_releases(env, site):
    """The KV bootstrap server's lines, answers and bind failure, and the PD warm-up's lines,
    are those of 0.5.23 (disaggregation/common/conn.py, entrypoints/http_server.py)."""
    conn = source(env, "sglang/srt/disaggregation/common/conn.py")
    server = SimpleNamespace(host="127.0.0.1", port=9100)
    assert evaluate(fstring_in(conn, "CommonKVBootstrapServer started successfully"),
                    self=server) == bootstrap.started_line("127.0.0.1", 9100)
    error = OSError(98, "address in use")
    assert evaluate(fstring_in(conn, "Server error:"), e=error, str=str) == \
        bootstrap.server_error_line(error)
    assert statement_at(env, site, *bootstrap.BIND_FRAME[:2]) == bootstrap.BIND_FRAME[2]
    assert f'web.Response(text="{bootstrap.MISSING_INPUTS}", status=400)' in conn
    assert 'web.Response(text="OK", status=200)' in conn
    for key in bootstrap.ROUTE_KEYS:
        assert f'request.query.get("{key}")' in conn
    route_get = conn[conn.index("async def _handle_route_get"):]
    fields = set(re.findall(r"^\s+(\w+)=", route_get[route_get.index("info = PrefillServerInfo("):
                                                     route_get.index("payload = dataclasses")],
                            re.M))
    assert "page_size" in fields and "kv_cache_dtype" in fields
    # kv_layout and dsv41_spec_layout leave the payload when None, as they are here.
    assert "payload.pop(\"kv_layout\")" in route_get
    assert set(bootstrap.server_info(SimpleNamespace(tp_size=8, port=30000))) == \
        fields - {"kv_layout", "dsv41_spec_layout"}
    utils = source(env, "sglang/srt/disaggregation/utils.py")
    assert f'FAKE_BOOTSTRAP_HOST = "{bootstrap.FAKE_BOOTSTRAP_HOST}"' in utils
    server_py = source(env, "sglang/srt/entrypoints/http_server.py")
    assert evaluate(fstring_in(server_py, "Start of pd disaggregation warmup")) == \
        bootstrap.PD_WARMUP_START
    for text in (bootstrap.PD_WARMUP_DONE, bootstrap.PD_WARMUP_END, bootstrap.PD_WARMUP_FAILED):
        assert f'"{text}"' in server_py, text
    # asyncio's own words for a port that is taken, in the reference Python.
    probe = env.run("-c", textwrap.dedent("""
        import asyncio, socket
        held = socket.socket(); held.bind(("127.0.0.1", 0)); held.listen()
        port = held.getsockname()[1]
        async def bind():
            await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", port)
        try:
            asyncio.run(bind())
        except OSError as e:
            print(port, str(e))
    """))
    port, said = probe.stdout.strip().split(" ", 1)
    assert str(bootstrap.bind_error(OSError(98, "Address already in use"), "127.0.0.1",
                                    int(port))) == said


def string_with(text: str, anchor: str) -> ast.expr:
    """The first f-string (implicit concatenations are one) whose source holds `anchor`."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.JoinedStr) and anchor in ast.unparse(node):
            return node
    raise AssertionError(f"{anchor!r} not found")


def test_the_decodes_look_up_of_a_prefill_speaks_as_the_releases(env):
    """The decode's look-up of a prefill (URL, retry count and interval, each attempt's error,
    giving up) and the abort of its requests are those of 0.5.23 (disaggregation/decode.py,
    common/conn.py), the handshake line evaluated from the release's own f-strings."""
    decode = source(env, "sglang/srt/disaggregation/decode.py")
    conn = source(env, "sglang/srt/disaggregation/common/conn.py")
    assert f"self._max_ensure_retries: int = {kv_receiver.MAX_ENSURE_RETRIES}" in decode
    assert f"self._ensure_retry_interval: float = {kv_receiver.ENSURE_RETRY_INTERVAL_S}" in \
        decode
    assert f"response = requests.get(url, timeout={kv_receiver.ROUTE_TIMEOUT_S})" in conn
    assert f'self.kv_mgr.record_failure(self.bootstrap_room, "{kv_receiver.ABORTED}")' in conn
    addr = "10.0.0.5:8998"
    assert evaluate(string_with(conn, "prefill_dp_rank={-1}"), bootstrap_addr=addr) == \
        kv_receiver.route_info_url(addr)
    error = ConnectionError("refused")
    assert evaluate(fstring_in(conn, "Error fetching prefill server info from bootstrap"),
                    e=error) == kv_receiver.fetch_error_line(error)
    assert evaluate(fstring_in(conn, "Failed to get prefill server info"),
                    response=SimpleNamespace(status_code=404, text="no")) == \
        kv_receiver.fetch_status_line(404, "no")
    assert evaluate(string_with(decode, "Could not fetch prefill parallel info from "
                                        "{bootstrap_addr} after"),
                    bootstrap_addr=addr, count=15) == kv_receiver.gave_up_line(addr, 15)
    request = SimpleNamespace(req=SimpleNamespace(rid="9f3a", bootstrap_room=4411))
    said = evaluate(string_with(decode, "Decode handshake failed"),
                    self=SimpleNamespace(tp_rank=0), decode_req=request)
    error_text = evaluate(string_with(conn, "KVTransferError(bootstrap_room="),
                          self=SimpleNamespace(bootstrap_room=4411,
                                               failure_reason=kv_receiver.ABORTED))
    said += evaluate(string_with(decode, " with exception {e}"), e=error_text)
    assert said == kv_receiver.handshake_failed_line(0, "9f3a", 4411, kv_receiver.ABORTED)
    assert 'def _bootstrap_addr(req: Req) -> str:' in decode


def test_the_decodes_wait_for_its_kv_cache_speaks_as_the_releases(env):
    """A decode's wait for a request's KV cache (the waiting timeout and its warning) and its
    heartbeat's loss of a prefill (interval, misses, the lines) are 0.5.23's
    (common/conn.py, decode.py, environ.py), each line evaluated from the release's own
    f-strings."""
    decode = source(env, "sglang/srt/disaggregation/decode.py")
    conn = source(env, "sglang/srt/disaggregation/common/conn.py")
    environ = source(env, "sglang/srt/environ.py")
    assert f"{kv_receiver.WAITING_TIMEOUT_VAR} = EnvInt(300)" in environ
    assert f"{kv_receiver.HEARTBEAT_INTERVAL_VAR} = EnvFloat(5.0)" in environ
    assert f"{kv_receiver.HEARTBEAT_MAX_FAILURE_VAR} = EnvInt(2)" in environ
    assert "envs.SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL.get(), 2.0" in conn
    assert "envs.SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE.get(), 1" in conn
    assert 'f"http://{bootstrap_addr}/health"' in conn and "timeout=(2, 3)" in conn
    warning = next(node for node in ast.walk(ast.parse(conn)) if isinstance(node, ast.Call)
                   and ast.unparse(node.func).endswith("warning_once") and node.args
                   and "fail to receive KV Cache" in ast.unparse(node.args[0]))
    assert evaluate(warning.args[0]) == kv_receiver.WAITING_TIMEOUT_WARNING
    room, addr = 4411, "10.0.0.5:8998"
    assert evaluate(string_with(conn, "in KVPoll.WaitingForInput"),
                    self=SimpleNamespace(bootstrap_room=room), elapsed=3.04) == \
        kv_receiver.waiting_timeout_reason(room, 3.04)
    # The failure record's f-string alone (ast.unparse quotes it with ').
    assert evaluate(string_with(conn, "Lost connection with prefill instance (bootstrap_addr: "
                                      "{failed_bootstrap_addr})'"),
                    failed_bootstrap_addr=addr) == kv_receiver.lost_reason(addr)
    assert evaluate(string_with(conn, "requests affected"), failed_bootstrap_addr=addr,
                    affected_rooms=[1, 2]) == kv_receiver.lost_line(addr, 2)
    assert evaluate(string_with(conn, "Attempting to reconnect to"),
                    bootstrap_addr=addr) == kv_receiver.reconnect_line(addr)
    request = SimpleNamespace(req=SimpleNamespace(rid="9f3a", bootstrap_room=room))
    said = evaluate(string_with(decode, "Decode transfer failed for request"),
                    self=SimpleNamespace(tp_rank=0), decode_req=request)
    reason = kv_receiver.waiting_timeout_reason(room, 3.04)
    error_text = evaluate(string_with(conn, "KVTransferError(bootstrap_room="),
                          self=SimpleNamespace(bootstrap_room=room, failure_reason=reason))
    said += evaluate(string_with(decode, " with exception {e}"), e=error_text)
    assert said == kv_receiver.transfer_failed_line(0, "9f3a", room, reason)


def test_the_prefills_wait_for_its_decode_speaks_as_the_releases(env):
    """A prefill's wait for its decode to bootstrap a request (the bootstrap timeout, its
    warning, the failure's line) and a prefill request's finish are 0.5.23's (common/conn.py,
    prefill.py, environ.py), each line evaluated from the release's own f-strings."""
    prefill = source(env, "sglang/srt/disaggregation/prefill.py")
    conn = source(env, "sglang/srt/disaggregation/common/conn.py")
    environ = source(env, "sglang/srt/environ.py")
    assert f"{kv_sender.BOOTSTRAP_TIMEOUT_VAR} = EnvInt(300)" in environ
    warning = next(node for node in ast.walk(ast.parse(conn)) if isinstance(node, ast.Call)
                   and ast.unparse(node.func).endswith("warning_once") and node.args
                   and "timed out when bootstrapping" in ast.unparse(node.args[0]))
    assert evaluate(warning.args[0]) == kv_sender.BOOTSTRAP_TIMEOUT_WARNING
    room = 4411
    reason = evaluate(string_with(conn, "in KVPoll.Bootstrapping"),
                      self=SimpleNamespace(bootstrap_room=room), elapsed=3.04)
    assert reason == kv_sender.bootstrap_timeout_reason(room, 3.04)
    said = evaluate(string_with(prefill, "Prefill bootstrap failed for request"),
                    get_parallel=lambda: SimpleNamespace(tp_rank=0),
                    req=SimpleNamespace(rid="9f3a", bootstrap_room=room))
    error_text = evaluate(string_with(conn, "KVTransferError(bootstrap_room="),
                          self=SimpleNamespace(bootstrap_room=room, failure_reason=reason))
    said += evaluate(string_with(prefill, " with exception {e}"), e=error_text)
    assert said == kv_sender.bootstrap_failed_line(0, "9f3a", room, reason)
    assert "req.finished_reason = FINISH_LENGTH(length=0)" in prefill
    assert kv_sender.PREFILL_FINISH == {"type": "length", "length": 0}
