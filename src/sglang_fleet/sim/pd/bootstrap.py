"""The prefill server's KV bootstrap server, as SGLang 0.5.23 runs it
(sglang/srt/disaggregation/common/conn.py, CommonKVBootstrapServer): an HTTP server in a thread
of the tokenizer process, on --disaggregation-bootstrap-port, where decode servers look up the
prefill's ranks. Started by the tokenizer manager before the HTTP server
(sglang/srt/managers/disagg_service.py start_disagg_service).

A port it cannot bind ends its thread with one error record and a traceback; the server starts
and its /health answers 200 regardless, as the real one does (the failure the gate catches by
asking this server's own /health).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from sglang_fleet.sim.engine.runtime import log

# disaggregation/utils.py: the bootstrap host of a PD server's own warm-up requests.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
# Where _run_server's bind fails in 0.5.23 (tests/reference holds it to the file).
BIND_FRAME = ("sglang/srt/disaggregation/common/conn.py", 3320,
              "self._loop.run_until_complete(site.start())")
# What the server logs around them (tests/reference holds each to the release's source).
PD_WARMUP_START = "Start of pd disaggregation warmup ..."
PD_WARMUP_DONE = "Disaggregation warmup requests completed for all %s DP ranks"
PD_WARMUP_END = "End of disaggregation warmup"
PD_WARMUP_FAILED = "Disaggregation warmup failed (mode=%s), status codes: %s"
MISSING_INPUTS = "Missing inputs for bootstrap server."
ROUTE_KEYS = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")


def server_info(args: Any) -> dict[str, Any]:
    """What GET /route answers for the whole prefill (conn.py PrefillServerInfo), from the
    server's own arguments as its ranks register them."""
    attn_dp = getattr(args, "attn_dp_size", None) or 1
    return {"attn_tp_size": max(1, args.tp_size // attn_dp), "attn_cp_size": 1,
            "dp_size": attn_dp if (getattr(args, "dp_size", 1) or 1) == 1 else args.dp_size,
            "pp_size": getattr(args, "pp_size", 1) or 1,
            "page_size": getattr(args, "page_size", None) or 1,
            "kv_cache_dtype": getattr(args, "kv_cache_dtype", "auto"),
            "follow_bootstrap_room": True, "enable_dsa_cache_layer_split": False,
            "enable_kv_cache_sharding": False, "prefill_http_port": args.port,
            "decode_allocation_policy": getattr(args, "disaggregation_decode_allocation_policy",
                                                None) or "early"}


class BootstrapHandler(BaseHTTPRequestHandler):
    info: dict[str, Any] = {}
    rooms: dict[int, int] = {}

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # aiohttp's access log is off below DEBUG

    def _answer(self, status: int, body: Any, content_type: str = "text/plain") -> None:
        data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str)
                         else content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        url = urlparse(self.path)
        if url.path == "/health":
            self._answer(200, "OK")
        elif url.path == "/route":
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if not all(query.get(k) for k in ROUTE_KEYS):
                self._answer(400, MISSING_INPUTS)
            elif all(query[k] == "-1" for k in ROUTE_KEYS):
                self._answer(200, self.info)
                self._looked_up()
            else:
                self._answer(200, {"rank_ip": self.server.server_address[0],
                                   "rank_port": self.server.server_address[1]})
        else:
            self._answer(404, "404: Not Found")

    def _looked_up(self) -> None:
        """A decode has looked this prefill up: the fault waiting for that, once."""
        hook = getattr(self.server, "after_lookup", None)
        if hook is not None:
            self.server.after_lookup = None  # type: ignore[attr-defined]
            threading.Thread(target=hook, daemon=True).start()

    def do_PUT(self) -> None:  # noqa: N802 - stdlib name
        self._body()
        self._answer(200, "OK") if urlparse(self.path).path == "/route" else \
            self._answer(405, "Method not allowed", "application/json")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path, data = urlparse(self.path).path, self._body()
        if path == "/register_dp_rank":
            self.rooms[int(data["bootstrap_room"])] = int(data["dp_rank"])
            self._answer(200, "OK")
        elif path == "/query_dp_ranks":
            self._answer(200, {str(r): self.rooms[int(r)] for r in data["bootstrap_rooms"]
                               if int(r) in self.rooms})
        else:
            self._answer(405, "Method not allowed", "application/json")

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}


class BootstrapServer:
    """The running bootstrap server of a prefill; `stop()` ends it as a dead thread would."""

    def __init__(self, httpd: ThreadingHTTPServer):
        self.httpd = httpd
        self.stopped = threading.Event()
        threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def stop_after_first_lookup(self) -> None:
        """The bootstrap_dead fault: the thread ends once a decode has looked the prefill up,
        so that decode keeps the prefill's info and serves on until its heartbeat loses the
        prefill (as a real one does), while a look-up after that cannot succeed."""
        self.httpd.after_lookup = self.stop  # type: ignore[attr-defined]

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def start_bootstrap_server(args: Any) -> BootstrapServer | None:
    """CommonKVBootstrapServer.__init__ and _run_server: bind, say so, serve; or log the bind
    error as SGLang does and leave the server without one."""
    host, port = args.host, args.disaggregation_bootstrap_port
    handler = type("BoundBootstrapHandler", (BootstrapHandler,),
                   {"info": server_info(args), "rooms": {}})
    try:
        httpd = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        error = bind_error(exc, host, port)
        log(server_error_line(error))
        # The traceback's SGLang frame (the frames of asyncio and aiohttp under it are left
        # out), then the error.
        print("Traceback (most recent call last):\n"
              f'  File "{BIND_FRAME[0]}", line {BIND_FRAME[1]}, in _run_server\n'
              f"    {BIND_FRAME[2]}\n"
              f"OSError: {error}", flush=True)
        return None
    httpd.daemon_threads = True
    server = BootstrapServer(httpd)
    log(started_line(host, port))
    return server


def bind_error(exc: OSError, host: str, port: int) -> OSError:
    """The error aiohttp's site.start() raises for a port it cannot bind: asyncio's
    create_server words it (base_events.py)."""
    return OSError(exc.errno, f"error while attempting to bind on address {(host, port)!r}: "
                              f"{(exc.strerror or '').lower()}")


def server_error_line(error: BaseException) -> str:
    """_run_server: logger.error(f"Server error: {str(e)}", exc_info=True)."""
    return f"Server error: {str(error)}"


def started_line(host: str, port: int) -> str:
    return f"CommonKVBootstrapServer started successfully on {host}:{port}"
