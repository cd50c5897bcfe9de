"""Model sources resolved on the controller: a folder (manifest computed once and kept), an
HTTP(S) URL (the manifest published beside the files), and a Hugging Face repository at a
commit through huggingface_hub. The Hub cannot be reached here: the Hub path runs against a
local server that serves a repository the way the Hub's file endpoints do (testfleet.hub)."""

import json
import os
from functools import partial
from http.server import SimpleHTTPRequestHandler

import pytest

from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.staging import sources
from sglang_fleet.staging.synthetic import make_checkpoint
from sglang_fleet.testfleet.hub import FakeHub, serve_hub
from sglang_fleet.testfleet.local import loopback_http_server

PIECE = 64 * 1024
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def checkpoint(tmp_path):
    return make_checkpoint(tmp_path / "Tiny-1B", 300_000, shards=2, layers=2)


def test_a_folder_source_stages_to_one_folder_per_revision(checkpoint, tmp_path):
    source = {"folder": str(checkpoint), "revision": "r1"}
    assert sources.staged_path(source, "/opt/d") == "/opt/d/weights/Tiny-1B/r1/Tiny-1B"
    first = sources.resolve(source, PIECE, tmp_path / "cache")
    assert first["origin"] == {"folder": str(checkpoint)}
    assert first["manifest"]["revision"] == "r1" and first["manifest"]["model"] == "Tiny-1B"
    kept = list((tmp_path / "cache").glob("*.json"))
    assert len(kept) == 1
    assert sources.resolve(source, PIECE, tmp_path / "cache")["manifest"] == first["manifest"]
    (checkpoint / "config.json").write_text("{}")  # a changed file: computed again
    again = sources.resolve(source, PIECE, tmp_path / "cache")["manifest"]
    assert again["id"] != first["manifest"]["id"]


@pytest.mark.parametrize("source, words", [
    ({"revision": "r1"}, "names no source"),
    ({"folder": "/x", "url": "http://y", "revision": "r1"}, "exactly one of"),
    ({"folder": "/x"}, "has no revision"),
    ({"folder": "/x", "revision": "../r1"}, "not a plain folder name"),
    ({"hf_repo": "org/x", "revision": "main"}, "is not a commit SHA"),
])
def test_a_bad_source_is_refused_naming_the_variable_and_the_fix(source, words):
    with pytest.raises(sources.SourceError, match=words) as err:
        sources.staged_path(source, "/opt/d")
    assert "sglang_stage_source" in str(err.value) and "Fix" in str(err.value)


def test_a_url_source_reads_the_manifest_published_beside_the_files(checkpoint, tmp_path):
    manifest = mf.build(str(checkpoint), "x", "y", PIECE)
    handler = partial(SimpleHTTPRequestHandler, directory=str(checkpoint.parent))
    with loopback_http_server(handler) as url:
        with pytest.raises(sources.SourceError, match="answered 404. Fix: publish the manifest"):
            sources.resolve({"url": f"{url}/Tiny-1B", "revision": "r2"}, PIECE, tmp_path)
        (checkpoint / mf.MANIFEST_NAME).write_text(json.dumps(manifest))
        got = sources.resolve({"url": f"{url}/Tiny-1B/", "revision": "r2"}, PIECE, tmp_path)
    assert got["origin"] == {"url": f"files+{url}/Tiny-1B"}
    assert got["manifest"]["revision"] == "r2" and got["manifest"]["id"] == manifest["id"]


def test_a_hub_revision_is_checked_against_the_hubs_lfs_hashes(checkpoint, tmp_path,
                                                               monkeypatch):
    """Against a local server shaped like the Hub's file endpoints, not the Hub itself."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    hub = FakeHub("org/Tiny-1B", COMMIT, checkpoint)
    with serve_hub(hub) as endpoint:
        source = {"hf_repo": "org/Tiny-1B", "revision": COMMIT, "endpoint": endpoint}
        got = sources.resolve(source, PIECE, tmp_path / "cache")
        files = {f["path"]: f["sha256"] for f in got["manifest"]["files"]}
        assert files == hub.sha256
        assert sources.staged_path(source, "/d") == f"/d/weights/Tiny-1B/{COMMIT}/Tiny-1B"
        with pytest.raises(sources.SourceError, match="no such revision in org/Tiny-1B"):
            sources.resolve({**source, "revision": "f" * 40}, PIECE, tmp_path / "c2")
        hub.lie_about["model-00002-of-00002.safetensors"] = "0" * 64
        with pytest.raises(sources.SourceError, match="the source states 0000.*nothing is "
                                                      "published"):
            sources.resolve(source, PIECE, tmp_path / "c3")
    assert not os.path.exists(tmp_path / "c2" / "hub" / "org--Tiny-1B" / ("f" * 40) / "config.json")
