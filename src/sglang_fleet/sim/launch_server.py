"""sglang-sim: the simulated `sglang serve` main process (HTTP server + tokenizer manager).

Takes SGLang 0.5.23's flags, starts the scheduler and detokenizer workers, waits for them to
load, then serves SGLang's HTTP endpoints on loopback. Decode speed comes from the simulator
profile and is SIMULATED. Faults come from SGLANG_SIM_FAULT or from a matching Rule.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sglang_fleet.sim.runtime import SimRuntime, effective_backend, load_runtime, log
from sglang_fleet.sim.server_args import VERSION, prepare_server_args

UNAUTHENTICATED_PREFIXES = ("/health", "/ready", "/metrics")


class ServerState:
    """Status flags the HTTP handlers read; one lock guards the counters."""

    def __init__(self, rt: SimRuntime):
        self.rt = rt
        self.ready = False
        self.unhealthy = False
        self.shutting_down = False
        self.inflight = 0
        self.generated_tokens = 0
        self.last_gen_throughput = 0.0
        self.lock = threading.Lock()
        self.health_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.hang_generation = rt.has("hang_generation")
        self.stop_event = threading.Event()


class Generation:
    """Paces tokens on an absolute schedule so the measured speed matches the profile."""

    def __init__(self, state: ServerState, prompt_tokens: int, max_new_tokens: int):
        self.state = state
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max(1, max_new_tokens)
        self.rid = uuid.uuid4().hex
        self.start = time.monotonic()

    def tokens(self):
        st = self.state
        if st.hang_generation:
            # Generation hangs after ready: nothing ever comes out.
            st.stop_event.wait()
            return
        tok_s = st.rt.decode_tok_s()
        ttft = float(st.rt.profile.get("ttft_s", 0.1))
        for i in range(self.max_new_tokens):
            due = self.start + ttft + i / tok_s
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if st.hang_generation:
                # A hang mid-serve stalls the requests already running too, as a stuck
                # scheduler does.
                st.stop_event.wait()
                return
            with st.lock:
                st.generated_tokens += 1
            yield i
        elapsed = time.monotonic() - self.start - ttft
        if self.max_new_tokens > 1 and elapsed > 0:
            st.last_gen_throughput = (self.max_new_tokens - 1) / elapsed

    def meta(self, completion_tokens: int, done: bool) -> dict[str, Any]:
        return {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "finish_reason": {"type": "length", "length": completion_tokens} if done else None,
            "e2e_latency": time.monotonic() - self.start,
        }


def _token_text(i: int) -> str:
    return f" tok{i}"


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    state: ServerState  # set on the subclass built per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _access(self, code: int) -> None:
        reason = self.responses.get(code, ("",))[0]
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        log(f'INFO:     {client} - "{self.command} {self.path} HTTP/1.1" {code} {reason}')

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self._access(code)

    def _authorized(self) -> bool:
        key = self.state.rt.args.api_key
        if not key or self.path.startswith(UNAUTHENTICATED_PREFIXES):
            return True
        if self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}

    # --- GET ---------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0]
        st, args = self.state, self.state.rt.args
        if path in ("/health", "/health_generate"):
            self._send(*self._health())
        elif path == "/ready":
            ok = st.ready and not st.shutting_down
            self._send(200 if ok else 503, {"status": "ready" if ok else "not ready"})
        elif path in ("/model_info", "/get_model_info"):
            self._send(200, {"model_path": args.model_path, "tokenizer_path": args.model_path,
                             "is_generation": True, "served_model_name": args.served_model_name,
                             "model_type": st.rt.model_type, "weight_version": "default"})
        elif path in ("/server_info", "/get_server_info"):
            info = dict(vars(args))
            info.pop("api_key", None)
            info.update({"attention_backend": effective_backend(st.rt), "version": VERSION,
                         "internal_states": [{"last_gen_throughput": st.last_gen_throughput}],
                         "simulated": True})
            self._send(200, info)
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": args.served_model_name, "object": "model", "created": int(time.time()),
                "owned_by": "sglang", "root": args.model_path, "max_model_len": 262144}]})
        elif path == "/metrics" and args.enable_metrics:
            labels = f'model_name="{args.served_model_name}"'
            self._send(200, "\n".join([
                "# HELP sglang:num_running_reqs The number of running requests.",
                "# TYPE sglang:num_running_reqs gauge",
                f"sglang:num_running_reqs{{{labels}}} {st.inflight}",
                "# HELP sglang:gen_throughput The generation throughput (token/s).",
                "# TYPE sglang:gen_throughput gauge",
                f"sglang:gen_throughput{{{labels}}} {st.last_gen_throughput:.3f}",
                "# HELP sglang:generation_tokens_total Generated tokens.",
                "# TYPE sglang:generation_tokens_total counter",
                f"sglang:generation_tokens_total{{{labels}}} {st.generated_tokens}",
                "",
            ]), "text/plain; version=0.0.4")
        else:
            self._send(404, {"detail": "Not Found"})

    def _health(self) -> tuple[int, Any]:
        st = self.state
        if not st.ready or st.shutting_down or st.unhealthy:
            return 503, ""
        # One-token generation, as SGLang's health handler does, under its own timeout.
        done = threading.Event()

        def one_token() -> None:
            for _ in Generation(st, 1, 1).tokens():
                pass
            done.set()

        threading.Thread(target=one_token, daemon=True).start()
        if done.wait(st.health_timeout):
            return 200, ""
        st.unhealthy = True
        log(f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{st.health_timeout:.0f} seconds. tic start time: {time.time():.0f}")
        return 503, ""

    # --- POST --------------------------------------------------------------------------
    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0]
        body = self._body()
        st = self.state
        if path == "/flush_cache":
            if st.inflight:
                self._send(400, "Cache not flushed: requests are running.", "text/plain")
            else:
                self._send(200, "Cache flushed.", "text/plain")
            return
        if path not in ("/generate", "/v1/chat/completions", "/v1/completions"):
            self._send(404, {"detail": "Not Found"})
            return
        if not st.ready or st.shutting_down:
            self._send(503, {"error": "server is not ready"})
            return
        with st.lock:
            st.inflight += 1
        try:
            if path == "/generate":
                self._generate(body)
            else:
                self._openai(path, body)
        finally:
            with st.lock:
                st.inflight -= 1

    def _generate(self, body: dict[str, Any]) -> None:
        params = body.get("sampling_params") or {}
        ids = body.get("input_ids")
        prompt = len(ids) if isinstance(ids, list) else len(str(body.get("text", "")).split())
        gen = Generation(self.state, prompt, int(params.get("max_new_tokens", 128)))
        if body.get("stream"):
            self._start_stream()
            text = ""
            for i in gen.tokens():
                text += _token_text(i)
                self._event({"text": text, "output_ids": list(range(i + 1)),
                             "meta_info": gen.meta(i + 1, i + 1 == gen.max_new_tokens)})
            self._end_stream()
            return
        n = sum(1 for _ in gen.tokens())
        self._send(200, {"text": "".join(_token_text(i) for i in range(n)),
                         "output_ids": list(range(n)), "meta_info": gen.meta(n, True)})

    def _openai(self, path: str, body: dict[str, Any]) -> None:
        chat = path.endswith("chat/completions")
        args = self.state.rt.args
        prompt_text = (" ".join(str(m.get("content", "")) for m in body.get("messages", []))
                       if chat else str(body.get("prompt", "")))
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 128)
        gen = Generation(self.state, len(prompt_text.split()), max_tokens)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{gen.rid}"
        obj = "chat.completion" if chat else "text_completion"
        created = int(time.time())
        usage = None
        if body.get("stream"):
            self._start_stream()
            base = {"id": rid, "object": f"{obj}.chunk" if chat else obj, "created": created,
                    "model": args.served_model_name}
            if chat:
                self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                             "content": ""}, "finish_reason": None}]})
            n = 0
            for i in gen.tokens():
                n = i + 1
                delta = ({"delta": {"content": _token_text(i)}} if chat
                         else {"text": _token_text(i)})
                self._event({**base, "choices": [{"index": 0, **delta,
                                                  "finish_reason": None}]})
            final = {"delta": {}} if chat else {"text": ""}
            self._event({**base, "choices": [{"index": 0, **final, "finish_reason": "length"}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": gen.prompt_tokens, "completion_tokens": n,
                         "total_tokens": gen.prompt_tokens + n}
                self._event({**base, "choices": [], "usage": usage})
            self._end_stream()
            return
        n = sum(1 for _ in gen.tokens())
        text = "".join(_token_text(i) for i in range(n))
        choice = ({"message": {"role": "assistant", "content": text}} if chat
                  else {"text": text})
        self._send(200, {"id": rid, "object": obj, "created": created,
                         "model": args.served_model_name,
                         "choices": [{"index": 0, **choice, "finish_reason": "length"}],
                         "usage": {"prompt_tokens": gen.prompt_tokens, "completion_tokens": n,
                                   "total_tokens": gen.prompt_tokens + n}})

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self._access(200)

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class SimServer:
    def __init__(self, rt: SimRuntime, argv: list[str]):
        self.rt = rt
        self.argv = argv
        self.state = ServerState(rt)
        self.children: list[subprocess.Popen] = []
        self.term = threading.Event()

    def spawn_workers(self) -> int:
        args = self.rt.args
        read_fd, write_fd = os.pipe()
        me = str(os.getpid())
        self.children.append(subprocess.Popen(
            [sys.executable, "-m", "sglang_fleet.sim.detokenizer", me]))
        per_node = max(args.tp_size // max(args.nnodes, 1), 1)
        for local in range(per_node):
            rank = args.node_rank * per_node + local
            self.children.append(subprocess.Popen(
                [sys.executable, "-m", "sglang_fleet.sim.scheduler", "--rank", str(rank),
                 "--status-fd", str(write_fd), "--parent-pid", me, "--", *self.argv],
                pass_fds=(write_fd,)))
        os.close(write_fd)
        return read_fd

    def wait_for_schedulers(self, read_fd: int) -> bool:
        expected = max(self.rt.args.tp_size // max(self.rt.args.nnodes, 1), 1)
        ready: set[str] = set()
        buf = b""
        while len(ready) < expected:
            if self.term.is_set():
                return False
            readable, _, _ = select.select([read_fd], [], [], 0.5)
            if readable:
                chunk = os.read(read_fd, 4096)
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    kind, _, rest = line.decode().partition(" ")
                    if kind == "ready":
                        ready.add(rest)
            for child in self.children:
                if child.poll() not in (None, 0):
                    log("Received sigquit from a child process. It usually means the child "
                        "failed.")
                    return False
        return True

    def kill_children(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.terminate()
        for child in self.children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()

    def hang_forever(self) -> None:
        # Main process stuck (e.g. before the port opens): alive, no progress.
        while not self.term.is_set():
            self.term.wait(1.0)

    def serve(self) -> int:
        # A shared-memory segment like SGLang's: removed on a clean exit, leaked by SIGKILL.
        segment = os.path.join(self.rt.shm_dir, f"psm_sglang_sim_{os.getpid()}")
        with open(segment, "wb") as held:
            held.truncate(1 << 16)
            try:
                return self._serve()
            finally:
                os.unlink(segment)

    def _serve(self) -> int:
        rt, args, st = self.rt, self.rt.args, self.state
        signal.signal(signal.SIGTERM, lambda *_: self.term.set())
        # SIGUSR1 makes a running server hang in generation from now on: a hang after start,
        # for watch mode's tests (real servers have no such switch).
        signal.signal(signal.SIGUSR1, lambda *_: setattr(st, "hang_generation", True))
        if not args.attention_backend:
            log(f"Attention backend not specified. Use {effective_backend(rt)} backend by "
                f"default.")
        read_fd = self.spawn_workers()
        if not self.wait_for_schedulers(read_fd):
            self.kill_children()
            return 0 if self.term.is_set() else 1
        if args.node_rank != 0:
            # Only rank 0 of a multi-node server serves HTTP; the others keep their workers.
            self.term.wait()
            self.kill_children()
            return 0
        time.sleep(rt.duration("starting_http"))
        fault = rt.fault_at("starting_http")
        if fault and fault.kind == "hang":
            self.hang_forever()
            self.kill_children()
            return 0
        handler = type("BoundHandler", (Handler,), {"state": st})
        try:
            httpd = ThreadingHTTPServer((args.host, args.port), handler)
        except OSError as exc:
            log(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                f"('{args.host}', {args.port}): {exc.strerror}")
            self.kill_children()
            return 1
        httpd.daemon_threads = True
        log(f"INFO:     Started server process [{os.getpid()}]")
        log("INFO:     Waiting for application startup.")
        log("INFO:     Application startup complete.")
        log(f"INFO:     Uvicorn running on http://{args.host}:{args.port} "
            f"(Press CTRL+C to quit)")
        threading.Thread(target=httpd.serve_forever, daemon=True).start()

        if not args.skip_server_warmup:
            log('INFO:     127.0.0.1:0 - "GET /model_info HTTP/1.1" 200 OK')
            time.sleep(rt.duration("warming_up"))
            fault = rt.fault_at("warming_up")
            if fault and fault.kind == "hang":
                self.hang_forever()
            elif fault:
                log(f"Initialization failed. warmup error: Traceback (most recent call last):\n"
                    f"{fault.message or 'RuntimeError: simulated warm-up failure'}")
                httpd.shutdown()
                self.kill_children()
                return 1
            log("Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, "
                "token usage: 0.00, #running-req: 0, #queue-req: 0", " TP0")
            log('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
        st.ready = True
        log("The server is fired up and ready to roll!")

        self.term.wait()
        # SIGTERM drains in-flight requests; it exits early only when already unhealthy.
        st.shutting_down = True
        while st.inflight and not st.unhealthy:
            time.sleep(0.2)
        st.stop_event.set()
        httpd.shutdown()
        self.kill_children()
        return 0


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = prepare_server_args(argv)  # argparse: exit 2 with SGLang's message on a bad flag
    # As SGLang 0.5.23 does: every argument, the API key included, goes to the log.
    log("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in vars(args).items())
        + ")")
    try:
        rt = load_runtime(args)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        log(f"{type(exc).__name__}: {exc}")
        sys.exit(1)
    sys.exit(SimServer(rt, argv).serve())


if __name__ == "__main__":
    main()
