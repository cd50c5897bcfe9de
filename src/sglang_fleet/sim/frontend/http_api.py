"""The simulated HTTP API: SGLang 0.5.23's endpoints, status codes and bodies.

Modelled on sglang/srt/entrypoints/http_server.py (health_generate, ready, sagemaker_health
(/ping), model_info, server_info, available_models, retrieve_model (/v1/models/{model}),
flush_cache (GET and POST), freeze_gc, generate_request with the api_contract check and
_create_error_response, validation_exception_handler for bodies FastAPI cannot parse),
sglang/srt/utils/auth.py (decide_request_auth: /health*, /ready*, /metrics* need no key) and
sglang/srt/managers/tokenizer_manager.py (_handle_batch_request: a list of prompts answers a
list, or streams chunks that carry their `index`).
"""

from __future__ import annotations

import hmac
import inspect
import itertools
import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from sglang_fleet.sim.engine.runtime import VERSION, log, resolved_args
from sglang_fleet.sim.frontend import request_log, weight_export
from sglang_fleet.sim.frontend.serving import (
    STARTING,
    UNHEALTHY,
    UP,
    Aborted,
    Generation,
    ServerState,
    token_text,
)
from sglang_fleet.sim.pd.kv_receiver import KV_SENT_PATH, KVTransferAborted, hand_shake, rooms_of
from sglang_fleet.sim.pd.kv_sender import PREFILL_FINISH, bootstrap_failed_line, takes_transfer

UNAUTHENTICATED_PREFIXES = ("/health", "/ready", "/metrics")
# http_server.py's @auth_level(AuthLevel.ADMIN_OPTIONAL) routes, of those the simulator serves.
ADMIN_OPTIONAL = {"/flush_cache", "/freeze_gc", weight_export.INIT_PATH,
                  weight_export.SEND_PATH, *weight_export.TE_INFO_PATHS}
NORMAL, ADMIN_OPTIONAL_LEVEL = "normal", "admin_optional"
GET_PATHS = {"/health", "/health_generate", "/ready", "/ping", "/model_info", "/get_model_info",
             "/server_info", "/get_server_info", "/v1/models", "/metrics", "/flush_cache",
             "/freeze_gc", *weight_export.TE_INFO_PATHS}
POST_PATHS = {"/generate", "/v1/chat/completions", "/v1/completions", "/flush_cache",
              "/freeze_gc", weight_export.INIT_PATH, weight_export.SEND_PATH}
# The deprecated names of GET routes, each with the route it logs to use instead.
DEPRECATED_GET = {"/get_model_info": "/model_info", "/get_server_info": "/server_info",
                  weight_export.TE_INFO_PATHS[1]: weight_export.TE_INFO_PATHS[0]}
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running "
           "or waiting requests, the operation will not be performed.)\n")


def compact_json(value: Any) -> bytes:
    """JSON as orjson writes it (ORJSONResponse, dumps_json): compact, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def auth_level(path: str) -> str:
    return ADMIN_OPTIONAL_LEVEL if path in ADMIN_OPTIONAL else NORMAL


def _bearer(authorization: str | None, expected: str) -> bool:
    if not authorization:
        return False
    parts = authorization.split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and \
        hmac.compare_digest(parts[1], expected)


def decide_request_auth(method: str, path: str, authorization: str | None,
                        api_key: str | None, admin_api_key: str | None,
                        level: str) -> tuple[bool, int]:
    """utils/auth.py decide_request_auth for the levels the simulator's routes have:
    (allowed, status when refused). /health*, /ready* and /metrics* need no key; an
    admin-optional route needs the admin key when one is set (the API key is then not
    accepted), else the API key when one is set; every other route needs the API key."""
    if method == "OPTIONS" or path.startswith(UNAUTHENTICATED_PREFIXES):
        return True, 401
    if level == ADMIN_OPTIONAL_LEVEL and admin_api_key:
        return _bearer(authorization, admin_api_key), 401
    if api_key:
        return _bearer(authorization, api_key), 401
    return True, 401


class BadBody(Exception):
    """A body FastAPI refuses before SGLang's handler runs (RequestValidationError)."""

    def __init__(self, error: dict[str, Any]):
        super().__init__(error["msg"])
        self.error = error


