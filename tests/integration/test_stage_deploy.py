"""Staging through real ansible-playbook runs on the simulated fleet: a model source in the
inventory (a folder here, with a small synthetic checkpoint shaped like Kimi-K2.5's config) is
staged on every node before any server is stopped, the gate shows the staging_weights phase,
the servers serve the staged copy, a new revision is staged, gated and served, and a re-run
moves nothing."""

from __future__ import annotations

import json
import re

import pytest

from sglang_fleet.known.models import known_model
from sglang_fleet.node.staging import manifest as mf
from sglang_fleet.staging.synthetic import make_checkpoint
from sglang_fleet.testfleet.staging import staging_fleet, stop_agents_under

pytestmark = pytest.mark.integration


def _checkpoint(folder, seed_bytes):
    config = known_model("Kimi-K2.5").config_json()
    return make_checkpoint(folder, seed_bytes, shards=2, layers=2, config=config)


@pytest.fixture(scope="module")
def staged_fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stage-deploy")
    fleet, origin_port = staging_fleet(tmp, "sglang_stage_port")
    sources = tmp / "shared"
    _checkpoint(sources / "r1" / "Kimi-K2.5", 1_000_000)
    _checkpoint(sources / "r2" / "Kimi-K2.5", 1_000_000)
    fleet.extra.update({
        "sglang_server_model_path":
            "{{ sglang_stage_source | sglang.fleet.sglang_fleet_staged_path(sglang_server_root) }}",
        "sglang_stage_origin_port": origin_port, "sglang_stage_rate_limit": 100_000,
        "sglang_stage_piece_size": 65536, "sglang_stage_poll_interval": 1,
        "sglang_stage_stall_window": 30, "sglang_stage_linger": 3,
        "sglang_stage_cache_dir": str(tmp / "stage-cache")})
    fleet.sources = sources
    yield fleet
    fleet.stop()
    fleet.kill_leftovers()
    stop_agents_under(tmp)  # the origin and any agent still lingering


def _source(fleet, revision):
    return {"sglang_stage_source": {"folder": str(fleet.sources / revision / "Kimi-K2.5"),
                                    "revision": revision}}


def _served_by_origin(fleet, revision):
    status = fleet.root.parent / "stage-cache" / "origin" / ".staging" / "Kimi-K2.5" / revision
    return json.loads((status / "status.json").read_text())["bytes_served"]


def _model_path(fleet, host, revision):
    return fleet.host_root(host) / "weights" / "Kimi-K2.5" / revision / "Kimi-K2.5"


def test_a_deploy_stages_gates_and_serves_the_revision(staged_fleet):
    fleet = staged_fleet
    run = fleet.deploy(extra=_source(fleet, "r1"))
    assert run.rc == 0, run.output[-4000:]
    lines = re.findall(r"GATE \[(sim-node-\d)\]: progressing: staging_weights (\d+)/(\d+) files, "
                       r"[\d.]+ MB of [\d.]+, [\d.]+ MB/s", run.output)
    assert {host for host, *_ in lines} == set(fleet.hosts), run.output[-4000:]
    assert run.output.index("staging_weights") < run.output.index("GATE [sim-node-1]: ready")
    manifest = mf.build(str(fleet.sources / "r1" / "Kimi-K2.5"), "Kimi-K2.5", "r1", 65536)
    for host in fleet.hosts:
        copy = _model_path(fleet, host, "r1")
        assert mf.verify_copy(str(copy), manifest) == []
        model = json.loads(_http_json(fleet.url(host) + "/get_model_info"))
        assert model["model_path"] == str(copy)
    assert _served_by_origin(fleet, "r1") <= 1.05 * manifest["total_bytes"]


def test_a_rerun_moves_no_byte_and_changes_nothing(staged_fleet):
    fleet = staged_fleet
    before = _served_by_origin(fleet, "r1")
    run = fleet.deploy(extra=_source(fleet, "r1"))
    assert run.rc == 0, run.output[-4000:]
    assert run.changed_hosts() == set(), run.output[-4000:]
    assert "staging_weights" not in run.output
    assert _served_by_origin(fleet, "r1") == before


def test_a_new_revision_is_staged_before_the_server_restarts_on_it(staged_fleet):
    fleet = staged_fleet
    run = fleet.deploy(extra=_source(fleet, "r2"))
    assert run.rc == 0, run.output[-4000:]
    assert re.search(r"GATE \[sim-node-1\]: progressing: staging_weights", run.output)
    for host in fleet.hosts:
        model = json.loads(_http_json(fleet.url(host) + "/get_model_info"))
        assert model["model_path"] == str(_model_path(fleet, host, "r2"))
        assert (fleet.host_root(host) / "weights" / "Kimi-K2.5" / ".in_use").read_text() == "r2\n"
        assert _model_path(fleet, host, "r1").is_dir(), "keep 2: r1 stays"


def _http_json(url: str) -> str:
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()
