"""The reviewed data files: rules, SGLang releases, NCCL names."""

from __future__ import annotations

import pytest

from sglang_fleet.known.catalogue import catalogue
from sglang_fleet.known.reviewed import nccl_did_you_mean, releases, sim_profile
from sglang_fleet.known.rules import load_rules, matching_rules, parse_rules

INCIDENT = {"attention_backend": "flashinfer", "model_family": "MLA",
            "compute_capability": "12.0", "interconnect": "pcie", "tp": 8,
            "custom_all_reduce": True, "cuda_graph": True, "sglang_version": "0.5.23"}


def test_every_rule_has_symptom_source_fix_and_the_simulator_fails_it_on_its_own():
    """A Rule is tested against the simulator, which knows SGLang's bugs as facts of its own
    (data/sim_bugs.yml): every configuration a Rule refuses fails there, as on real SGLang."""
    from sglang_fleet.sim.engine.runtime import _holds, known_bugs

    rules = load_rules()
    assert {"flashinfer-mla-sm120-graph-capture-hang",
            "trtllm-mla-sm120-prefill-unsupported"} <= {r.id for r in rules}
    for rule in rules:
        assert rule.symptom and rule.source
        assert rule.fix_variable.startswith("sglang_server_")
        facts = {**INCIDENT, "attention_backend": "triton", "interconnect": "pcie",
                 **{k: (v[0] if isinstance(v, list) else v) for k, v in rule.match.items()}}
        facts["decode_cuda_graph"] = facts.pop("cuda_graph", True)
        bugs = [b for b in known_bugs() if _holds(b["when"], facts)]
        assert bugs and bugs[0]["fault"]["kind"] in ("hang", "crash", "oom"), rule.id
        fixed = {**facts, rule.fix_variable.removeprefix("sglang_server_"): rule.fix_value}
        fixed["custom_all_reduce"] = not fixed.pop("disable_custom_all_reduce", False)
        assert not [b for b in known_bugs() if _holds(b["when"], fixed)], rule.id


def test_incident_matches_only_the_graph_capture_rule():
    assert [r.id for r in matching_rules(INCIDENT)] == ["flashinfer-mla-sm120-graph-capture-hang"]
    assert matching_rules({**INCIDENT, "attention_backend": "triton"}) == []


def test_compute_capability_matches_as_text():
    assert matching_rules({**INCIDENT, "compute_capability": 12.0})


def test_duplicate_rule_ids_are_refused():
    entry = {"id": "x", "match": {}, "symptom": "s", "source": "s",
             "fix": {"variable": "v", "value": 1}}
    with pytest.raises(ValueError, match="duplicate"):
        parse_rules([entry, entry])


def test_releases_know_their_backends_and_removed_flags():
    assert "cutlass_mla" not in catalogue("0.5.23").choices_of("attention_backend")
    assert "cutlass_mla" in catalogue("0.5.4.post3").choices_of("attention_backend")
    # Removed: in the older shipped catalogue, not in this one; its successors are named.
    assert catalogue("0.5.23").replacements("--cuda-graph-max-bs") == [
        "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]


def test_default_attention_backend_follows_the_release_source():
    r = releases()["0.5.23"]
    assert r.default_backend("MLA", "12.0") == "triton"
    assert r.default_backend("MLA", "9.0") == "fa3"
    assert r.default_backend("MLA", "10.0") == "trtllm_mla"  # the DeepSeek-V3 family
    assert r.default_backend("MLA", "10.0", "DeepseekV2ForCausalLM") == "flashinfer"
    assert r.default_backend("MHA", "10.0") == "trtllm_mha"
    assert r.default_backend("MHA", "12.0") == "flashinfer"


def test_nccl_did_you_mean():
    assert nccl_did_you_mean("NCCL_P2P_LEVL") == "NCCL_P2P_LEVEL"
    assert nccl_did_you_mean("NCCL_ZZZZZZZZZZZZ") is None


def test_sim_profile_unknown_name_lists_known():
    assert sim_profile("kimi-k2.5-rtxpro6000-tp8")["decode_tok_s"]["base"] == 63.6
    with pytest.raises(KeyError, match="kimi-k2.5-rtxpro6000-tp8"):
        sim_profile("nope")
