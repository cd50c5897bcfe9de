"""The channel between the simulated main process and its schedulers.

SGLang's tokenizer manager talks to the schedulers over ZMQ: it sends each request to them,
and control requests (`GetInternalStateReq` for /server_info, `FlushCacheReqInput` for
/flush_cache) go through managers/communicator.py's FanOutCommunicator, which awaits the
schedulers' answers with no timeout (managers/tokenizer_control_mixin.py). Everything a
scheduler answers comes out of its one event loop, so a scheduler stuck in a forward batch (or
stopped by SIGSTOP) answers nothing: requests stop producing tokens and those endpoints hang.

Here each scheduler connects to the main process over a Unix socket once it has started and
names itself by its pid. From its event loop it then
- acknowledges each batch the main process hands it (`batch <phase> <id>` -> `ack <id>`), after
  playing that phase's fault: a scheduler that hangs or dies never acknowledges, and the
  request waits, as a request waits on a real scheduler;
- answers control requests (`ask <id> <verb>` -> `reply <id> <json>`);
- ticks every TICK_S: a replica whose scheduler stopped ticking (SIGSTOP, a loop stuck in a
  forward) is frozen, and the tokens of requests already running stop with it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import socket
import threading
import time
from typing import Any

TICK_S = 0.5
# A replica none of whose ticks came for this long is frozen (SIGSTOP, a stuck loop).
STALE_S = 1.5
ENV = "SGLANG_SIM_CONTROL"  # the socket's name, inherited by the controller and schedulers


class Link:
    """One scheduler's connection, as the main process holds it."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock = sock
        self.pid = pid
        self.last_tick = time.monotonic()
        self.write_lock = threading.Lock()
        self.closed = False

    def send(self, line: str) -> None:
        with self.write_lock, contextlib.suppress(OSError):
            self.sock.sendall(line.encode() + b"\n")


def serve_connections(server: socket.socket, handle: Any, name: str) -> None:
    """Accept on a listening socket in a thread of its own, each connection handled in a
    thread; the loop ends when the socket is closed."""
    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True, name=name).start()


class Hub:
    """The main process's end: accepts the schedulers, tracks their ticks, sends them batches
    and control requests and waits for their answers without a timeout."""

    def __init__(self) -> None:
        self.name = f"\0sglang-sim-control-{os.getpid()}-{os.urandom(4).hex()}"
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.name)
        self.server.listen(256)
        self.links: dict[int, Link] = {}
        self.lock = threading.Lock()
        self.registered = threading.Condition(self.lock)
        self.ids = itertools.count(1)
        self.waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        # FanOutCommunicator's "queueing" mode: one control request at a time.
        self.ask_lock = threading.Lock()
        self.judged: dict[tuple[int, ...], tuple[float, bool]] = {}
        serve_connections(self.server, self._serve, "control-accept")

    def environment(self) -> dict[str, str]:
        return {ENV: self.name[1:]}

    def _serve(self, sock: socket.socket) -> None:
        link = None
        with sock, sock.makefile("r") as lines:
            for line in lines:
                verb, _, rest = line.rstrip("\n").partition(" ")
                if verb == "hello":
                    link = Link(sock, int(rest))
                    with self.registered:
                        self.links[link.pid] = link
                        self.registered.notify_all()
                elif link is not None and verb == "tick":
                    link.last_tick = time.monotonic()
                elif link is not None and verb in ("ack", "reply"):
                    link.last_tick = time.monotonic()
                    ident, _, payload = rest.partition(" ")
                    self._resolve(int(ident), json.loads(payload) if payload else None)
        if link is not None:
            link.closed = True

    def _resolve(self, ident: int, value: Any) -> None:
        with self.lock:
            entry = self.waiting.get(ident)
        if entry is not None:
            entry[1].append(value)
            entry[0].set()

    def links_of(self, pids: list[int], wait: bool = False) -> list[Link]:
        """The links of these schedulers (`wait`: once each has said hello; a scheduler says
        it before it reports ready, but its hello may still be on its way)."""
        with self.registered:
            while wait and any(p not in self.links for p in pids):
                self.registered.wait()
            return [self.links[p] for p in pids if p in self.links]

    def frozen(self, pids: list[int]) -> bool:
        """Whether a scheduler of these stopped ticking (stopped, stuck or gone); judged
        again at most every TICK_S / 5 (every token of every request asks)."""
        now = time.monotonic()
        key = tuple(pids)
        judged = self.judged.get(key)
        if judged is not None and now - judged[0] < TICK_S / 5:
            return judged[1]
        links = self.links_of(pids)
        value = len(links) < len(pids) or any(
            link.closed or now - link.last_tick > STALE_S for link in links)
        self.judged[key] = (now, value)
        return value

    def _call(self, links: list[Link], line: str, expect: int) -> list[Any]:
        """Send `line` (with a fresh id) to each link and wait for `expect` answers, forever."""
        ident = next(self.ids)
        event, answers = threading.Event(), []
        with self.lock:
            self.waiting[ident] = (event, answers)
        try:
            for link in links:
                link.send(line.format(id=ident))
            while len(answers) < expect:
                event.wait()
                event.clear()
            return answers
        finally:
            with self.lock:
                self.waiting.pop(ident, None)

    def forward(self, pids: list[int], phase: str, rid: str, input_ids: list[int],
                sampling: tuple[int, float]) -> None:
        """Hand a request's batch (its ids and sampling: max_new_tokens, temperature) to every
        scheduler of a replica; returns once each has taken it."""
        links = self.links_of(pids, wait=True)
        max_new_tokens, temperature = sampling
        self._call(links, f"batch {phase} {{id}} {rid} {max_new_tokens} {temperature!r} "
                          f"{json.dumps(input_ids)}", len(links))

    def ask(self, pids: list[int], verb: str, every: bool = False) -> Any:
        """A control request to a replica's first scheduler (`every`: to each of `pids`, a
        list of answers); its answer, however long that takes (tokenizer_control_mixin: no
        timeout)."""
        wanted = pids if every else pids[:1]
        with self.ask_lock:
            links = self.links_of(wanted, wait=True)
            answers = self._call(links, f"ask {{id}} {verb}", len(links))
        return answers if every else answers[0]

    def tell(self, pids: list[int], line: str) -> None:
        for link in self.links_of(pids):
            link.send(line)


class Channel:
    """A scheduler's end: its messages in order, in a queue its event loop reads."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect("\0" + os.environ[ENV])
        self.write_lock = threading.Lock()
        self.inbox: queue.Queue[str] = queue.Queue()
        self.unstick = threading.Event()
        self.send(f"hello {os.getpid()}")
        self.last_tick = 0.0
        threading.Thread(target=self._read, daemon=True, name="control-read").start()

    def send(self, line: str) -> None:
        with self.write_lock, contextlib.suppress(OSError):
            self.sock.sendall(line.encode() + b"\n")

    def _read(self) -> None:
        with self.sock.makefile("r") as lines:
            for line in lines:
                line = line.rstrip("\n")
                if line == "unstick":  # the stuck loop cannot read it: said beside it
                    self.unstick.set()
                else:
                    self.inbox.put(line)

    def next(self) -> str | None:
        """The next message, or None after TICK_S without one."""
        try:
            return self.inbox.get(timeout=TICK_S)
        except queue.Empty:
            return None

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.last_tick >= TICK_S / 2:
            self.last_tick = now
            self.send("tick")

    def ack(self, ident: str) -> None:
        self.send(f"ack {ident}")

    def reply(self, ident: str, value: Any) -> None:
        self.send(f"reply {ident} {json.dumps(value)}")
