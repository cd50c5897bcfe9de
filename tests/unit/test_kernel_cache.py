"""Kernel caches' pure parts: the key and the server's environment (the LaunchSpec), the live
folder's walk, freezing a snapshot atomically, the merge rules (a node's own file is never
overwritten; a missing folder arrives whole), the controller's newest snapshot, who fetches
and who is harvested, and the simulated DeepGEMM cache. Small folders in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_fleet.launch.kernel_cache import cache_key
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.node.staging import kernel_cache as kc
from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.node.staging import node
from sglang_fleet.sim.srt.layers.deep_gemm_wrapper import compile_utils as dg
from sglang_fleet.staging.kernel_cache import harvest_sources, stage_chains
from sglang_fleet.testfleet.local import role_defaults

KEY = "0.5.23-sm120-tp8"


def _spec(tmp_path, **overrides):
    s = role_defaults()
    s.update({"sglang_server_" + k: v for k, v in overrides.items()})
    s.setdefault("sglang_server_attention_backend", "triton")
    s["sglang_server_root"] = str(tmp_path)
    return build_launch_spec(s, "node1")


def test_the_key_is_release_architecture_and_tp():
    assert cache_key("0.5.23", "12.0", 8) == KEY
    assert cache_key("0.5.4.post3", "9.0", 16) == "0.5.4.post3-sm90-tp16"


def test_the_server_reads_its_caches_from_the_keys_live_folder(tmp_path):
    spec = _spec(tmp_path, kernel_cache=True, gpu_compute_capability="12")["spec"]
    live = f"{tmp_path}/kernel-cache/{KEY}/live"
    assert spec["kernel_cache"] == {"key": KEY, "live": live,
                                    "snapshots": f"{tmp_path}/kernel-cache/snapshots"}
    env = spec["env"]
    assert env["SGLANG_CACHE_DIR"] == live
    assert env["SGLANG_DG_CACHE_DIR"] == f"{live}/deep_gemm"  # 0.5.4.post3 needs it set
    assert env["TRITON_CACHE_DIR"] == f"{live}/triton"
    assert env["FLASHINFER_WORKSPACE_BASE"] == live


def test_off_by_default_the_release_keeps_its_own_caches(tmp_path):
    spec = _spec(tmp_path)["spec"]
    assert spec["kernel_cache"] is None
    assert not {"SGLANG_CACHE_DIR", "SGLANG_DG_CACHE_DIR"} & set(spec["env"])


def test_a_cache_variable_in_extra_env_is_refused_when_the_caches_are_staged(tmp_path):
    result = _spec(tmp_path, kernel_cache=True,
                   extra_env={"SGLANG_DG_CACHE_DIR": "/elsewhere"})
    assert not result["ok"]
    assert any("sglang_server_extra_env" in e and "SGLANG_DG_CACHE_DIR" in e
               and "sglang_server_kernel_cache" in e for e in result["errors"]), result["errors"]


def _write(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _live(tmp_path) -> Path:
    live = tmp_path / "root" / "kernel-cache" / KEY / "live"
    _write(live / "deep_gemm" / "cache" / "kernel.a.1" / "kernel.cubin", b"cubin-a")
    _write(live / "deep_gemm" / "cache" / "kernel.a.1" / "kernel.cu", b"code-a")
    _write(live / "triton" / "ABC" / "k.json", b"{}")
    _write(live / ".cache" / "flashinfer" / "90" / "op.so", b"so")
    _write(live / "deep_gemm" / "tmp" / "0f" / "kernel.cu", b"in flight")
    _write(live / "deep_gemm" / "locks" / "GEMM.lock", b"")
    os.symlink("/etc/passwd", live / "triton" / "link")
    return live


def test_the_walk_keeps_kernels_and_hidden_caches_not_work_in_flight_or_symlinks(tmp_path):
    assert kc.walk_cache(str(_live(tmp_path))) == [
        ".cache/flashinfer/90/op.so", "deep_gemm/cache/kernel.a.1/kernel.cu",
        "deep_gemm/cache/kernel.a.1/kernel.cubin", "triton/ABC/k.json"]


def test_freezing_publishes_a_snapshot_named_by_its_content_once(tmp_path):
    live = _live(tmp_path)
    snapshots = str(tmp_path / "root" / "kernel-cache" / "snapshots")
    manifest, changed = kc.freeze(str(live), snapshots, KEY, 1024)
    assert changed and manifest["revision"] == manifest["id"]
    places = node.layout(snapshots, KEY, manifest["id"])
    assert node.published(places, manifest)
    assert mf.verify_copy(places["model_dir"], manifest) == []
    assert kc.freeze(str(live), snapshots, KEY, 1024) == (manifest, False)
    assert not os.path.exists(os.path.join(snapshots, ".staging", KEY, "freeze"))


def test_a_freeze_killed_before_its_rename_publishes_nothing(tmp_path, monkeypatch):
    live = _live(tmp_path)
    snapshots = str(tmp_path / "snapshots")

    rename = os.rename

    def killed(src, dst):  # killed at the snapshot's rename, after its manifest is written
        if str(src).endswith("freeze"):
            raise KeyboardInterrupt("killed")
        rename(src, dst)

    monkeypatch.setattr(kc.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        kc.freeze(str(live), snapshots, KEY, 1024)
    monkeypatch.undo()
    assert [p for p in os.listdir(os.path.join(snapshots, KEY)) if not p.startswith(".")] == []
    manifest, changed = kc.freeze(str(live), snapshots, KEY, 1024)  # the re-run starts over
    assert changed and node.published(node.layout(snapshots, KEY, manifest["id"]), manifest)


def test_merging_never_overwrites_the_nodes_own_files_and_brings_folders_whole(tmp_path):
    snapshots = str(tmp_path / "snapshots")
    manifest, _ = kc.freeze(str(_live(tmp_path)), snapshots, KEY, 1024)
    source = node.layout(snapshots, KEY, manifest["id"])["model_dir"]
    other = tmp_path / "other" / "live"
    own = _write(other / "triton" / "ABC" / "k.json", b"the node's own")
    assert kc.compare(str(other), manifest) == {"live_files": 1, "new_files": 0,
                                                "missing_files": 3}
    copied = kc.merge(str(other), source, manifest)
    assert sorted(copied) == [".cache/flashinfer/90/op.so",
                              "deep_gemm/cache/kernel.a.1/kernel.cu",
                              "deep_gemm/cache/kernel.a.1/kernel.cubin"]
    assert own.read_bytes() == b"the node's own"
    assert (other / "deep_gemm/cache/kernel.a.1/kernel.cubin").read_bytes() == b"cubin-a"
    assert not [p for p in other.rglob("*") if p.name.startswith(kc.MERGE_PREFIX)]
    assert kc.merge(str(other), source, manifest) == []  # nothing new: nothing moves
    assert kc.compare(str(other), manifest)["missing_files"] == 0


def test_a_folder_the_server_made_meanwhile_is_merged_file_by_file(tmp_path):
    snapshots = str(tmp_path / "snapshots")
    manifest, _ = kc.freeze(str(_live(tmp_path)), snapshots, KEY, 1024)
    source = node.layout(snapshots, KEY, manifest["id"])["model_dir"]
    other = tmp_path / "other"
    own = _write(other / "deep_gemm" / "cache" / "kernel.a.1" / "kernel.cu", b"mine")
    owned = kc._merge_paths(str(other), source, ["deep_gemm/cache/kernel.a.1/kernel.cubin",
                                                 "deep_gemm/cache/kernel.a.1/kernel.cu"],
                            os.stat(other))
    assert owned == ["deep_gemm/cache/kernel.a.1/kernel.cubin"]
    assert own.read_bytes() == b"mine"


def test_the_controller_names_a_published_snapshot_its_keys_newest(tmp_path):
    live = _live(tmp_path)
    store = str(tmp_path / "store")
    assert kc.latest(store, KEY) is None
    manifest, _ = kc.freeze(str(live), store, KEY, 1024)  # published in the store
    assert kc.record_latest(store, manifest) is True
    assert kc.latest(store, KEY)["id"] == manifest["id"]
    assert kc.record_latest(store, manifest) is False
    unpublished = dict(manifest, revision="0" * 16)
    with pytest.raises(node.StageError, match="not published"):
        kc.record_latest(store, unpublished)


def test_who_fetches_and_who_is_harvested():
    specs = {h: {"kernel_cache": {"key": KEY}} for h in ("a", "b", "c")}
    specs["d"] = {"kernel_cache": None}
    compared = {"a": {"missing_files": 0, "new_files": 3, "published": True},
                "b": {"missing_files": 5, "new_files": 7, "published": False},
                "c": {"missing_files": 5, "new_files": 0, "published": True},
                "d": {"skipped": True}}
    hosts = ["a", "b", "c", "d"]
    assert stage_chains(hosts, specs, compared) == {KEY: ["b"]}
    assert harvest_sources(hosts, specs, compared) == {KEY: "b"}
    compared["b"]["new_files"] = 0
    compared["a"]["new_files"] = 0
    assert harvest_sources(hosts, specs, compared) == {}


def test_simulated_deepgemm_hits_its_cache_and_compiles_what_it_lacks(tmp_path, monkeypatch):
    compiles = []
    monkeypatch.setattr(dg.subprocess, "run", lambda *a, **k: compiles.append(a))
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path / "live"))
    monkeypatch.delenv("SGLANG_DG_CACHE_DIR", raising=False)
    steps = []
    dg._maybe_compile_deep_gemm_one_type_all([1, 2], 0.0, lambda: steps.append(1), arch="90")
    cubins = sorted((tmp_path / "live" / "deep_gemm" / "cache").glob("kernel.*/kernel.cubin"))
    assert len(compiles) == 2 and len(steps) == 2 and len(cubins) == 2
    name = cubins[0].parent.name
    assert name.startswith("kernel.sm90_fp8_gemm_1d2d.") and len(name.rsplit(".", 1)[1]) == 32
    dg._maybe_compile_deep_gemm_one_type_all([1, 2, 4], 0.0, lambda: steps.append(1), arch="90")
    assert len(compiles) == 3 and len(steps) == 5  # one miss compiled; the warm-up walks all Ms


def test_simulated_deepgemm_without_a_cache_folder_writes_nothing(tmp_path, monkeypatch):
    compiles = []
    monkeypatch.setattr(dg.subprocess, "run", lambda *a, **k: compiles.append(a))
    monkeypatch.delenv("SGLANG_CACHE_DIR", raising=False)
    monkeypatch.delenv("SGLANG_DG_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for _ in range(2):
        dg._maybe_compile_deep_gemm_one_type_all([1, 2], 0.0, lambda: None)
    assert len(compiles) == 4 and list(tmp_path.iterdir()) == []


def test_the_jit_hang_fault_holds_the_compile_lock_for_good(tmp_path):
    import fcntl
    dg.wedge_compile_lock(tmp_path)
    dg.wedge_compile_lock(tmp_path)  # a second rank finds it taken and holds nothing
    try:
        assert len(dg._WEDGED) == 1
        # _local_rank_compile_lock would wait for it
        with open(tmp_path / "locks" / f"{dg.GROUP}.lock", "w") as other, \
                pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        while dg._WEDGED:
            dg._WEDGED.pop().close()
