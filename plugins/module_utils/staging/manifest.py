# -*- coding: utf-8 -*-
# A model revision's manifest: every file with its size, SHA-256 and the SHA-256 of each of its
# pieces, so that a node verifies each piece as it arrives (no second full read). Pure Python,
# standard library only: the controller builds it once at the origin, the nodes read it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import posixpath
import stat

FORMAT = 1
MANIFEST_NAME = "sglang-manifest.json"  # beside the files at an HTTP(S) origin
DEFAULT_PIECE_SIZE = 16 * 1024 * 1024


class ManifestError(Exception):
    """The manifest or the files it names are not what they should be."""


def check_relative(path):
    """A file path inside the revision: relative, normalised, no '..', no hidden tricks."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path:
        raise ManifestError("file path %r in the manifest is not a relative path" % (path,))
    norm = posixpath.normpath(path)
    if norm != path or norm.startswith("..") or "/../" in "/%s/" % norm:
        raise ManifestError("file path %r in the manifest leaves the revision's folder" % path)
    return path


def piece_count(size, piece_size):
    return (int(size) + piece_size - 1) // piece_size


def hash_file(path, piece_size):
    """(size, sha256, [piece sha256]) of a file, in one read."""
    whole = hashlib.sha256()
    pieces = []
    size = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(piece_size)
            if not block:
                break
            whole.update(block)
            pieces.append(hashlib.sha256(block).hexdigest())
            size += len(block)
    return size, whole.hexdigest(), pieces


def walk_folder(folder):
    """Relative paths of the regular files under a folder, sorted; a symlink is refused."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or name == MANIFEST_NAME:
                continue
            full = os.path.join(dirpath, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode) or not stat.S_ISREG(mode):
                raise ManifestError("%s is a symlink or not a regular file: a revision's files "
                                    "must be plain files" % full)
            found.append(os.path.relpath(full, folder).replace(os.sep, "/"))
    return found


def build(folder, model, revision, piece_size=DEFAULT_PIECE_SIZE, expected=None, source="",
          paths=None):
    """The manifest of a folder (of `paths` in it, else of walk_folder's), reading each file
    once. `expected` maps a path to the SHA-256 the source states (the Hub's LFS metadata): a
    file that disagrees is an error."""
    if not os.path.isdir(folder):
        raise ManifestError("the source folder %s does not exist" % folder)
    files = []
    for rel in walk_folder(folder) if paths is None else paths:
        size, digest, pieces = hash_file(os.path.join(folder, rel), piece_size)
        want = (expected or {}).get(rel)
        if want and want != digest:
            raise ManifestError("%s: SHA-256 %s, the source states %s; nothing is published"
                                % (rel, digest, want))
        files.append({"path": rel, "size": size, "sha256": digest, "pieces": pieces})
    if not files:
        raise ManifestError("the source folder %s holds no files" % folder)
    return finish({"format": FORMAT, "model": model, "revision": revision, "source": source,
                   "piece_size": piece_size, "files": files})


def finish(manifest):
    manifest["total_bytes"] = sum(f["size"] for f in manifest["files"])
    manifest["id"] = manifest_id(manifest)
    return manifest


def manifest_id(manifest):
    """A short hash naming the manifest's content (its files, sizes and hashes)."""
    body = json.dumps([(f["path"], f["size"], f["sha256"]) for f in manifest["files"]]
                      + [manifest["piece_size"]], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def validate(manifest):
    """The manifest as read from JSON, checked; raises ManifestError naming what is wrong."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestError("not a manifest of format %d" % FORMAT)
    piece_size = manifest.get("piece_size")
    if not isinstance(piece_size, int) or piece_size <= 0:
        raise ManifestError("piece_size %r is not a positive integer" % (piece_size,))
    seen = set()
    for f in manifest.get("files") or []:
        check_relative(f.get("path"))
        if f["path"] in seen:
            raise ManifestError("%s is listed twice" % f["path"])
        seen.add(f["path"])
        if len(f.get("pieces") or []) != piece_count(f.get("size", -1), piece_size):
            raise ManifestError("%s: %s pieces listed for %s bytes" % (
                f["path"], len(f.get("pieces") or []), f.get("size")))
    if not seen:
        raise ManifestError("the manifest lists no files")
    return finish(manifest)


def pieces(manifest):
    """Every piece of the revision in order: (file index, offset, length, sha256)."""
    size = manifest["piece_size"]
    out = []
    for index, f in enumerate(manifest["files"]):
        for n, digest in enumerate(f["pieces"]):
            out.append((index, n * size, min(size, f["size"] - n * size), digest))
    return out


def verify_copy(folder, manifest):
    """Read a node's copy against the manifest: a list of problems, empty when it agrees."""
    problems = []
    for f in manifest["files"]:
        path = os.path.join(folder, f["path"])
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            problems.append("%s is missing" % f["path"])
            continue
        if stat.S_ISLNK(mode):
            problems.append("%s is a symlink" % f["path"])
            continue
        size, digest, _ = hash_file(path, manifest["piece_size"])
        if size != f["size"] or digest != f["sha256"]:
            problems.append("%s: %d bytes, SHA-256 %s; the manifest says %d bytes, %s"
                            % (f["path"], size, digest[:12], f["size"], f["sha256"][:12]))
    return problems


def load(path):
    with open(path) as f:
        return validate(json.load(f))


def dump(manifest, path):
    """Written aside and renamed into place: a reader sees the old manifest or the new."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(manifest, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def is_staged_model(model_dir):
    """A model folder that staging published (its revision's manifest beside it): the
    simulated node's stand-in model must not be written into it."""
    revision_dir = os.path.dirname(os.path.normpath(model_dir))
    return os.path.isfile(os.path.join(os.path.dirname(revision_dir), ".manifests",
                                       os.path.basename(revision_dir) + ".json"))
