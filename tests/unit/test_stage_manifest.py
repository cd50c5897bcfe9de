"""Staging's pure parts: the manifest, the node's paths, the disk check, the gate's verdict on
a node's staging, pruning. Small folders in tmp_path; no process is started."""

import json
import os
import time

import pytest

from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.node.staging import node
from sglang_fleet.staging.chain import sources_by_node
from sglang_fleet.staging.synthetic import make_checkpoint

PIECE = 64 * 1024


@pytest.fixture
def checkpoint(tmp_path):
    return make_checkpoint(tmp_path / "ckpt", 600_000, shards=2, layers=2)


def test_manifest_lists_every_file_with_size_hash_and_pieces(checkpoint):
    m = mf.build(str(checkpoint), "tiny", "r1", piece_size=PIECE)
    names = [f["path"] for f in m["files"]]
    assert names == sorted(names)
    assert "config.json" in names and "model.safetensors.index.json" in names
    shard = next(f for f in m["files"] if f["path"].endswith(".safetensors"))
    assert shard["size"] == os.path.getsize(checkpoint / shard["path"])
    assert len(shard["pieces"]) == -(-shard["size"] // PIECE)
    assert m["total_bytes"] == sum(os.path.getsize(checkpoint / n) for n in names)
    assert mf.validate(json.loads(json.dumps(m)))["id"] == m["id"]


def test_a_file_that_disagrees_with_the_source_is_refused(checkpoint):
    with pytest.raises(mf.ManifestError, match="config.json: SHA-256 .* the source states"):
        mf.build(str(checkpoint), "tiny", "r1", PIECE, expected={"config.json": "0" * 64})


def test_a_missing_source_folder_and_a_symlink_in_it_are_refused(tmp_path, checkpoint):
    with pytest.raises(mf.ManifestError, match="does not exist"):
        mf.build(str(tmp_path / "nowhere"), "tiny", "r1")
    os.symlink("/etc/hostname", checkpoint / "linked.json")
    with pytest.raises(mf.ManifestError, match="symlink"):
        mf.build(str(checkpoint), "tiny", "r1")


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../b", "a//b"])
def test_a_manifest_path_leaving_the_revision_is_refused(checkpoint, path):
    m = mf.build(str(checkpoint), "tiny", "r1", piece_size=PIECE)
    m["files"][0]["path"] = path
    with pytest.raises(mf.ManifestError, match="relative path|leaves"):
        mf.validate(m)


def test_node_paths_stay_under_the_root_without_symlinks(tmp_path):
    root = tmp_path / "root"
    places = node.layout(str(root), "tiny", "r1")
    assert places["publish"] == str(root / "tiny" / "r1")
    assert places["model_dir"] == str(root / "tiny" / "r1" / "tiny")
    for bad in ("..", "a/b", "", "r1/../../x"):
        with pytest.raises(node.StageError, match="plain folder name"):
            node.layout(str(root), "tiny", bad)
    (root).mkdir()
    os.symlink(tmp_path, root / "tiny")
    with pytest.raises(node.StageError, match="is a symlink"):
        node.layout(str(root), "tiny", "r1")
    with pytest.raises(node.StageError, match="outside the deployment's root"):
        node.check_under(str(root), str(tmp_path / "elsewhere"))


def test_a_full_disk_is_refused_with_need_free_and_node(tmp_path, checkpoint):
    m = mf.build(str(checkpoint), "tiny", "r1", piece_size=PIECE)
    m["piece_size"] = 1 << 40
    m["files"][0]["size"] = 1 << 50  # a petabyte: more than any test machine has free
    for f in m["files"]:
        f["pieces"] = ["0" * 64] * mf.piece_count(f["size"], 1 << 40)
    m = mf.validate(m)
    places = node.layout(str(tmp_path / "root"), "tiny", "r1")
    with pytest.raises(node.StageError, match=r"not enough disk on gpu-7 for r1: need 1125\d+"
                                              r".* free .* under "):
        node.check_disk(places, m, "gpu-7")
    assert not os.path.exists(places["staging"])


def _status(**kw):
    base = {"state": "fetching", "files_have": 120, "files_total": 163,
            "bytes_have": 310e9, "bytes_total": 612e9, "rate": 1.2e9,
            "last_progress": time.time(), "updated": time.time(), "corrupt": [], "missing": []}
    base.update(kw)
    return base


def test_the_gate_reads_staging_as_a_phase_with_progress_and_rate():
    v = node.judge(_status(), stall_window=60)
    assert v["verdict"] == "progressing" and v["phase"] == "staging_weights"
    assert v["headline"] == "progressing: staging_weights 120/163 files, 310 GB of 612, 1.2 GB/s"
    stalled = node.judge(_status(last_progress=time.time() - 100), stall_window=60)
    assert stalled["verdict"] == "stalled" and "stall window 60 s" in stalled["message"]
    gave_up = node.judge(_status(state="incomplete", missing=["model-00002.safetensors"],
                                 error="no source holds the missing pieces"), 60)
    assert gave_up["verdict"] == "crashed"
    assert "missing 1 file(s): model-00002.safetensors" in gave_up["message"]
    assert node.judge(None, 60, published_now=True)["verdict"] == "ready"


def test_pruning_keeps_the_newest_and_never_the_one_in_use(tmp_path):
    root = tmp_path / "root"
    for age, rev in enumerate(["r4", "r3", "r2", "r1"]):
        (root / "tiny" / rev).mkdir(parents=True)
        os.utime(root / "tiny" / rev, (time.time() - age * 100,) * 2)
    removed = node.prune(str(root), "tiny", keep=2, protect={"r1"})
    assert sorted(removed) == ["r2"]
    assert sorted(os.listdir(root / "tiny")) == ["r1", "r3", "r4"]


def test_each_node_fetches_from_the_nodes_before_it_and_the_origin_last():
    chain = sources_by_node([("a", "http://a"), ("b", "http://b"), ("c", "http://c")], "http://o")
    assert chain == {"a": ["http://o"], "b": ["http://a", "http://o"],
                     "c": ["http://b", "http://a", "http://o"]}


def test_a_piece_request_naming_another_manifest_is_refused():
    # An agent left on the port by another revision must not serve its pieces to this one.
    from sglang_fleet.node.staging.agent import parse_request
    assert parse_request("/piece/3", "wait=2&m=abc", 10, "abc") == ("piece", 3, 2.0)
    assert parse_request("/stream/0", "wait=1&m=old", 10, "abc") == (None, 0, 0.0)
    assert parse_request("/piece/3", "wait=40", 10, "abc") == ("piece", 3, 30.0)
    assert parse_request("/piece/12", "m=abc", 10, "abc") == (None, 0, 0.0)
