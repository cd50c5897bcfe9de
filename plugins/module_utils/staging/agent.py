# -*- coding: utf-8 -*-
# The staging agent: one process per node and revision (and one at the origin), standard
# library only, started by the sglang_stage module and gone when its work is done. It serves the
# pieces it holds to the nodes that lack them and fetches the pieces it lacks from its sources in
# order (its upstream peers, the origin last), verifying each piece's SHA-256 as it arrives.
# Pieces are written into a staging folder and recorded in a journal after their bytes: a kill
# loses at most the piece in flight. The folder is published (renamed into place) only when
# every piece is verified.
#
#   python3 agent.py CONFIG.json
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import hashlib
import http.client
import json
import os
import signal
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, urlsplit

try:
    from . import manifest as mf
except ImportError:  # run as a script beside its copy of the manifest module
    import manifest as mf

CHUNK = 64 * 1024
FRAME = struct.Struct(">QQ")  # a streamed piece: its index and length, then its bytes
STATUS_EVERY_S = 0.5
RATE_WINDOW_S = 5.0


class TokenBucket:
    """A byte-rate cap: consume(n) returns once n bytes fit in the rate (0: no cap)."""

    def __init__(self, rate, burst=CHUNK):
        self.rate = float(rate or 0)
        self.burst = float(burst)
        self.tokens = self.burst
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def consume(self, n):
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate) - n
            self.last = now
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


class PieceStore:
    """The pieces of one revision in a folder, with a journal of the verified ones. A seed's
    store is the source folder itself, read-only, every piece held."""

    def __init__(self, manifest, folder, journal=None):
        self.manifest = manifest
        self.pieces = mf.pieces(manifest)
        self.folder = folder
        self.journal = journal
        self.cond = threading.Condition()
        writable = journal is not None
        self.fds = [self._open(f, writable) for f in manifest["files"]]
        if writable:
            self.have = self._read_journal()
            self.jfd = os.open(journal, os.O_RDWR | os.O_CREAT, 0o600)
            os.ftruncate(self.jfd, len(self.pieces))
        else:
            self.have = bytearray(b"\x01" * len(self.pieces))
        self.count = sum(self.have)

    def _open(self, f, writable):
        path = os.path.join(self.folder, f["path"])
        if not writable:
            return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        if os.fstat(fd).st_size != f["size"]:
            os.ftruncate(fd, f["size"])
        return fd

    def _read_journal(self):
        try:
            with open(self.journal, "rb") as j:
                data = bytearray(j.read())
        except OSError:
            data = bytearray()
        if len(data) != len(self.pieces):
            return bytearray(len(self.pieces))
        return bytearray(1 if b else 0 for b in data)

    def read(self, index):
        fidx, offset, length, _ = self.pieces[index]
        return os.pread(self.fds[fidx], length, offset)

    def write(self, index, data):
        fidx, offset, _, _ = self.pieces[index]
        os.pwrite(self.fds[fidx], data, offset)
        # The journal after the bytes: a kill between the two loses only this piece.
        os.pwrite(self.jfd, b"\x01", index)
        with self.cond:
            if not self.have[index]:
                self.have[index] = 1
                self.count += 1
            self.cond.notify_all()

    def drop(self, index):
        with self.cond:
            if self.have[index]:
                self.have[index] = 0
                self.count -= 1
        if self.journal is not None:
            os.pwrite(self.jfd, b"\x00", index)

    def verified(self, index, data):
        return hashlib.sha256(data).hexdigest() == self.pieces[index][3]

    def wait_for(self, index, timeout):
        with self.cond:
            return self.cond.wait_for(lambda: self.have[index], timeout)

    def complete(self):
        return self.count == len(self.pieces)

    def bytes_held(self):
        return sum(p[2] for i, p in enumerate(self.pieces) if self.have[i])

    def files_held(self):
        done = [True] * len(self.fds)
        for i, p in enumerate(self.pieces):
            if not self.have[i]:
                done[p[0]] = False
        return sum(done)

    def missing_files(self):
        held = self.have
        lacking = sorted({p[0] for i, p in enumerate(self.pieces) if not held[i]})
        return [self.manifest["files"][i]["path"] for i in lacking]

    def sync(self):
        for fd in self.fds:
            os.fsync(fd)
        if self.journal is not None:
            os.fsync(self.jfd)