def validation_error_body(error: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    """validation_exception_handler's ErrorResponse around FastAPI's error text, whose
    endpoint context names the handler that serves the route (here the simulator's)."""
    errors = [error]
    handler = Handler._generate
    where = (f'\n  File "{inspect.getsourcefile(handler)}", '
             f"line {inspect.getsourcelines(handler)[1]}, in generate_request\n    {method} {path}")
    exc_str = f"1 validation error:\n  {error}\n{where}".rstrip()
    return {"object": "error", "message": f"{exc_str} {errors}", "type": "Bad Request",
            "param": None, "code": 400}


def parse_body(raw: bytes) -> Any:
    if not raw:
        raise BadBody({"type": "missing", "loc": ("body",), "msg": "Field required",
                       "input": None})
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        raise BadBody({"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                       "input": {}, "ctx": {"error": e.msg}}) from None
    return body


def generate_abort_event(gen: Generation, message: str, status: int,
                         index: int | None) -> dict[str, Any]:
    """The chunk a /generate stream ends with when the scheduler aborts its request
    (tokenizer_manager: finish_reason abort with the message and status); `index` in a
    batch."""
    event = {"text": "", "output_ids": [], "meta_info": dict(
        gen.meta(True), finish_reason={"type": "abort", "message": message,
                                       "status_code": status})}
    if index is not None:
        event["index"] = index
    return event


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    state: ServerState  # set on the subclass built per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    # --- plumbing -------------------------------------------------------------------------
    def _access(self, code: int) -> None:
        reason = self.responses.get(code, ("",))[0]
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        log(f'INFO:     {client} - "{self.command} {self.path} HTTP/1.1" {code} {reason}')

    def _send(self, code: int, body: Any = b"", content_type: str | None = None) -> None:
        if isinstance(body, bytes | str):
            data = body.encode() if isinstance(body, str) else body
        else:
            # ORJSONResponse / JSONResponse: compact JSON
            data = compact_json(body)
            content_type = content_type or "application/json"
        self.send_response(code)
        if content_type and data:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._access(code)  # uvicorn logs when the response starts, before its body
        self.wfile.write(data)

    def _authorized(self, path: str) -> bool:
        args = self.state.rt.args
        allowed, code = decide_request_auth(
            self.command, path, self.headers.get("Authorization"), args.api_key,
            getattr(args, "admin_api_key", None), auth_level(path))
        if not allowed:
            self._send(code, {"error": "Unauthorized" if code == 401 else "Forbidden"})
        return allowed

    def _route(self, method: str) -> str | None:
        if method == "GET" and self._answered_kv_sent():
            return None
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            return None
        allowed = methods_of(path)
        if path == "/metrics" and not self.state.rt.args.enable_metrics:
            allowed = set()
        if method not in allowed:
            if allowed:
                self._send(405, {"detail": "Method Not Allowed"})
            else:
                self._send(404, {"detail": "Not Found"})
            return None
        return path

    # --- GET --------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self._route("GET")
        if path is None:
            return
        st, args = self.state, self.state.rt.args
        if path in DEPRECATED_GET:
            log(f"Endpoint '{path}' is deprecated and will be removed in a future version. "
                f"Please use '{DEPRECATED_GET[path]}' instead.")
        if path in ("/health", "/health_generate"):
            self._send(self._health(path))
        elif path == "/ready":
            self._send(200 if st.is_ready() else 503)
        elif path == "/ping":
            self._send(200 if st.is_healthy() else 503)
        elif path in ("/model_info", "/get_model_info"):
            self._send(200, self._model_info())
        elif path in ("/server_info", "/get_server_info"):
            self._send(200, self._server_info())
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [self._model_card()]})
        elif path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name != args.served_model_name:
                self._send(404, {"error": {"message": f"The model '{name}' does not exist",
                                           "type": "invalid_request_error", "param": "model",
                                           "code": "model_not_found"}})
            else:
                self._send(200, self._model_card())
        elif path == "/metrics":
            self._send(200, self.state.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/flush_cache":
            self._flush_cache()
        elif path == "/freeze_gc":
            self._send(200, "Garbage collection frozen.\n")
        elif path in weight_export.TE_INFO_PATHS:
            self._transfer_engine_info()

    def _transfer_engine_info(self) -> None:
        query = parse_qs(urlparse(self.path).query)
        try:
            rank = int(query["rank"][0]) if "rank" in query else None
        except ValueError:
            rank = None
        self._send(*weight_export.WeightExporter.transfer_engine_info(rank))

    def _weight_send(self, path: str, body: Any) -> None:
        """A seed's weight-send group for another server (weight_export)."""
        bad = weight_export.missing_field(path, body)
        if bad:
            raise BadBody(bad)
        exporter = self.state.weight_exporter
        if path == weight_export.INIT_PATH:
            success, message = exporter.init_group(body)
        else:
            success, message = exporter.send_weights(body)
        self._send(200 if success else 400, {"success": success, "message": message})

    def _model_card(self) -> dict[str, Any]:
        name = self.state.rt.args.served_model_name
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": name, "parent": None, "max_model_len": self.state.rt.context_len()}

    def _server_info(self) -> dict[str, Any]:
        """http_server.server_info: the resolved arguments, the launch command, the first
        scheduler's init info (utils/common.py build_server_info), the engine's start-up
        times and each DP rank's internal state, which the schedulers answer with no timeout
        (a stuck scheduler leaves this request hanging)."""
        st = self.state
        resolved = resolved_args(st.rt.args, st.rt)
        internal = []
        for replica in st.replicas:
            own = st.hub.ask(replica.pids, "internal_state")
            internal.append({**resolved, **own, "last_gen_throughput": st.last_gen_throughput})
        info = {**resolved, "launch_command": st.launch_command, **st.scheduler_info,
                "kv_events": None}
        info.update(startup_time=st.startup_time, internal_states=internal, version=VERSION,
                    frontend="python", simulated=True)
        return info

    def _model_info(self) -> dict[str, Any]:
        rt, args = self.state.rt, self.state.rt.args
        return {"model_path": args.model_path, "served_model_name": args.served_model_name,
                "tokenizer_path": getattr(args, "tokenizer_path", None) or args.model_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": "default", "load_format": getattr(args, "load_format", "auto"),
                "reasoning_parser": getattr(args, "reasoning_parser", None),
                "tool_call_parser": getattr(args, "tool_call_parser", None),
                "disaggregation_mode": getattr(args, "disaggregation_mode", None) or "null",
                "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "sglang-fleet-simulated",
                "architectures": [rt.model_type]}

    def _health(self, path: str) -> int:
        """http_server.health_generate: a 1-token generation; any output within
        SGLANG_HEALTH_CHECK_TIMEOUT (checked once a second) makes the server Up again."""
        st = self.state
        if st.gracefully_exit:
            log("Health check request received during shutdown. Returning 503.")
            return 503
        if st.status == STARTING:
            return 503
        if (os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1").lower()
                in ("0", "false", "no", "off") and path == "/health"):
            return 200
        # input_ids=[0], 1 token, rid HEALTH_CHECK_<hex> (constants.py HEALTH_CHECK_RID_PREFIX)
        gen = Generation(st, (0,), 1, st.route(health=True),
                         rid=f"HEALTH_CHECK_{uuid.uuid4().hex}")
        gen.temperature = 0.0  # its sampling_params: max_new_tokens 1, temperature 0
        threading.Thread(target=st.health_generation, args=(gen,), daemon=True).start()
        tic = time.time()
        while time.time() < tic + st.health_timeout:
            time.sleep(1)
            if st.last_receive_tstamp > tic:
                st.status = UP
                return 200
        log(f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{st.health_timeout} seconds. tic start time: "
            f"{time.strftime('%H:%M:%S', time.localtime(tic))}. last_heartbeat time: "
            f"{time.strftime('%H:%M:%S', time.localtime(st.last_receive_tstamp))}")
        st.status = UNHEALTHY
        return 503

    def _flush_cache(self) -> None:
        if self.state.flush_cache(self.state.replicas[0].prefix):
            self._send(200, FLUSHED)
        else:
            self._send(400, "Flush cache failed.\n")

    # --- POST -------------------------------------------------------------------------------
    def do_PUT(self) -> None:  # noqa: N802 - stdlib name
        self.do_POST(method="PUT")

    def do_POST(self, method: str = "POST") -> None:  # noqa: N802 - stdlib name
        path = self._route(method)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path is None:
            return
        if path == "/flush_cache":
            self._flush_cache()
            return
        if path == "/freeze_gc":
            self._send(200, "Garbage collection frozen.\n")
            return
        try:
            body = parse_body(raw)
            if path == "/generate":
                self._generate(body)
            elif path in (weight_export.INIT_PATH, weight_export.SEND_PATH):
                self._weight_send(path, body)
            else:
                self._openai(path, body if isinstance(body, dict) else {})
        except BadBody as bad:
            self._send(400, validation_error_body(bad.error, self.command, path))

    def _generate(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise BadBody({"type": "dataclass_type", "loc": ("body",),
                           "msg": "Input should be a dictionary or an instance of "
                                  "GenerateReqInput", "input": body,
                           "ctx": {"class_name": "GenerateReqInput"}})
        prompts = _prompts(body)
        if prompts is None:
            self._client_error(body, "Either text, input_ids or input_embeds should be "
                                     "provided.")
            return
        keys, batched = prompts
        st = self.state
        rid = uuid.uuid4().hex
        logged = self._log_received(body, rid)
        params = body.get("sampling_params") or {}
        params = params if isinstance(params, list) else [params] * len(keys)
        if not self._sampling_params_valid(body, params):
            return
        gens = [Generation(st, key, int((params[i] or {}).get("max_new_tokens", 128)),
                           st.route(), st.take_warmup_delay())
                for i, key in enumerate(keys)]
        streaming = bool(body.get("stream"))
        for i, (gen, sampling) in enumerate(zip(gens, params, strict=True)):
            gen.streaming = streaming
            gen.temperature = temperature_of(sampling)
            gen.return_logprob = bool(per_prompt(body.get("return_logprob"), i))
            gen.top_logprobs_num = int(per_prompt(body.get("top_logprobs_num"), i) or 0)
            gen.text_in_logprobs = bool(body.get("return_text_in_logprobs"))
        if streaming:
            # http_server.serve_generate_request returns its StreamingResponse at once: the 200
            # goes out before the scheduler sees the request (a PD hand-shake included), and
            # every outcome after it is a chunk of the stream.
            self._start_stream()
        if not self._kv_hand_shake(body, gens, "generate", batched, started=streaming):
            return
        prefilled = threading.Event()

        def on_prefill(_gen: Generation) -> None:
            if not prefilled.is_set():
                prefilled.set()
                for replica in {id(g.replica): g.replica for g in gens}.values():
                    st.log_prefill([g for g in gens if g.replica is replica])
                self._kv_sent(body, len(gens))

        if streaming:
            self._stream_generations(gens, batched, on_prefill)
            return
        results = self._collect(gens, on_prefill)
        if any(r is None for r in results):
            return  # generation never finished: the connection dies with the server
        aborted = next((r for r in results if isinstance(r, Aborted)), None)
        if aborted is not None:
            self._send_aborted(aborted.status, aborted.message)
            return
        if logged:
            self._log_finished(body, rid, results if batched else results[0])
        self._send(200, results if batched else results[0])

    @staticmethod
    def _collect(gens: list[Generation], on_prefill) -> list[Any]:
        """Each generation's result (None: it never finished; Aborted: aborted with a
        status)."""
        results: list[Any] = [None] * len(gens)

        def collect(i: int) -> None:
            try:
                n = sum(1 for _ in gens[i].run(on_prefill))
            except Aborted as abort:
                results[i] = abort
                return
            results[i] = {"text": gens[i].text(n), "output_ids": gens[i].output_ids(n),
                          "meta_info": gens[i].meta(True)}

        threads = [threading.Thread(target=collect, args=(i,), daemon=True)
                   for i in range(len(gens))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    def _send_aborted(self, status: int, message: str) -> None:
        """An abort's HTTPException through http_server's HTTPException handler (and
        openai/serving_base.py handle_request): an ErrorResponse with the status as type."""
        self._send(status, {"object": "error", "message": message, "type": str(status),
                            "param": None, "code": status})

    def _kv_sent(self, body: dict[str, Any], count: int) -> None:
        """A prefill has computed the request's prefill: its KV cache goes to the decode."""
        st = self.state
        if st.kv_sender is not None and not st.rt.has("transfer_hang"):
            st.kv_sender.mark_sent(rooms_of(body, count))

    def _answered_kv_sent(self) -> bool:
        """A prefill's answer at the simulator's stand-in for the transfer (kv_receiver.
        KV_SENT_PATH: a decode's first ask bootstraps the room, `sent` is its completion): not
        an SGLang endpoint, and outside the API key, as the transfer is. False for any other
        request."""
        url = urlparse(self.path)
        if self.state.kv_sender is None or url.path != KV_SENT_PATH:
            return False
        room = parse_qs(url.query).get("room", [""])[0]
        self._send(200, {"room": room, "sent": self.state.kv_sender.asked(room)})
        return True

    def _kv_hand_shake(self, body: dict[str, Any], gens: list[Generation], api: str,
                       batched: bool = False, started: bool = False) -> bool:
        """A PD request's hand-shake: a decode looks its prefill up and waits for the KV cache
        (kv_receiver), a prefill waits for its decode to bootstrap the request and then answers
        after the first token (kv_sender). False when the request was aborted and answered: a
        500 with the hand-shake's message, or in a stream the abort (tokenizer_manager for
        /generate, serving_chat's streaming error for OpenAI, whose 200 waits for that first
        chunk: `started` says whether the stream's 200 has gone out already)."""
        try:
            self._kv_wait(body, gens)
        except KVTransferAborted as abort:
            if not body.get("stream"):
                self._send_aborted(abort.status, str(abort))
                return False
            if not started:
                self._start_stream()
            for i, gen in enumerate(gens):
                self._event(generate_abort_event(gen, str(abort), abort.status,
                                                 i if batched else None)
                            if api == "generate" else
                            {"error": {"object": "error", "message": str(abort),
                                       "type": "INTERNAL_SERVER_ERROR", "param": None,
                                       "code": abort.status}})
            self._end_stream()
            return False
        return True

    def _kv_wait(self, body: dict[str, Any], gens: list[Generation]) -> None:
        st = self.state
        if st.prefill_info is not None:
            hand_shake(st.prefill_info, body, [gen.rid for gen in gens])
        if st.kv_sender is None or not takes_transfer(body):
            return
        for gen in gens:
            gen.max_new_tokens, gen.finish_reason = 1, PREFILL_FINISH
        prefix = gens[0].replica.prefix if gens else ""
        rooms = rooms_of(body, len(gens))
        reasons = st.kv_sender.wait_bootstrapped(rooms, lambda line: log(line, prefix))
        failed = [bootstrap_failed_line(0, gen.rid, room, reason)
                  for gen, room, reason in zip(gens, rooms, reasons, strict=True) if reason]
        if failed:
            for line in failed:
                log(line, prefix)
            raise KVTransferAborted(failed[0])

    # --- --log-requests (utils/request_logger.py) -------------------------------------------
    def _request_log_options(self) -> tuple[bool, int, str]:
        args = self.state.rt.args
        level = getattr(args, "log_requests_level", None)
        return (bool(getattr(args, "log_requests", False)), 2 if level is None else int(level),
                getattr(args, "log_requests_format", None) or "text")

    def _log_received(self, body: dict[str, Any], rid: str) -> bool:
        """The request's record as it arrives (before validation), when requests are logged."""
        enabled, level, fmt = self._request_log_options()
        if enabled:
            log(request_log.received(body, rid, level, fmt))
        return enabled

    def _log_finished(self, body: dict[str, Any], rid: str, out: Any) -> None:
        _, level, fmt = self._request_log_options()
        log(request_log.finished(body, rid, out, level, fmt))

    def _client_error(self, body: dict[str, Any], message: str) -> None:
        """A ValueError of the tokenizer manager: serve_generate_request logs it and answers
        400, or, for a stream (whose 200 went out with the StreamingResponse), sends it as the
        stream's one chunk before [DONE]."""
        log(f"[http_server] Error: {message}")
        if body.get("stream"):
            self._start_stream()
            self._event({"error": {"message": message, "type": "invalid_request_error",
                                   "code": 400, "retryable": False}})
            self._end_stream()
        else:
            self._send(400, {"error": {"message": message}})

    def _sampling_params_valid(self, body: dict[str, Any], params: list[Any]) -> bool:
        """SamplingParams.verify on max_new_tokens: a negative number is the client's error
        (a ValueError: _client_error); a value that is not a number raises TypeError, which
        FastAPI answers with 500 and uvicorn logs as an ASGI exception."""
        for one in params:
            value = (one or {}).get("max_new_tokens") if isinstance(one, dict) else None
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                log("ERROR:    Exception in ASGI application\n"
                    "Traceback (most recent call last):\n"
                    f'  File "{__file__}", line 1, in generate_request\n'
                    "    sampling_params.verify(self.model_config.vocab_size)\n"
                    "TypeError: '<' not supported between instances of "
                    f"'{type(value).__name__}' and 'int'")
                self._send(500, "Internal Server Error")
                return False
            if value < 0:
                self._client_error(body, f"max_new_tokens must be at least 0, got {value}.")
                return False
        return True

    def _stream_generations(self, gens: list[Generation], batched: bool, on_prefill) -> None:
        lock = threading.Lock()

        def stream(i: int) -> None:
            gen = gens[i]
            text = ""
            try:
                for t in gen.run(on_prefill):
                    text += token_text(gen.token(t))
                    self._stream_event(gen, text, t, batched, i, lock)
            except Aborted as abort:  # tokenizer_manager: a stream yields the abort
                with lock:
                    self._event(generate_abort_event(gen, abort.message, abort.status,
                                                     i if batched else None))

        threads = [threading.Thread(target=stream, args=(i,), daemon=True)
                   for i in range(len(gens))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._end_stream()

    def _stream_event(self, gen: Generation, text: str, t: int, batched: bool, i: int,
                      lock: threading.Lock) -> None:
        done = t + 1 == gen.planned
        event = {"text": text, "output_ids": gen.output_ids(t + 1), "meta_info": gen.meta(done)}
        if batched:
            event["index"] = i
        with lock:
            self._event(event)

    def _openai(self, path: str, body: dict[str, Any]) -> None:
        chat = path.endswith("chat/completions")
        st, args = self.state, self.state.rt.args
        prompt_text = (" ".join(str(m.get("content", "")) for m in body.get("messages", []))
                       if chat else str(body.get("prompt", "")))
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 128)
        gen = Generation(st, tuple(prompt_text.split()), max_tokens, st.route(),
                         st.take_warmup_delay())
        gen.streaming = bool(body.get("stream"))
        gen.temperature = temperature_of(body)
        if not self._kv_hand_shake(body, [gen], "openai"):
            return
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{gen.rid}"
        obj = "chat.completion" if chat else "text_completion"
        created = int(time.time())

        def on_prefill(g: Generation) -> None:
            st.log_prefill([g])
            self._kv_sent(body, 1)

        tokens = gen.run(on_prefill)
        try:  # the scheduler admits it or aborts it before any output
            first = next(tokens, None)
        except Aborted as abort:
            self._send_aborted(abort.status, abort.message)
            return
        tokens = itertools.chain(() if first is None else (first,), tokens)
        if body.get("stream"):
            self._start_stream()
            base = {"id": rid, "object": f"{obj}.chunk" if chat else obj, "created": created,
                    "model": args.served_model_name}
            if chat:
                self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                             "content": ""}, "finish_reason": None}]})
            n = 0
            for i in tokens:
                n = i + 1
                delta = ({"delta": {"content": token_text(gen.token(i))}} if chat
                         else {"text": token_text(gen.token(i))})
                self._event({**base, "choices": [{"index": 0, **delta,
                                                  "finish_reason": None}]})
            final = {"delta": {}} if chat else {"text": ""}
            self._event({**base, "choices": [{"index": 0, **final,
                                              "finish_reason": gen.finish_type()}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": gen.prompt_tokens, "completion_tokens": n,
                         "total_tokens": gen.prompt_tokens + n}
                self._event({**base, "choices": [], "usage": usage})
            self._end_stream()
            return
        n = sum(1 for _ in tokens)
        text = gen.text(n)
        choice = ({"message": {"role": "assistant", "content": text}} if chat
                  else {"text": text})
        self._send(200, {"id": rid, "object": obj, "created": created,
                         "model": args.served_model_name,
                         "choices": [{"index": 0, **choice,
                                      "finish_reason": gen.finish_type()}],
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
        # http_server's dumps_json (orjson): compact
        self.wfile.write(b"data: " + compact_json(payload) + b"\n\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def temperature_of(params: Any) -> float:
    """A request's temperature as SamplingParams takes it (absent or null: 1.0); only what
    the watchdog's debug info reports."""
    value = params.get("temperature") if isinstance(params, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else 1.0


def per_prompt(value: Any, i: int) -> Any:
    """A GenerateReqInput field given once for all prompts or as a list, one per prompt."""
    return value[i] if isinstance(value, list) else value


def methods_of(path: str) -> set[str]:
    """The methods SGLang's routes accept on `path` (empty: no such route)."""
    if path.startswith("/v1/models/"):
        return {"GET"}
    methods = set()
    if path in GET_PATHS:
        methods.add("GET")
    if path in POST_PATHS:
        methods.add("POST")
    if path == "/generate":
        methods.add("PUT")
    return methods


def _prompts(body: dict[str, Any]) -> tuple[list[tuple[Any, ...]], bool] | None:
    """Token keys of each prompt and whether the request is a batch (a list of prompts), as
    GenerateReqInput._determine_batch_size reads `text` and `input_ids`."""
    text, ids = body.get("text"), body.get("input_ids")
    if text is not None:
        if isinstance(text, list):
            return [tuple(str(t).split()) or ("",) for t in text], True
        return [tuple(str(text).split()) or ("",)], False
    if ids is not None:
        if ids and isinstance(ids[0], list):
            return [tuple(x) for x in ids], True
        return [tuple(ids)], False
    return None

