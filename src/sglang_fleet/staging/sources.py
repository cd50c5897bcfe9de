"""A model source as the inventory gives it (sglang_stage_source), resolved on the controller into
the revision's manifest and its origin:

- {folder: /shared/ckpt/X, revision: r1[, name: X]}: a folder on a shared file system; the
  manifest is computed once here (one read, kept in the state folder until a file changes) and
  the origin is an agent serving that folder;
- {url: https://host/ckpt/X/, revision: r1[, name: X]}: a plain HTTP(S) server; the manifest is
  the one published beside the files (sglang-manifest.json, made once where the files are with
  `sglang-fleet weights manifest FOLDER`), and the first node reads byte ranges from it;
- {hf_repo: org/X, revision: <commit SHA>[, endpoint: URL]}: a Hugging Face Hub repository at a
  commit, through huggingface_hub: the Hub's LFS SHA-256 of each file checked against the copy
  downloaded once here, which an agent then serves.

The node path follows from the source: <deployment root>/weights/<name>/<revision>/<name>."""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.node.staging import node

COMMIT = re.compile(r"^[0-9a-f]{40}$")
KINDS = ("folder", "url", "hf_repo")


class SourceError(ValueError):
    pass


def _kind(source: Any) -> str:
    if not isinstance(source, dict):
        raise SourceError(f"sglang_stage_source={source!r} is not a mapping. Fix: give one of "
                          "{folder: PATH, revision: R}, {url: URL, revision: R} or "
                          "{hf_repo: ORG/NAME, revision: COMMIT}")
    kinds = [k for k in KINDS if source.get(k)]
    if len(kinds) != 1:
        raise SourceError(f"sglang_stage_source={source!r} names {kinds or 'no source'}. Fix: "
                          "give exactly one of folder, url or hf_repo")
    return kinds[0]


def names(source: Any) -> tuple[str, str]:
    """(model folder name, revision folder name) of a source, without reading it."""
    kind = _kind(source)
    revision = str(source.get("revision") or "")
    if kind == "hf_repo":
        if not COMMIT.match(revision):
            raise SourceError(
                f"sglang_stage_source.revision={revision!r} for {source['hf_repo']} is not a "
                "commit SHA (40 hex digits). Fix: pin the commit (a branch or tag moves, and one "
                "folder holds one revision's files): the Hub shows it in the repository's "
                "history")
        default = str(source["hf_repo"]).rstrip("/").rsplit("/", 1)[-1]
    else:
        if not revision:
            raise SourceError(f"sglang_stage_source={source!r} has no revision. Fix: name the "
                              "revision (one folder per revision on each node)")
        default = os.path.basename(str(source[kind]).rstrip("/"))
    name = str(source.get("name") or default)
    try:
        return node.safe_name("sglang_stage_source.name", name), \
            node.safe_name("sglang_stage_source.revision", revision)
    except node.StageError as exc:
        raise SourceError(f"{exc}. Fix: set sglang_stage_source.name or .revision to one") \
            from None


def staged_path(source: Any, server_root: str) -> str:
    """The node path a source stages to: <server root>/weights/<name>/<revision>/<name> (the
    revision's folder, published at once, holds the model's folder under its own name)."""
    name, revision = names(source)
    return os.path.join(str(server_root), "weights", name, revision, name)


def resolve(source: Any, piece_size: int, cache: Path) -> dict[str, Any]:
    """{'manifest': ..., 'origin': {'folder': path} or {'url': 'files+URL'}}."""
    kind = _kind(source)
    name, revision = names(source)
    if kind == "folder":
        folder = str(source["folder"])
        return {"manifest": folder_manifest(folder, name, revision, piece_size, cache),
                "origin": {"folder": folder}}
    if kind == "url":
        return {"manifest": url_manifest(str(source["url"]), name, revision),
                "origin": {"url": "files+" + str(source["url"]).rstrip("/")}}
    folder, manifest = hub_revision(source, name, revision, piece_size, cache)
    return {"manifest": manifest, "origin": {"folder": folder}}