class Source:
    """One place to fetch pieces from: a peer's agent or the origin's (piece URLs), or a plain
    HTTP(S) server holding the revision's files ('files+' before its URL: byte ranges)."""

    def __init__(self, url, bind, timeout):
        self.files = url.startswith("files+")
        url = url[len("files+"):] if self.files else url
        parts = urlsplit(url)
        self.url = url
        self.https = parts.scheme == "https"
        self.base = parts.path.rstrip("/")
        self.host, self.port = parts.hostname, parts.port or (443 if self.https else 80)
        self.bind = bind
        self.timeout = timeout
        self.conn = None
        self.have = -1
        self.bad_since = None  # since when it has been unreachable or not progressing

    def request(self, method, path, headers=None):
        if self.conn is None:
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.conn = kind(self.host, self.port, timeout=self.timeout,
                             source_address=(self.bind, 0))
        try:
            self.conn.request(method, path, headers=headers or {})
            return self.conn.getresponse()
        except (OSError, http.client.HTTPException):
            self.close()
            raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def mark_bad(self, now):
        if self.bad_since is None:
            self.bad_since = now

    def skipped(self, now, stall_s):
        return self.bad_since is not None and now - self.bad_since >= stall_s


class Fetcher:
    """Fetches the missing pieces in order from the first source that gives them: a peer that
    is reachable and progressing is waited on (a pipelined chain); one unreachable or flat for
    stall_s is passed over for the next, the origin last."""

    WAIT, NONE = "wait", "none"

    def __init__(self, agent):
        self.agent = agent
        cfg = agent.cfg
        self.wait_s = float(cfg.get("wait_s", 2.0))
        self.stall_s = float(cfg.get("stall_s", 30.0))
        self.give_up_s = float(cfg.get("give_up_s", 120.0))
        self.sources = [Source(u, cfg["listen"][0], self.wait_s + 30) for u in cfg["sources"]]
        self.bucket = TokenBucket(cfg.get("rate_in", 0))

    def run(self):
        store = self.agent.store
        last_gain = time.monotonic()
        while not store.complete() and not self.agent.stopping:
            gained = False
            for index in range(len(store.pieces)):
                if store.have[index] or self.agent.stopping:
                    continue
                if self.fetch(index):
                    gained = True
                    last_gain = time.monotonic()
            if not gained and time.monotonic() - last_gain >= self.give_up_s:
                return False
            if not gained:
                time.sleep(min(1.0, self.wait_s))
        return store.complete()

    def fetch(self, index):
        while not self.agent.stopping:
            outcome = self.try_sources(index)
            if outcome == self.NONE:
                return False
            if outcome != self.WAIT:
                return True
        return False

    def try_sources(self, index):
        now = time.monotonic()
        for source in self.sources:
            if source.skipped(now, self.stall_s) and not self.reprobe(source, now):
                continue
            outcome = self.ask(source, index) if source.files else self.stream(source, index)
            if outcome in (self.WAIT, True):
                return outcome
        return self.NONE

    def reprobe(self, source, now):
        """A passed-over source is asked again once per stall window."""
        if now - source.bad_since >= 2 * self.stall_s:
            source.bad_since = now - self.stall_s
            return True
        return False

    def progress_or_skip(self, source, resp, now):
        """No piece came: WAIT while the source still gains pieces (it is behind us in time,
        not stuck), False once it has been flat or unreachable for the stall window."""
        have = int(resp.getheader("X-Have", "-1")) if resp is not None else -1
        if have > source.have:
            source.have, source.bad_since = have, None
        else:
            source.mark_bad(now)
        if source.skipped(time.monotonic(), self.stall_s):
            return False
        if resp is None:
            time.sleep(min(0.2, self.wait_s))
        return self.WAIT

    def stream(self, source, index):
        """Every piece from `index` on that the peer holds or receives within the wait, on one
        connection, each verified as it arrives: the pipelined chain's link."""
        now = time.monotonic()
        wait = 0 if source.skipped(now, self.stall_s) else self.wait_s
        store = self.agent.store
        gained = 0
        try:
            resp = source.request("GET", "%s/stream/%d?wait=%s&m=%s" % (
                source.base, index, wait, self.agent.manifest["id"]))
            if resp.status != 200:
                resp.read()
                return self.progress_or_skip(source, None, now)
            while not self.agent.stopping:
                head = resp.read(FRAME.size)
                if len(head) < FRAME.size:
                    break
                piece, length = FRAME.unpack(head)
                data = self.receive(resp, length)
                if len(data) < length or piece >= len(store.pieces):
                    break
                if store.have[piece]:
                    continue
                if not store.verified(piece, data):
                    self.corrupt_from(source, piece)
                    gained += self.repair(piece, source)
                    break
                store.write(piece, data)
                self.agent.note_fetched(len(data))
                gained += 1
        except (OSError, http.client.HTTPException, ValueError):
            resp = None
        finally:
            source.close()
        if gained:
            source.bad_since = None
            return True
        return self.progress_or_skip(source, resp, now)

    def corrupt_from(self, source, piece):
        """Name the source of a corrupt piece, and tell it so that it drops its copy."""
        self.agent.record_corrupt(piece, source.url)
        source.close()
        with contextlib.suppress(OSError, http.client.HTTPException):
            source.request("POST", "%s/corrupt/%d" % (source.base, piece)).read()
        source.close()

    def repair(self, piece, bad):
        """A corrupt piece fetched again alone, from the next sources."""
        for source in self.sources:
            if source is not bad and self.ask(source, piece, wait=0) is True:
                return 1
        return 0

    def ask(self, source, index, wait=None):
        now = time.monotonic()
        if wait is None:
            wait = 0 if source.skipped(now, self.stall_s) else self.wait_s
        try:
            resp = self.send(source, index, wait)
            if resp.status not in (200, 206):
                resp.read()
                return self.progress_or_skip(source, resp, now)
            data = self.receive(resp, int(resp.getheader("Content-Length", "-1")))
        except (OSError, http.client.HTTPException, ValueError):
            source.close()
            return self.progress_or_skip(source, None, now)
        source.bad_since = None
        store = self.agent.store
        if not store.verified(index, data):
            self.corrupt_from(source, index)
            return False
        store.write(index, data)
        self.agent.note_fetched(len(data))
        return True

    def send(self, source, index, wait):
        if not source.files:
            return source.request("GET", "%s/piece/%d?wait=%s&m=%s" % (
                source.base, index, wait, self.agent.manifest["id"]))
        fidx, offset, length, _ = self.agent.store.pieces[index]
        path = quote(self.agent.manifest["files"][fidx]["path"])
        return source.request("GET", "%s/%s" % (source.base, path), {
            "Range": "bytes=%d-%d" % (offset, offset + length - 1)})

    def receive(self, resp, length):
        parts = []
        left = length
        while left:
            block = resp.read(min(CHUNK, left) if left > 0 else CHUNK)
            if not block:
                break
            self.bucket.consume(len(block))
            parts.append(block)
            left -= len(block)
        return b"".join(parts)


