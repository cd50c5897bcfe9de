"""`sglang-fleet sweep` and `sglang-fleet bisect` end to end on the simulated fleet: real
deploys through ansible-runner, the gate, benchmarks, and recovery between trials."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from sglang_fleet.node.gpu.simgpu import read_allocations
from sglang_fleet.testfleet.local import (
    FAST_GATE,
    REPO,
    SMALL_TP,
    http_status,
    make_fleet,
    sglang_fleet,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def node(tmp_path):
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.005, tp=SMALL_TP)
    yield fleet
    fleet.kill_leftovers()


def cli_args(fleet, run_dir: Path) -> list[str]:
    return ["-i", str(fleet.inventory), "--limit", "sim-node-1", "--run-dir", str(run_dir),
            "-e", json.dumps(fleet.with_stores(**FAST_GATE))]


def test_sweep_reproduces_the_incident(node, tmp_path):
    run_dir = tmp_path / "sweep"
    run = sglang_fleet("sweep", str(REPO / "examples/experiments/incident-sweep.yml"),
                       *cli_args(node, run_dir), "--output-len", "128", "--repetitions", "2",
                       "--no-restore")
    assert run.returncode == 0, run.stdout
    rows = {r["name"]: r for r in json.loads((run_dir / "sweep.json").read_text())["rows"]}
    base, hung, tuned = rows["baseline"], rows["flashinfer"], rows["triton + NCCL tuning"]
    assert base["verdict"] == "ready" and base["simulated"]
    assert base["tok_s"] == pytest.approx(63.6 * 128 / 127, rel=0.03)
    # flashinfer hangs in graph capture; the sweep recovered it and kept the evidence.
    assert hung["verdict"].startswith("stalled in capturing_cuda_graph; stopped, GPUs freed")
    assert hung["tok_s"] is None and Path(hung["evidence"], "summary.json").is_file()
    assert hung["changed"] == "attention_backend=flashinfer"
    # NCCL tuning alone: faster, by the simulator's profile (41.5%). The simulator paces its
    # tokens with wall-clock sleeps, which a loaded 2-core machine wakes late: a few percent
    # of either speed moves the difference by a few points.
    assert tuned["verdict"] == "ready"
    assert tuned["delta_pct"] == pytest.approx(41.5, abs=5.0)
    assert tuned["changed"].startswith("nccl_profile=NCCL_P2P_LEVEL=SYS")
    table = (run_dir / "sweep.md").read_text()
    assert "| flashinfer | attention_backend=flashinfer | stalled in capturing_cuda_graph" in table
    assert "SIMULATED" in table and "SIMULATED" in run.stdout
    assert (run_dir / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    # CI sees one test case per variant; the hung one fails with its evidence.
    cases = {c.get("name"): c.find("failure") for c in
             ET.parse(run_dir / "junit.xml").getroot().iter("testcase")}
    assert cases["baseline"] is None and cases["triton + NCCL tuning"] is None
    assert hung["evidence"] in cases["flashinfer"].text
    # The run folder keeps every command's promise: summary.json with the exit code.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["command"], summary["exit_code"], summary["result"]) == ("sweep", 0, "ok")
    assert [t["name"] for t in summary["trials"]] == ["baseline", "flashinfer",
                                                      "triton + NCCL tuning"]
    # Each trial's stages and phases were shown while it ran, under its own line.
    trial = run.stdout[run.stdout.index("[2/3] flashinfer: deploying"):
                       run.stdout.index("[2/3] flashinfer: stalled")]
    # (Which phases show depends on when the gate looks: on a loaded machine its first look
    # may already find the capture stalled.)
    assert re.search(r"^    GATE \[sim-node-1\] (progressing|stalled)", trial, re.M), trial
    # Each trial's runner artifacts are kept for the record.
    assert len(list(run_dir.glob("0*-*/artifacts/*/job_events/*.json"))) > 50
    # The hung variant's recovery is an experiment's: the crash-loop guard ignores it.
    recovery = [e for e in node.read_store("ledger.jsonl") if e["kind"] == "recovery"]
    assert len(recovery) == 1 and recovery[0]["experiment"] == run_dir.name


def test_sweep_refuses_a_variant_that_changes_two_variables(node, tmp_path):
    plan = tmp_path / "two.yml"
    plan.write_text(yaml.safe_dump({"baseline": {}, "variants": [{"name": "both", "set": {
        "sglang_server_attention_backend": "flashinfer",
        "sglang_server_num_continuous_decode_steps": 4}}]}))
    run = sglang_fleet("sweep", str(plan), *cli_args(node, tmp_path / "run"))
    assert run.returncode == 2
    assert "variants[0] (both): changes 2 variables" in run.stdout
    assert "--allow-multiple" in run.stdout
    assert not (tmp_path / "run").exists() and not node.processes("sim-node-1")


def failing_name(record) -> str:
    return "bad values of " + ", ".join(v.removeprefix("sglang_server_")
                                        for v in record["culprit"])


def test_bisect_finds_a_planted_culprit_in_at_most_four_trials(node, tmp_path):
    good = tmp_path / "good.yml"
    good.write_text(yaml.safe_dump({"sglang_server_attention_backend": "triton"}))
    bad = tmp_path / "bad.yml"
    # Six harmless changes, and the culprit last, where halving has the longest way to go.
    bad.write_text(yaml.safe_dump({
        "sglang_server_num_continuous_decode_steps": 4,
        "sglang_server_disable_custom_all_reduce": True,
        "sglang_server_mem_fraction_static": 0.88,
        "sglang_server_cuda_graph_max_bs": 64,
        "sglang_server_enable_metrics": False,
        "sglang_server_nccl_profile": {"NCCL_P2P_LEVEL": "SYS"},
        "sglang_server_attention_backend": "flashinfer",
        "sglang_server_allow_rules": ["flashinfer-mla-sm120-graph-capture-hang"],
    }, sort_keys=False))
    run_dir = tmp_path / "bisect"
    run = sglang_fleet("bisect", "--good", str(good), "--bad", str(bad),
                       *cli_args(node, run_dir))
    assert run.returncode == 0, run.stdout
    record = json.loads((run_dir / "bisect.json").read_text())
    assert len(record["differing"]) == 7
    assert record["culprit"] == ["sglang_server_attention_backend"] and record["confirmed"]
    assert len(record["trials"]) <= 4
    failing = [t for t in record["trials"] if t["bad_values_of"] == record["culprit"]][0]
    assert failing["failed"] and failing["verdict"]["verdict"] == "stalled"
    assert Path(failing["evidence"], "summary.json").is_file()
    assert "culprit after" in run.stdout and "attention_backend='flashinfer'" in run.stdout
    # The culprit is a known Rule (allowed for the bisect), so no new Rule is proposed.
    assert record["rule"]["known_rule"] == "flashinfer-mla-sm120-graph-capture-hang"
    # Restored: the inventory's own configuration runs again, and no trial holds a GPU.
    assert "restored sim-node-1 to the inventory's configuration: ready" in run.stdout
    # summary.json and junit.xml, as every run folder has them: a case per trial (failed
    # where the server failed, with its evidence), the culprit, and the restore.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["command"], summary["exit_code"], summary["result"]) == ("bisect", 0, "ok")
    assert summary["culprit"] == record["culprit"] and summary["confirmed"]
    assert summary["hosts"]["sim-node-1"]["verdict"] == "ready"
    assert len(summary["trials"]) == len(record["trials"])
    cases = [(c.get("name"), c.find("failure")) for c in
             ET.parse(run_dir / "junit.xml").getroot().iter("testcase")]
    assert [n for n, _ in cases][-2:] == ["culprit", "restore"]
    assert cases[-1][1] is None and cases[-2][1] is None
    failed = dict(cases)[failing_name(record)]
    assert failed is not None and failing["evidence"] in failed.text
    assert http_status(node.url("sim-node-1") + "/health") == 200
    sim_gpus = node.host_root("sim-node-1") / "sim" / "gpus"
    holders = {a["pid"] for a in read_allocations(str(sim_gpus))}
    assert holders <= {p["pid"] for p in node.processes("sim-node-1")}
