# -*- coding: utf-8 -*-
# The JIT kernel caches as staging moves them (docs/weights.md, "Kernel caches"). A node's live
# folder (the server's SGLANG_CACHE_DIR) is frozen into a snapshot (a published revision of
# the key, its manifest beside it) that the staging agents serve; a staged snapshot is merged
# back into a live folder without overwriting what the node compiled itself. The controller
# keeps each key's snapshots and names the newest in <key>/.latest. Standard library only.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import os
import pwd
import shutil
import stat

from . import manifest as mf
from . import node

STAGE_PHASE = "staging_kernel_cache"
HARVEST_PHASE = "harvesting_kernel_cache"
# A compiler's work in flight, never a kernel: DeepGEMM compiles into deep_gemm/tmp/<uuid> and
# renames the finished folder into deep_gemm/cache; its per-group locks are empty files.
TRANSIENT = ("deep_gemm/tmp", "deep_gemm/locks")
MERGE_PREFIX = ".kc-merge-"
LATEST = ".latest"


def _join(base, name):
    return name if base == "." else base + "/" + name


def _kept(rel):
    name = rel.rsplit("/", 1)[-1]
    return not name.startswith(MERGE_PREFIX) and "\\" not in rel and not any(
        rel == t or rel.startswith(t + "/") for t in TRANSIENT)


def walk_cache(folder):
    """Relative paths of the regular files in a live cache folder, sorted; hidden ones count
    (FlashInfer's is .cache/flashinfer), symlinks and the compilers' work in flight do not."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        rel_dir = os.path.relpath(dirpath, folder).replace(os.sep, "/")
        dirnames[:] = sorted(d for d in dirnames if _kept(_join(rel_dir, d))
                             and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            rel = _join(rel_dir, name)
            try:
                regular = stat.S_ISREG(os.lstat(os.path.join(dirpath, name)).st_mode)
            except OSError:  # written away by the compiler meanwhile
                continue
            if regular and _kept(rel):
                found.append(rel)
    return found


def make_live(live, user):
    """The live folder, owned by the server's user (who compiles into it)."""
    os.makedirs(live, mode=0o755, exist_ok=True)
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise node.StageError("the server's user %r does not exist on this node. Fix: "
                                  "create it, or set sglang_server_user" % (user,)) from None
        os.chown(live, entry.pw_uid, entry.pw_gid)


def compare(live, manifest):
    """What the live folder holds against a snapshot (None: no snapshot): the files the
    snapshot lacks (the node compiled them) and the snapshot's files the live folder lacks."""
    held = set(walk_cache(live)) if os.path.isdir(live) else set()
    wanted = set(f["path"] for f in (manifest or {}).get("files", []))
    return {"live_files": len(held), "new_files": len(held - wanted),
            "missing_files": len(wanted - held)}