def parse_request(path, query, count, manifest_id=None):
    """('piece' or 'stream', index, wait) of /piece/N?wait=S&m=ID or /stream/N?wait=S&m=ID;
    kind None for anything else. A request naming another manifest (a peer or an origin left
    over from another revision on this port) is refused: its pieces would all fail to verify."""
    parts = path.strip("/").split("/")
    args = parse_qs(query)
    if (len(parts) != 2 or parts[0] not in ("piece", "stream") or not parts[1].isdigit()
            or int(parts[1]) >= count
            or (manifest_id and args.get("m", [manifest_id])[0] != manifest_id)):
        return None, 0, 0.0
    wait = 0.0
    try:
        wait = max(0.0, min(30.0, float(args.get("wait", ["0"])[0] or 0)))
    except ValueError:
        wait = 0.0
    return parts[0], int(parts[1]), wait


class PieceHandler(BaseHTTPRequestHandler):
    """A node's pieces over HTTP: /piece/N, /stream/N, /status, POST /corrupt/N."""

    protocol_version = "HTTP/1.1"
    agent = None  # set on a subclass per agent

    def log_message(self, fmt, *args):  # the status file says what happened
        pass

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == "/status":
            return self.reply(200, json.dumps(self.agent.status()).encode())
        store = self.agent.store
        kind, index, wait = parse_request(path, query, len(store.pieces),
                                          self.agent.manifest["id"])
        if kind is None:
            return self.reply(404, b"")
        if kind == "stream":
            return self.stream(index, wait)
        if not store.have[index] and not store.wait_for(index, wait):
            return self.reply(404, b"")
        data = store.read(index)
        self.reply(200, data, self.agent.out_bucket)
        self.agent.note_served(len(data))

    def stream(self, first, wait):
        """Pieces from `first` on, each as soon as it is held, until one does not come
        within the wait; then the connection closes."""
        store = self.agent.store
        self.send_response(200)
        self.send_header("X-Have", str(store.count))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for index in range(first, len(store.pieces)):
                if not store.have[index] and not store.wait_for(index, wait):
                    return
                data = store.read(index)
                self.wfile.write(FRAME.pack(index, len(data)))
                self.send_bytes(data, self.agent.out_bucket)
                self.agent.note_served(len(data))
        except OSError:
            return

    def send_bytes(self, body, bucket):
        for start in range(0, len(body), CHUNK):
            block = body[start:start + CHUNK]
            if bucket is not None:
                bucket.consume(len(block))
            self.wfile.write(block)

    def do_POST(self):
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "corrupt" and parts[1].isdigit():
            self.agent.check_reported(int(parts[1]))
        self.reply(204, b"")

    def reply(self, code, body, bucket=None):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Have", str(self.agent.store.count))
        self.end_headers()
        self.send_bytes(body, bucket)


