"""Staging's safety through real ansible-playbook runs on the simulated fleet (a synthetic
checkpoint in a shared folder, a per-node bandwidth cap):

- `kill -9` of the controller's whole run mid-copy (the CLI, ansible-playbook and its
  workers, as a cancelled CI job or the OOM killer leaves it), then a re-run: the nodes'
  staging agents, each its own session, keep their pieces and go on; the re-run attaches, the
  copy completes, every node serves it, and no node fetches more than one piece again;
- a full disk is refused before the first byte;
- a byte flipped in a staged copy fails its node, and no server starts on it."""

from __future__ import annotations

import json
import signal

import pytest

from sglang_fleet.known.models import known_model
from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.staging.synthetic import make_checkpoint
from sglang_fleet.testfleet.cli_run import CliRun
from sglang_fleet.testfleet.local import sglang_fleet, wait_for
from sglang_fleet.testfleet.staging import staging_fleet, stop_agents_under

pytestmark = pytest.mark.integration

PIECE = 65536


def _staged_fleet(tmp_path, size: int, **settings):
    """A 2-host fleet, a synthetic checkpoint of `size` bytes in a shared folder as r1's source,
    and the deploy's extra variables that stage it (with `settings` on top)."""
    fleet, origin_port = staging_fleet(tmp_path / "fleet", "sglang_stage_port")
    source = tmp_path / "shared" / "r1" / "Kimi-K2.5"
    make_checkpoint(source, size, shards=2, layers=2,
                    config=known_model("Kimi-K2.5").config_json())
    extra = {**fleet.extra,
             "sglang_server_model_path":
                 "{{ sglang_stage_source | sglang.fleet.sglang_fleet_staged_path("
                 "sglang_server_root) }}",
             "sglang_stage_source": {"folder": str(source), "revision": "r1"},
             "sglang_stage_origin_port": origin_port,
             "sglang_stage_cache_dir": str(tmp_path / "stage-cache"), **settings}
    return fleet, source, extra


def _status(fleet, host: str) -> dict:
    path = fleet.host_root(host) / "weights" / ".staging" / "Kimi-K2.5" / "r1" / "status.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_a_deploy_killed_while_staging_completes_on_a_rerun_fetching_no_piece_twice(tmp_path):
    # About 10 s per node at this cap: long enough to be killed mid-copy.
    fleet, source, extra = _staged_fleet(
        tmp_path, 2_000_000, sglang_stage_rate_limit=200_000, sglang_stage_piece_size=PIECE,
        sglang_stage_poll_interval=1, sglang_stage_stall_window=60, sglang_stage_linger=5)
    total = mf.build(str(source), "Kimi-K2.5", "r1", PIECE)["total_bytes"]
    args = ("deploy", "-i", str(fleet.inventory), "-e", json.dumps(extra))
    cli = CliRun(tmp_path / "first.txt", *args, "--run-dir", str(tmp_path / "first"))
    try:
        wait_for(lambda: 0 < _status(fleet, "sim-node-1").get("bytes_have", 0) < total,
                 timeout=300, interval=0.1)
        cli.track()
        cli.kill(cli.identities(), signal.SIGKILL)
        cli.proc.kill()
        cli.proc.wait(timeout=30)
        wait_for(lambda: not cli.members(), timeout=30)
        assert _status(fleet, "sim-node-1")["bytes_have"] < total, "killed mid-copy"
        agents = {h: _status(fleet, h).get("pid") for h in fleet.hosts}

        again = sglang_fleet(*args, "--run-dir", str(tmp_path / "again"))
        assert again.returncode == 0, again.stdout[-4000:]
        for host in fleet.hosts:
            copy = fleet.host_root(host) / "weights" / "Kimi-K2.5" / "r1" / "Kimi-K2.5"
            assert mf.verify_copy(str(copy), mf.build(str(source), "Kimi-K2.5", "r1",
                                                      PIECE)) == []
            status = _status(fleet, host)
            if agents[host]:  # started before the kill: the same agent went on to the end
                assert status["pid"] == agents[host], (host, status)
            # The agent that finished the copy fetched what it did not hold when it started,
            # and at most one piece more (the one in flight at a kill).
            started_with = status.get("pieces_at_start", 0) * PIECE
            assert status["bytes_fetched"] <= total - started_with + PIECE, (host, status)
    finally:
        if cli.proc.poll() is None:
            cli.proc.kill()
        fleet.stop()
        fleet.kill_leftovers()
        stop_agents_under(tmp_path)