def freeze(live, snapshots, key, piece_size):
    """The live folder copied into a published snapshot of the key (under `snapshots`, named
    by its content's id): copied aside, hashed, renamed into place, so that a kill leaves no
    half snapshot. (manifest, whether it was published now)."""
    node.safe_name("kernel cache key", key)
    tmp = os.path.join(snapshots, ".staging", key, "freeze")
    node.check_under(snapshots, tmp)
    shutil.rmtree(tmp, ignore_errors=True)  # a killed freeze's copy
    copied = []
    for rel in walk_cache(live):
        target = os.path.join(tmp, key, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            shutil.copy2(os.path.join(live, rel), target, follow_symlinks=False)
        except FileNotFoundError:  # removed by the compiler meanwhile
            continue
        copied.append(rel)
    if not copied:
        raise node.StageError("%s holds no kernel to harvest" % live)
    manifest = mf.build(os.path.join(tmp, key), key, "pending", piece_size, paths=copied,
                        source="kernel cache %s" % live)
    manifest["revision"] = manifest["id"]  # the id names the content, not the revision
    places = node.layout(snapshots, key, manifest["id"])
    if node.published(places, manifest):
        shutil.rmtree(tmp)
        return manifest, False
    os.makedirs(os.path.dirname(places["manifest_dest"]), exist_ok=True)
    mf.dump(manifest, places["manifest_dest"])
    os.rename(tmp, places["publish"])
    return manifest, True


def merge(live, source_dir, manifest):
    """Copy into the live folder each file of the snapshot it lacks, never over one it holds
    (the node's own compile wins). A missing folder arrives whole (built aside and renamed
    in, as DeepGEMM publishes a kernel), so that a running server never sees half a kernel;
    everything is owned as the live folder is. The paths copied."""
    owner = os.stat(live)
    missing = [mf.check_relative(f["path"]) for f in manifest["files"]
               if not os.path.lexists(os.path.join(live, f["path"]))]
    return _merge_paths(live, source_dir, missing, owner)


def _top_missing(live, rel):
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        if not os.path.lexists(os.path.join(live, *parts[:i])):
            return "/".join(parts[:i])
    return None


def _merge_paths(live, source_dir, rels, owner):
    groups = {}
    for rel in rels:
        top = _top_missing(live, rel)
        if top is not None:
            groups.setdefault(top, []).append(rel)
    copied = []
    for top, members in sorted(groups.items()):
        target = os.path.join(live, top)
        node.check_under(live, target)
        aside = os.path.join(os.path.dirname(target),
                             "%s%d-%s" % (MERGE_PREFIX, os.getpid(), os.path.basename(top)))
        for rel in members:
            dest = aside if rel == top else os.path.join(aside, rel[len(top) + 1:])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(os.path.join(source_dir, rel), dest, follow_symlinks=False)
        _own(aside, owner)
        placed = _place(aside, target, top in members)
        if placed == "placed":
            copied.extend(members)
        elif placed == "busy":  # the server made that folder meanwhile: merge inside it
            copied.extend(_merge_paths(live, source_dir, members, owner))
    return copied


def _place(aside, target, is_file):
    """Move `aside` to `target` unless something is there: 'placed', 'kept' (a file of the
    node's own is there and stays) or 'busy' (a folder with files of its own is there)."""
    try:
        if is_file:
            os.link(aside, target)  # fails on an existing file: never overwrites
            os.unlink(aside)
        else:
            os.rename(aside, target)  # fails on a folder that holds anything
        return "placed"
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    if is_file:
        os.unlink(aside)
        return "kept"
    shutil.rmtree(aside)
    return "busy"


def _own(path, owner):
    """Owned as the live folder is (the modules run as root; the server as its user)."""
    if os.geteuid() != 0:
        return
    for dirpath, _, filenames in os.walk(path) if os.path.isdir(path) else [("", [], [path])]:
        for p in ([dirpath] if dirpath else []) + [os.path.join(dirpath, f) for f in filenames]:
            os.lchown(p, owner.st_uid, owner.st_gid)


def latest(store, key):
    """The controller's newest snapshot of a key: its manifest, or None."""
    try:
        with open(os.path.join(store, node.safe_name("kernel cache key", key), LATEST)) as f:
            snapshot = f.read().strip()
        places = node.layout(store, key, snapshot)
        manifest = mf.load(places["manifest_dest"])
    except (OSError, ValueError, mf.ManifestError, node.StageError):
        return None
    return manifest if node.published(places, manifest) else None


def record_latest(store, manifest):
    """Name a snapshot published in the store the key's newest; whether that changed."""
    places = node.layout(store, manifest["model"], manifest["revision"])
    if not node.published(places, manifest):
        raise node.StageError("the snapshot %s of %s is not published in %s"
                              % (manifest["revision"], manifest["model"], store))
    current = latest(store, manifest["model"])
    if current is not None and current["id"] == manifest["id"]:
        return False
    path = os.path.join(store, manifest["model"], LATEST)
    with open(path + ".tmp", "w") as f:
        f.write(manifest["revision"] + "\n")
    os.rename(path + ".tmp", path)
    return True
