"""The ranks of a multi-node server meet before they load, as SGLang 0.5.23's do.

Every scheduler calls distributed/bootstrap.py init_parallel_runtime ("Init parallel
begin."), which goes through parallel_state.init_distributed_environment into
torch.distributed.init_process_group(init_method="tcp://<--dist-init-addr>"). World rank 0
hosts torch's TCPStore at that address and waits until every rank of the world has joined
(TCPStore::waitForWorkers); the other ranks connect to it, retrying while nothing listens. The
wait ends at the store's timeout: --dist-timeout, or torch's default for NCCL process groups
(10 minutes; SGLang leaves dist_timeout unset). Then world rank 0 raises DistStoreError
("Timed out after 601 seconds waiting for clients. 8/16 clients joined.") and a rank that
never reached the store raises DistNetworkError ("The client socket has timed out after
600000ms while trying to connect to (host, port)."): each one's scheduler dies with it. A rank
that joined a store whose host then went away waits on (torch's gloo groups wait two hours).

Here the store is a small TCP server in world rank 0's scheduler, bound to the address
--dist-init-addr names (torch binds every interface; the simulator stays on the address it
was given). A joining rank sends `join <world rank>`; the store answers every rank `go` once
all have joined. The timeout runs as configured (the simulator's time factor compresses
work, never SGLang's or torch's timeouts).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from sglang_fleet.sim.engine import failures
from sglang_fleet.sim.frontend.control import serve_connections

DEFAULT_STORE_TIMEOUT_S = 600  # torch distributed_c10d default_pg_nccl_timeout
RETRY_S = 0.5  # between connection attempts while nothing listens


def world_rank(tp: int, pp_rank: int, tp_rank: int) -> int:
    """bootstrap.py _init_parallel_groups: rank = tp_size * pp_rank + tp_rank."""
    return tp * pp_rank + tp_rank


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


class Store:
    """torch's TCPStore on world rank 0: counts the ranks that joined (itself included)."""

    def __init__(self, host: str, port: int, world: int):
        self.world = world
        self.joined = {0}
        self.clients: list[socket.socket] = []
        self.lock = threading.Lock()
        self.complete = threading.Event()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.server.bind((host, port))
        except OSError as exc:
            raise failures.sglang_error(
                "DistNetworkError", failures.RENDEZVOUS_FRAMES,
                failures.store_listen_failed(port, exc.errno or 0)) from None
        self.server.listen(512)
        serve_connections(self.server, self._joined, "tcpstore")

    def _joined(self, client: socket.socket) -> None:
        with client.makefile("r") as lines:
            line = lines.readline().split()
            if len(line) != 2 or line[0] != "join":
                client.close()
                return
            with self.lock:
                self.joined.add(int(line[1]))
                self.clients.append(client)
                if len(self.joined) >= self.world:
                    for peer in self.clients:
                        with contextlib.suppress(OSError):
                            peer.sendall(b"go\n")
                    self.complete.set()
            # The connection stays open for the life of both processes, as torch's does.
            for _ in lines:
                pass

    def wait_for_workers(self, timeout_s: float) -> None:
        """TCPStore::waitForWorkers: poll until all joined; past the timeout (whole seconds
        elapsed > timeout) raise DistStoreError with the count."""
        start = time.monotonic()
        while not self.complete.wait(0.01):
            elapsed = int(time.monotonic() - start)
            if elapsed > timeout_s:
                with self.lock:
                    joined = len(self.joined)
                raise failures.sglang_error(
                    "DistStoreError", failures.RENDEZVOUS_FRAMES,
                    failures.store_wait_timeout(elapsed, joined, self.world))


def join(host: str, port: int, rank: int, timeout_s: float) -> socket.socket:
    """A rank other than 0: connect (retrying while nothing listens), join, and wait for the
    whole world. Returns the open connection (kept for the life of the process)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=RETRY_S)
            break
        except OSError:
            if time.monotonic() >= deadline:
                message = failures.client_connect_timeout(int(timeout_s * 1000), host, port)
                failures.write_socket_timeout(message)
                raise failures.sglang_error("DistNetworkError", failures.RENDEZVOUS_FRAMES,
                                            message) from None
            time.sleep(RETRY_S)
    sock.settimeout(None)
    sock.sendall(f"join {rank}\n".encode())
    if _line(sock) != "go":
        # The store's host went away before the world was complete: torch's groups wait on.
        threading.Event().wait()
    return sock


def _line(sock: socket.socket) -> str:
    """One line, read a byte at a time: whatever the store sends after it (a seed's weights
    down the same connection) stays in the socket for its reader."""
    data = b""
    while not data.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            break
        data += byte
    return data.decode().strip()


def rendezvous(addr: str, world: int, rank: int, timeout_s: float | None) -> object:
    """Meet the rest of the world at `addr`; what is returned is held open for the life of
    the rank (the store, or the rank's connection to it)."""
    host, port = split_addr(addr)
    timeout = float(timeout_s or DEFAULT_STORE_TIMEOUT_S)
    if rank == 0:
        store = Store(host, port, world)
        store.wait_for_workers(timeout)
        return store
    return join(host, port, rank, timeout)
