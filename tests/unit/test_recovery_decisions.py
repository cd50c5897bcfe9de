"""Recovery's controller-side decisions: next configuration, ledger, guard, proposed rules."""

from __future__ import annotations

import json
import threading

from sglang_fleet.recovery import (
    choose_next,
    proposed_rules,
    recent_recoveries,
)
from sglang_fleet.store import append_jsonl, read_jsonl

INCIDENT_FACTS = {"attention_backend": "flashinfer", "model_family": "MLA",
                  "compute_capability": "12.0", "interconnect": "pcie", "tp": 8,
                  "custom_all_reduce": True, "cuda_graph": True, "sglang_version": "0.5.23"}
SAFE_FACTS = dict(INCIDENT_FACTS, attention_backend="triton")
BASE = {"sglang_server_attention_backend": "triton", "sglang_server_num_continuous_decode_steps": 1,
        "sglang_server_cuda_graph": True, "sglang_server_overrides": {},
        "sglang_server_allow_rules": []}


def test_matching_rule_gives_its_fix_and_drops_the_override():
    settings = dict(BASE, sglang_server_attention_backend="flashinfer",
                    sglang_server_allow_rules=["flashinfer-mla-sm120-graph-capture-hang"])
    choice = choose_next(settings, INCIDENT_FACTS, [], "n1", [])
    assert choice["source"] == "rule"
    assert choice["overrides"] == {"sglang_server_attention_backend": "triton",
                                   "sglang_server_allow_rules": []}


def test_one_differing_variable_is_reverted_to_the_last_known_good():
    ledger = [{"kind": "ready", "host": "n1", "settings": dict(BASE)}]
    settings = dict(BASE, sglang_server_num_continuous_decode_steps=4,
                    sglang_server_port=30009)  # where, not what: never reverted
    choice = choose_next(settings, SAFE_FACTS, ledger, "n1", [])
    assert choice["source"] == "last_known_good"
    assert choice["overrides"] == {"sglang_server_num_continuous_decode_steps": 1}
    assert "1 variable(s) differ" in choice["reason"]


def test_fallback_chain_steps_are_tried_in_order_once():
    chain = [{"sglang_server_cuda_graph": False}, {"sglang_server_mem_fraction_static": 0.8}]
    first = choose_next(dict(BASE), SAFE_FACTS, [], "n1", chain)
    assert first["overrides"] == {"sglang_server_cuda_graph": False}
    tried = dict(BASE, sglang_server_overrides={"sglang_server_cuda_graph": False,
                                                "sglang_server_mem_fraction_static": 0.8})
    assert choose_next(tried, SAFE_FACTS, [], "n1", chain)["source"] == "none"


def test_ledger_appends_atomically_from_many_writers(tmp_path):
    path = str(tmp_path / "ledger" / "l.jsonl")
    threads = [threading.Thread(target=append_jsonl, args=(path, {"kind": "x", "n": i}))
               for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = read_jsonl(path)
    assert sorted(e["n"] for e in entries) == list(range(40))
    with open(path, "a") as f:
        f.write('{"torn": ')  # a crash mid-line is skipped, not fatal
    assert len(read_jsonl(path)) == 40


def test_crash_loop_window_counts_only_recent_recoveries_of_the_host():
    now = 10_000.0
    ledger = [{"kind": "recovery", "host": "n1", "at": now - 100},
              {"kind": "recovery", "host": "n1", "at": now - 5000},
              {"kind": "recovery", "host": "n2", "at": now - 10},
              {"kind": "ready", "host": "n1", "at": now - 1}]
    assert len(recent_recoveries(ledger, "n1", 3600, now)) == 1


def test_same_failure_twice_without_a_rule_is_proposed():
    facts = dict(SAFE_FACTS, attention_backend="fa3")
    failure = {"kind": "recovery", "host": "n1", "config_hash": "abc", "facts": facts,
               "verdict": "stalled", "phase": "capturing_cuda_graph", "reason": "no progress"}
    outcome = {"kind": "recovery_outcome", "host": "n1", "config_hash_failed": "abc",
               "verdict": "ready", "applied": {"sglang_server_cuda_graph": False}}
    assert proposed_rules([failure, outcome]) == []
    (rule,) = proposed_rules([failure, outcome, dict(failure, host="n2")])
    assert rule["match"]["attention_backend"] == "fa3"
    assert rule["fix"] == {"variable": "sglang_server_cuda_graph", "value": False}
    assert "2 times" in rule["symptom"] and "n1, n2" in rule["source"]
    json.dumps(rule)


def test_a_failure_a_rule_already_covers_is_not_proposed_again():
    failure = {"kind": "recovery", "host": "n1", "config_hash": "x", "facts": INCIDENT_FACTS,
               "verdict": "stalled", "phase": "capturing_cuda_graph"}
    assert proposed_rules([failure, failure]) == []