def test_a_full_disk_is_refused_before_the_first_byte_naming_node_need_and_free(tmp_path):
    """sim-node-1's weights folder is a 16 MiB file system (a tmpfs mounted in a mount
    namespace of the run's own, gone with it): the deploy stops at the disk check, naming the
    node, what it needs and what is free, before any agent starts or any byte moves."""
    import subprocess

    from sglang_fleet.testfleet.local import BIN, REPO, ansible_env

    fleet, _, extra = _staged_fleet(tmp_path, 1_000_000)
    weights = fleet.host_root("sim-node-1") / "weights"
    weights.mkdir(parents=True)
    mount = 'mount -t tmpfs -o size=16m tmpfs "$1" && shift && exec "$@"'
    try:
        run = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh",
             str(weights), str(BIN / "sglang-fleet"), "deploy", "-i", str(fleet.inventory),
             "-e", json.dumps(extra), "--run-dir", str(tmp_path / "run")],
            cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=600)
        text = " ".join(run.stdout.split())
        assert run.returncode != 0, text[-3000:]
        assert "not enough disk on sim-node-1 for r1: need " in text, text[-3000:]
        assert "free 16.8 MB (16777216 bytes) under " in text, text[-3000:]
        assert "set sglang_server_root to a larger file system" in text
        # Nothing moved anywhere: no agent's staging folder, no origin, no server.
        for host in fleet.hosts:
            assert not (fleet.host_root(host) / "weights" / ".staging").exists(), host
        assert not (tmp_path / "stage-cache" / "origin").exists()
        assert not fleet.processes("sim-node-1") and not fleet.processes("sim-node-2")
    finally:
        fleet.kill_leftovers()
        stop_agents_under(tmp_path)


def test_a_flipped_byte_in_a_staged_copy_fails_its_node_and_starts_no_server_on_it(tmp_path):
    """A byte flipped in sim-node-2's published copy (a disk's error, a hand) after the copy
    was staged: the next deploy's node check reads it against the manifest, fails that node
    naming the file, and starts no server on it; sim-node-1 deploys."""
    fleet, _, extra = _staged_fleet(tmp_path, 1_000_000, sglang_stage_piece_size=PIECE,
                                    sglang_stage_poll_interval=1, sglang_stage_linger=3)
    args = ("-i", str(fleet.inventory), "-e", json.dumps(extra))
    try:
        first = sglang_fleet("deploy", *args, "--run-dir", str(tmp_path / "first"))
        assert first.returncode == 0, first.stdout[-3000:]
        fleet.stop()
        shard = (fleet.host_root("sim-node-2") / "weights" / "Kimi-K2.5" / "r1" / "Kimi-K2.5"
                 / "model-00001-of-00002.safetensors")
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))

        again = sglang_fleet("deploy", *args, "--run-dir", str(tmp_path / "again"))
        text = " ".join(again.stdout.split())
        assert again.returncode != 0, text[-3000:]
        assert "sim-node-2: the copy at " in text, text[-3000:]
        assert "disagrees with its manifest" in text and "model-00001-of-00002" in text
        assert not fleet.processes("sim-node-2"), "no server starts on a corrupt copy"
        assert fleet.processes("sim-node-1")
    finally:
        fleet.stop()
        fleet.kill_leftovers()
        stop_agents_under(tmp_path)