def make_handler(agent):
    return type("AgentPieceHandler", (PieceHandler,), {"agent": agent})


class Agent:
    def __init__(self, cfg):
        self.cfg = cfg
        self.seed = cfg.get("mode") == "seed"
        self.manifest = mf.load(cfg["manifest"])
        self.stopping = False
        self.lock = threading.Lock()
        self.status_lock = threading.Lock()
        self.state = "serving" if self.seed else "fetching"
        self.error = ""
        self.corrupt = []
        self.fetched = 0
        self.served = 0
        self.last_progress = time.time()
        self.last_served = time.monotonic()
        self.samples = []  # (time, bytes held) for the rate
        if self.seed:
            self.store = PieceStore(self.manifest, cfg["folder"])
        else:
            self.store = PieceStore(self.manifest, cfg["files"],
                                    journal=os.path.join(cfg["staging"], "journal"))
        self.at_start = self.store.count
        self.out_bucket = TokenBucket(cfg.get("rate_out", 0))

    # ---- what happened -------------------------------------------------------------

    def note_fetched(self, n):
        with self.lock:
            self.fetched += n
            self.last_progress = time.time()

    def note_served(self, n):
        with self.lock:
            self.served += n
            self.last_served = time.monotonic()

    def record_corrupt(self, index, source):
        fidx, offset, _, _ = self.store.pieces[index]
        with self.lock:
            self.corrupt.append({"piece": index, "file": self.manifest["files"][fidx]["path"],
                                 "offset": offset, "source": source})

    def check_reported(self, index):
        """A peer found this piece corrupt from us: read it again, drop it if it is."""
        if self.store.have[index] and not self.store.verified(index, self.store.read(index)):
            self.record_corrupt(index, "this node's own copy")
            if not self.seed:
                self.store.drop(index)

    def rate(self):
        now = time.monotonic()
        held = self.store.bytes_held()
        self.samples = [s for s in self.samples if now - s[0] <= RATE_WINDOW_S] + [(now, held)]
        first = self.samples[0]
        return (held - first[1]) / (now - first[0]) if now > first[0] else 0.0

    def status(self):
        store = self.store
        with self.lock:
            return {
                "state": self.state, "error": self.error, "pid": os.getpid(),
                "manifest_id": self.manifest["id"], "revision": self.manifest["revision"],
                "pieces_have": store.count, "pieces_total": len(store.pieces),
                "pieces_at_start": self.at_start,
                "files_have": store.files_held(), "files_total": len(store.fds),
                "bytes_have": store.bytes_held(), "bytes_total": self.manifest["total_bytes"],
                "bytes_fetched": self.fetched, "bytes_served": self.served,
                "rate": self.rate(), "last_progress": self.last_progress,
                "corrupt": list(self.corrupt),
                "missing": [] if self.seed else store.missing_files(),
                "updated": time.time(),
            }

    def write_status(self):
        """Written aside and renamed into place, one writer at a time (the status loop and
        the run's own ends)."""
        path = self.cfg["status"]
        tmp = "%s.tmp" % path
        with self.status_lock:
            with open(tmp, "w") as f:
                json.dump(self.status(), f)
            os.rename(tmp, path)

    # ---- the run -------------------------------------------------------------------

    def publish(self):
        """Every piece verified: sync, store the manifest beside the copy, rename into place."""
        self.store.sync()
        target = self.cfg["publish"]
        mf.dump(self.manifest, self.cfg["manifest_dest"])
        if os.path.isdir(target):
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(os.path.join(self.cfg["staging"], "files"), target)

    def status_loop(self):
        while not self.stopping:
            self.write_status()
            time.sleep(STATUS_EVERY_S)

    def linger(self):
        """Serve the pieces held until no peer asked for one for linger_s."""
        linger_s = float(self.cfg.get("linger_s", 60))
        while not self.stopping and time.monotonic() - self.last_served < linger_s:
            time.sleep(min(0.5, linger_s))

    def run(self):
        try:
            server = ThreadingHTTPServer(tuple(self.cfg["listen"]), make_handler(self))
        except OSError as exc:
            self.state = "failed"
            self.error = "cannot serve on %s:%s: %s" % (self.cfg["listen"][0],
                                                       self.cfg["listen"][1], exc)
            self.write_status()
            return
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        threading.Thread(target=self.status_loop, daemon=True).start()
        try:
            if not self.seed:
                self.fetch_and_publish()
            self.last_served = time.monotonic()
            self.write_status()
            self.linger()
        except Exception as exc:  # the status file carries it to the controller
            self.state, self.error = "failed", "%s: %s" % (type(exc).__name__, exc)
        finally:
            self.stopping = True
            if self.state in ("fetching", "serving"):
                self.state = "stopped"
            self.write_status()
            server.shutdown()

    def fetch_and_publish(self):
        if Fetcher(self).run():
            self.publish()
            self.state = "complete"
        elif not self.stopping:
            self.state = "incomplete"
            self.error = "no source holds the missing pieces (origin and peers unreachable " \
                         "or flat)"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = json.load(f)
    agent = Agent(cfg)

    def stop(signum, frame):
        agent.stopping = True

    signal.signal(signal.SIGTERM, stop)
    agent.run()


if __name__ == "__main__":
    main()
