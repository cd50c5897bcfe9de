"""Sweep and bisect files: what is refused, with the variable, the value and the fix."""

from __future__ import annotations

import pytest
import yaml

from sglang_fleet.bench.experiments import PlanError, differing, load_settings, load_sweep
from sglang_fleet.bench.report import config_row, markdown_table, write_report
from sglang_fleet.testfleet.local import REPO


def plan(tmp_path, data) -> str:
    path = tmp_path / "sweep.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_incident_sweep_loads():
    p = load_sweep(str(REPO / "examples" / "experiments" / "incident-sweep.yml"))
    assert p.baseline == {"sglang_server_attention_backend": "triton"}
    assert [v.name for v in p.variants] == ["flashinfer", "triton + NCCL tuning"]
    assert p.variants[0].allow_rules == ["flashinfer-mla-sm120-graph-capture-hang"]
    assert p.bench["output_len"] == 256


def test_a_variant_that_changes_two_variables_is_refused(tmp_path):
    path = plan(tmp_path, {"baseline": {}, "variants": [
        {"name": "both", "set": {"sglang_server_attention_backend": "flashinfer",
                                 "sglang_server_num_continuous_decode_steps": 4}}]})
    with pytest.raises(PlanError) as err:
        load_sweep(path)
    text = str(err.value)
    assert "variants[0] (both): changes 2 variables" in text
    assert "sglang_server_attention_backend, sglang_server_num_continuous_decode_steps" in text
    assert "multiple: true" in text and "--allow-multiple" in text
    # ... unless told
    assert len(load_sweep(path, allow_multiple=True).variants[0].settings) == 2


def test_every_problem_is_reported_at_once(tmp_path):
    path = plan(tmp_path, {"baseline": {"sglang_server_tp": 8}, "colour": 1, "variants": [
        {"name": "typo", "set": {"sglang_server_atention_backend": "triton"}},
        {"name": "moves", "set": {"sglang_server_port": 31000}},
        {"name": "same", "set": {"sglang_server_tp": 8}},
        {"name": "nothing", "set": {}}]})
    with pytest.raises(PlanError) as err:
        load_sweep(path)
    problems = err.value.problems
    assert any("unknown keys ['colour']" in p for p in problems)
    assert any("sglang_server_atention_backend: not a sglang_server role variable (did you "
               "mean sglang_server_attention_backend?)" in p for p in problems)
    assert any("sglang_server_port: says where the server runs" in p for p in problems)
    assert any("sglang_server_tp equals the baseline's value" in p for p in problems)
    assert any("(nothing): changes 0 variables" in p for p in problems)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(PlanError, match="cannot read it"):
        load_sweep(str(tmp_path / "missing.yml"))
    bad = tmp_path / "bad.yml"
    bad.write_text("variants: [")
    with pytest.raises(PlanError, match="not valid YAML"):
        load_sweep(str(bad))


def test_bisect_endpoints_keep_allow_rules_apart(tmp_path):
    settings, allow = load_settings(str(REPO / "examples" / "experiments" / "bisect-bad.yml"))
    assert "sglang_server_allow_rules" not in settings
    assert allow == ["flashinfer-mla-sm120-graph-capture-hang"]
    good, _ = load_settings(str(REPO / "examples" / "experiments" / "bisect-good.yml"))
    names = differing(good, settings)
    assert len(names) >= 6 and names[0] == "sglang_server_attention_backend"


def test_differing_follows_the_bad_files_order_and_counts_missing_keys():
    good = {"a": 1, "b": 2, "only_good": 5}
    bad = {"c": 3, "b": 2, "a": 9}
    assert differing(good, bad) == ["c", "a", "only_good"]


def test_report_labels_simulated_figures(tmp_path):
    measured = {"config_hash": "abc", "simulated": True, "benchmark": {"levels": [{
        "output_tok_s": {"median": 90.0, "min": 89.0, "max": 91.0, "n": 3},
        "ttft_s": {"median": 0.18}, "itl_s": {"p50": 0.011, "p99": 0.012}}]}}
    rows = [config_row("baseline", {}, "ready", {**measured, "benchmark": {"levels": [{
                "output_tok_s": {"median": 60.0, "min": 60.0, "max": 60.0, "n": 3},
                "ttft_s": {"median": 0.18}, "itl_s": {"p50": 0.016, "p99": 0.017}}]}},
                       60.0),
            config_row("fast", {"sglang_server_nccl_profile": {"NCCL_PROTO": "LL"}}, "ready",
                       measured, 60.0),
            config_row("hung", {"sglang_server_attention_backend": "flashinfer"},
                       "stalled in capturing_cuda_graph", None, 60.0, "/ev/1")]
    table = markdown_table(rows, simulated=True)
    assert "output tok/s (simulated)" in table and "SIMULATED" in table
    assert "| fast | nccl_profile=NCCL_PROTO=LL | ready | 90.0 | 89.0-91.0 (n=3) | 0.180 | " \
           "11.0/12.0 | +50.0% |" in table
    assert "evidence: `/ev/1`" in table
    md, png, js = write_report(rows, tmp_path, "sweep", "t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "SIMULATED" in md.read_text() and js.exists()


def test_a_proposed_rule_says_when_rules_cannot_match_the_culprit():
    from sglang_fleet.cli.bisect import proposed_rule
    recovery = {"facts": {"attention_backend": "triton", "model_family": "MLA",
                          "compute_capability": "12.0", "tp": 8, "cuda_graph": True},
                "verdict": "stalled", "phase": "capturing_cuda_graph", "reason": "no progress"}
    nccl = proposed_rule("run1", "n1", ("sglang_server_nccl_profile",), {}, recovery)
    assert nccl["fix"]["variable"] == "sglang_server_nccl_profile"
    assert "Rules cannot match on sglang_server_nccl_profile" in nccl["note"]
    backend = proposed_rule("run1", "n1", ("sglang_server_cuda_graph",),
                            {"sglang_server_cuda_graph": False}, recovery)
    assert backend["fix"] == {"variable": "sglang_server_cuda_graph", "value": False}
    assert "note" not in backend and backend["symptom"].startswith("stalled in capturing")