def folder_manifest(folder: str, name: str, revision: str, piece_size: int,
                    cache: Path) -> dict[str, Any]:
    """The folder's manifest, computed once and kept until a file's size or time changes."""
    try:
        listing = [(rel, os.stat(os.path.join(folder, rel)).st_size,
                    os.stat(os.path.join(folder, rel)).st_mtime_ns)
                   for rel in mf.walk_folder(folder)]
    except (OSError, mf.ManifestError) as exc:
        raise SourceError(f"sglang_stage_source.folder={folder}: {exc}") from None
    key = hashlib.sha256(json.dumps([folder, name, revision, piece_size, listing])
                         .encode()).hexdigest()[:24]
    kept = cache / f"{key}.json"
    if kept.is_file():
        return mf.load(str(kept))
    try:
        manifest = mf.build(folder, name, revision, piece_size, source=f"folder {folder}")
    except (OSError, mf.ManifestError) as exc:
        raise SourceError(f"sglang_stage_source.folder={folder}: {exc}") from None
    cache.mkdir(parents=True, exist_ok=True)
    mf.dump(manifest, str(kept))
    return manifest


def url_manifest(url: str, name: str, revision: str) -> dict[str, Any]:
    where = url.rstrip("/") + "/" + mf.MANIFEST_NAME
    try:
        with urllib.request.urlopen(where, timeout=30) as r:
            manifest = mf.validate(json.load(r))
    except urllib.error.HTTPError as exc:
        raise SourceError(
            f"sglang_stage_source.url={url}: {where} answered {exc.code}. Fix: publish the "
            f"manifest beside the files (sglang-fleet weights manifest FOLDER > "
            f"{mf.MANIFEST_NAME} where the files are)") from None
    except (OSError, ValueError, mf.ManifestError) as exc:
        raise SourceError(f"sglang_stage_source.url={url}: {where}: {exc}") from None
    manifest.update(model=name, revision=revision, source=f"url {url}")
    return mf.finish(manifest)


def hub_revision(source: dict[str, Any], name: str, revision: str, piece_size: int,
                 cache: Path) -> tuple[str, dict[str, Any]]:
    """The Hub revision downloaded once into the cache, checked against the Hub's LFS SHA-256."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # the run's output is the gate's lines, not download bars

    repo = str(source["hf_repo"])
    endpoint = source.get("endpoint") or None
    try:
        api = HfApi(endpoint=endpoint)
        tree = list(api.list_repo_tree(repo, recursive=True, revision=revision))
        expected = {f.path: f.lfs.sha256 for f in tree if getattr(f, "lfs", None)}
        folder = cache / "hub" / str(source["hf_repo"]).replace("/", "--") / revision
        snapshot_download(repo, revision=revision, local_dir=str(folder), endpoint=endpoint)
    except RevisionNotFoundError:
        raise SourceError(f"sglang_stage_source.revision={revision}: no such revision in "
                          f"{repo}. Fix: give a commit SHA from the repository's history; "
                          "nothing is published") from None
    except RepositoryNotFoundError:
        raise SourceError(f"sglang_stage_source.hf_repo={repo}: no such repository (or no "
                          "access with this token); nothing is published") from None
    except HfHubHTTPError as exc:
        raise SourceError(f"sglang_stage_source: {repo} at {revision}: "
                          f"{str(exc).splitlines()[0]}; nothing is published") from None
    except OSError as exc:
        raise SourceError(f"sglang_stage_source: {repo} at {revision}: {exc}") from None
    try:
        manifest = mf.build(str(folder), name, revision, piece_size, expected=expected,
                            source=f"hf {repo}@{revision}")
    except mf.ManifestError as exc:
        raise SourceError(f"sglang_stage_source: {repo} at {revision}: {exc}") from None
    return str(folder), manifest
