"""A local server shaped like the Hugging Face Hub's file endpoints, for tests where the Hub
itself cannot be reached: one repository at one commit, served from a folder. It answers what
huggingface_hub asks for a revision (the repository's info, its file tree with each LFS file's
SHA-256, and each file under resolve/) and a RevisionNotFound error for any other revision. It
is not the Hub: docs/weights.md says what was not tested against the Hub itself."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt")


class FakeHub:
    def __init__(self, repo: str, commit: str, folder: Path):
        self.repo, self.commit, self.folder = repo, commit, folder
        self.files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                            if p.is_file())
        self.sha256 = {f: hashlib.sha256((folder / f).read_bytes()).hexdigest()
                       for f in self.files}
        self.lie_about: dict[str, str] = {}  # path -> a SHA-256 the tree states instead

    def entry(self, path: str) -> dict:
        size = os.path.getsize(self.folder / path)
        out = {"type": "file", "path": path, "size": size,
               "oid": hashlib.sha1(path.encode()).hexdigest()}
        if path.endswith(LFS_SUFFIXES):
            out["lfs"] = {"oid": self.lie_about.get(path, self.sha256[path]), "size": size,
                          "pointerSize": 134}
        return out


class HubHandler(BaseHTTPRequestHandler):
    """The Hub's endpoints huggingface_hub calls for one revision."""

    hub: FakeHub

    def log_message(self, fmt, *args):
        pass

    def do_HEAD(self):
        self.route(head=True)

    def do_GET(self):
        self.route(head=False)

    def route(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        api = f"/api/models/{self.hub.repo}/"
        if path.startswith(api):
            kind, _, rest = path[len(api):].partition("/")
            revision = rest.split("/", 1)[0]
            if revision != self.hub.commit:
                return self.not_found(revision)
            if kind == "tree":
                return self.json([self.hub.entry(f) for f in self.hub.files], head)
            if kind == "revision":
                hub = self.hub
                return self.json({"id": hub.repo, "modelId": hub.repo, "sha": hub.commit,
                                  "siblings": [{"rfilename": f} for f in hub.files]}, head)
        prefix = f"/{self.hub.repo}/resolve/"
        if path.startswith(prefix):
            revision, _, name = path[len(prefix):].partition("/")
            if revision != self.hub.commit:
                return self.not_found(revision)
            if name in self.hub.files:
                return self.file(name, head)
        self.send_response(404)
        self.send_header("X-Error-Code", "EntryNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def not_found(self, revision: str) -> None:
        body = json.dumps({"error": f"Invalid rev id: {revision}"}).encode()
        self.send_response(404)
        self.send_header("X-Error-Code", "RevisionNotFound")
        self.send_header("X-Error-Message", f"Invalid rev id: {revision}")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def json(self, value, head: bool) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def file(self, name: str, head: bool) -> None:
        data = (self.hub.folder / name).read_bytes()
        entry = self.hub.entry(name)
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        self.send_response(200)
        self.send_header("X-Repo-Commit", self.hub.commit)
        self.send_header("ETag", f'"{etag}"')
        if "lfs" in entry:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)


@contextmanager
def serve_hub(hub: FakeHub) -> Iterator[str]:
    """The fake Hub on a loopback port for the block: its endpoint URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 type("Hub", (HubHandler,), {"hub": hub}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
