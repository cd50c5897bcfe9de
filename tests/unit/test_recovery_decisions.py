"""Recovery's controller-side decisions: next configuration, ledger, guard, proposed rules."""

from __future__ import annotations

import json
import threading

from sglang_fleet.recovery.decisions import (
    choose_next,
    choose_rollback,
    proposed_rules,
    recent_recoveries,
    rejected,
)
from sglang_fleet.runs.store import append_jsonl, read_jsonl

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
    assert "1 variable differs" in choice["reason"]


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


def test_the_crash_loop_guard_bounds_faults_of_the_node_and_from_outside(tmp_path):
    """A full disk, the OOM killer or an outside kill -9 restart the same configuration
    (never a Rule's change), so nothing else stops a loop: the guard counts those
    recoveries as any other, read from the ledger as the role records them."""
    import time

    path = str(tmp_path / "ledger.jsonl")
    now = time.time()
    for cause, age in (("environment", 900), ("external", 600), ("environment", 60)):
        append_jsonl(path, {"kind": "recovery", "host": "n1", "cause": cause, "at": now - age,
                            "next": {"source": "restart", "overrides": {}},
                            "experiment": ""})
    append_jsonl(path, {"kind": "recovery", "host": "n2", "cause": "external", "at": now})
    assert [e["cause"] for e in recent_recoveries(read_jsonl(path), "n1", 3600, now)] == [
        "environment", "external", "environment"]
    # The role's guard: refused once the count reaches sglang_recover_max_attempts (3).
    assert not len(recent_recoveries(read_jsonl(path), "n1", 3600, now)) < 3


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


# ---- which path: same configuration for faults of a running server, the chain for faults of
# a configuration (issue 13.7), and the configuration that ran, not the inventory (12.4) ----

NOW = 100_000.0
GOOD_HASH, ONE_OFF_HASH = "aaaaaaaaaaaa", "bbbbbbbbbbbb"
FALLBACK = [{"sglang_server_cuda_graph": False}]
INCIDENT = dict(BASE, sglang_server_attention_backend="flashinfer",
                sglang_server_allow_rules=["flashinfer-mla-sm120-graph-capture-hang"])


def verdict(name, phase):
    return {"verdict": name, "phase": phase, "reason": "r"}


def ready_entry(config_hash=GOOD_HASH, settings=BASE, at=NOW - 7200):
    return {"kind": "ready", "host": "n1", "config_hash": config_hash,
            "settings": dict(settings), "at": at}


def running(config_hash=GOOD_HASH, settings=BASE, facts=SAFE_FACTS):
    return {"config_hash": config_hash, "settings": dict(settings) if settings else None,
            "facts": facts}


def choose(v, run, ledger=(), settings=BASE, facts=SAFE_FACTS):
    return choose_next(dict(settings), facts, list(ledger), "n1", FALLBACK, v, run, 3600, NOW)


def test_a_server_that_froze_or_hung_after_ready_is_restarted_on_the_same_configuration():
    # A frozen process (SIGSTOP) and a generation hang: serving, but /health times out.
    choice = choose(verdict("unhealthy", "serving"), running(), [ready_entry()])
    assert choice["source"] == "restart" and choice["overrides"] == {}
    assert choice["config_hash"] == GOOD_HASH and choice["cause"] == "after_ready"
    assert "was ready on aaaaaaaaaaaa and failed later" in choice["why"]
    assert choice["reason"] == "restart on the same configuration aaaaaaaaaaaa"


def test_a_crash_after_hours_and_a_reused_pid_are_restarted_not_reconfigured():
    # Both read `crashed` with the log's phase `serving`: the server had been ready.
    for v in (verdict("crashed", "serving"), verdict("unhealthy", "serving")):
        choice = choose(v, running(), [ready_entry()])
        assert choice["source"] == "restart", v
        assert "sglang_server_cuda_graph" not in choice["overrides"]


def test_a_gpu_fault_is_the_hardwares_and_keeps_the_configuration():
    choice = choose(verdict("gpu_fault", "capturing_cuda_graph"), running(), [ready_entry()])
    assert choice["source"] == "restart" and choice["cause"] == "hardware"


def test_a_restart_keeps_a_one_off_configuration_that_had_been_ready():
    one_off = dict(BASE, sglang_server_num_continuous_decode_steps=4)
    choice = choose(verdict("unhealthy", "serving"), running(ONE_OFF_HASH, one_off),
                    [ready_entry(ONE_OFF_HASH, one_off)])
    assert choice["source"] == "restart"
    assert choice["overrides"] == {"sglang_server_num_continuous_decode_steps": 4}


def test_a_second_failure_on_the_same_configuration_goes_down_the_chain():
    earlier = {"kind": "recovery", "host": "n1", "config_hash": GOOD_HASH, "at": NOW - 600,
               "verdict": "unhealthy", "phase": "serving"}
    choice = choose(verdict("unhealthy", "serving"), running(), [ready_entry(), earlier])
    assert choice["cause"] == "repeated"
    assert choice["why"] == ("aaaaaaaaaaaa failed before within 3600 s (2 failures, the last "
                             "unhealthy in serving), so the configuration is suspect")
    assert choice["source"] == "fallback"
    assert choice["overrides"] == {"sglang_server_cuda_graph": False}
    # Outside the window, or a trial of an experiment, it is a first failure again.
    for old in (dict(earlier, at=NOW - 5000), dict(earlier, experiment="sweep-1")):
        assert choose(verdict("unhealthy", "serving"), running(),
                      [ready_entry(), old])["source"] == "restart"
    # Another configuration's failure does not count against this one.
    other = dict(earlier, config_hash=ONE_OFF_HASH)
    assert choose(verdict("unhealthy", "serving"), running(),
                  [ready_entry(), other])["source"] == "restart"


def test_a_start_up_failure_takes_the_rules_fix():
    choice = choose(verdict("stalled", "capturing_cuda_graph"),
                    running(GOOD_HASH, INCIDENT, INCIDENT_FACTS), [], INCIDENT, INCIDENT_FACTS)
    assert choice["cause"] == "start_up" and choice["source"] == "rule"
    assert choice["overrides"]["sglang_server_attention_backend"] == "triton"


def test_a_one_off_change_that_hangs_is_reverted_to_the_last_known_good():
    """Issue 12's scenario: the inventory is the known good; `-e` deployed a one-off that
    hung; `recover` without the -e must name the one-off and go back to the known good."""
    choice = choose(verdict("stalled", "capturing_cuda_graph"),
                    running(ONE_OFF_HASH, INCIDENT, INCIDENT_FACTS), [ready_entry()])
    assert choice["source"] == "last_known_good" and choice["config_hash"] == GOOD_HASH
    assert choice["failed_config"] == ONE_OFF_HASH
    assert choice["overrides"] == {}, "the inventory already is the known good"
    assert ("revert to the last known good aaaaaaaaaaaa: the configuration that failed, "
            "bbbbbbbbbbbb, differs from it (2 variables differ: "
            "sglang_server_allow_rules, sglang_server_attention_backend)") in choice["reason"]
    assert "also matches rule flashinfer-mla-sm120-graph-capture-hang" in choice["reason"]
    # Deployed from an inventory that holds the one-off, the revert is spelt out.
    from_one_off = choose(verdict("stalled", "capturing_cuda_graph"),
                          running(ONE_OFF_HASH, INCIDENT, INCIDENT_FACTS), [ready_entry()],
                          INCIDENT, INCIDENT_FACTS)
    assert from_one_off["source"] == "last_known_good"
    assert from_one_off["overrides"] == {"sglang_server_attention_backend": "triton",
                                         "sglang_server_allow_rules": []}


def test_only_the_hash_of_what_ran_is_enough_to_revert():
    choice = choose(verdict("crashed", "loading_weights"), running(ONE_OFF_HASH, None, None),
                    [ready_entry()])
    assert choice["source"] == "last_known_good"
    assert "its settings were not recorded on the node" in choice["reason"]


def test_where_a_server_runs_is_not_a_difference_to_revert():
    moved = dict(BASE, sglang_server_port=30009, sglang_server_root="/srv/x")
    choice = choose(verdict("stalled", "loading_weights"), running(ONE_OFF_HASH, moved),
                    [ready_entry()], moved)
    assert choice["source"] == "fallback"


def test_a_simulated_fault_counts_as_part_of_what_ran():
    faulty = dict(BASE, sglang_server_sim_fault="hang:capturing_cuda_graph")
    good = dict(BASE, sglang_server_sim_fault="")
    choice = choose(verdict("stalled", "capturing_cuda_graph"), running(ONE_OFF_HASH, faulty),
                    [ready_entry(settings=good)], good)
    assert choice["source"] == "last_known_good"
    assert "1 variable differs: sglang_server_sim_fault" in choice["reason"]
    assert choice["overrides"] == {}


def test_faults_of_the_node_or_from_outside_restart_the_same_configuration():
    # The incident's configuration matches a Rule and a fallback waits; a full disk, the OOM
    # killer, a kill -9 or a frozen process are not the configuration's fault all the same.
    settings = dict(BASE, sglang_server_attention_backend="flashinfer",
                    sglang_server_allow_rules=["flashinfer-mla-sm120-graph-capture-hang"])
    chain = [{"sglang_server_cuda_graph": False}]
    ledger = [{"kind": "recovery", "host": "n1", "config_hash": "aaaaaaaaaaaa", "at": 1e12}]
    running = {"config_hash": "aaaaaaaaaaaa", "settings": settings, "facts": INCIDENT_FACTS}
    for cause, said in (("environment", "TP0: OSError: [Errno 28] No space left on device"),
                        ("environment", "the kernel's OOM killer killed pid 4242"),
                        ("external", "killed by SIGKILL from outside SGLang")):
        verdict = {"verdict": "crashed", "phase": "loading_weights", "cause": cause,
                   "failure": {"said": said}}
        choice = choose_next(settings, INCIDENT_FACTS, ledger, "n1", chain, verdict=verdict,
                             running=running, now=1e12 + 60)
        assert choice["source"] == "restart" and choice["overrides"] == {}, choice
        assert choice["cause"] == cause and said in choice["why"]
        assert choice["reason"] == "restart on the same configuration aaaaaaaaaaaa"
    # A configuration fault still goes to the Rule.
    verdict = {"verdict": "stalled", "phase": "capturing_cuda_graph", "cause": "configuration"}
    choice = choose_next(settings, INCIDENT_FACTS, [], "n1", chain, verdict=verdict)
    assert choice["source"] == "rule"


def test_faults_not_the_configurations_never_count_as_failing_before():
    # A kill from outside, a fault of the node or of the GPU earlier within the hour says
    # nothing about the configuration: a second hang after it is that configuration's first.
    for cause in ("external", "environment", "hardware"):
        earlier = {"kind": "recovery", "host": "n1", "config_hash": GOOD_HASH,
                   "at": NOW - 600, "verdict": "crashed", "phase": "serving", "cause": cause}
        choice = choose(verdict("unhealthy", "serving"), running(), [ready_entry(), earlier])
        assert choice["cause"] == "after_ready", (cause, choice)
        assert choice["source"] == "restart" and choice["overrides"] == {}
        # Nor is it a start-up's "failed before": the Rule or fallback comes only from the
        # start-up failure itself, never from counting the outside kill.
        start = choose(verdict("crashed", "loading_weights"), running(),
                       [ready_entry(), earlier])
        assert start["cause"] == "start_up", (cause, start)


def test_a_bind_lost_to_another_program_restarts_the_same_configuration():
    # The EADDRINUSE crash as the gate now judges it: the node's fault, never cuda_graph=False.
    v = {"verdict": "crashed", "phase": "starting_http", "cause": "environment",
         "failure": {"said": "[Errno 98] error while attempting to bind on address "
                             "('127.0.0.1', 30001): address already in use; port 30001 is "
                             "held by 4242 (python3 -m http.server 30001)"}}
    choice = choose(v, running(), [ready_entry()])
    assert choice["source"] == "restart" and choice["overrides"] == {}
    assert "held by 4242" in choice["why"]


# ---- rollbacks on demand and the configurations they reject ---------------------------------

UPGRADED = dict(BASE, sglang_server_version="0.5.23")
BEFORE = dict(BASE, sglang_server_version="0.5.4.post3")


def test_a_rollback_returns_to_the_configuration_ready_before_the_one_running():
    ledger = [ready_entry("aaaa", BEFORE, NOW - 7200), ready_entry("bbbb", UPGRADED, NOW - 60)]
    choice = choose_rollback(UPGRADED, ledger, "n1", running("bbbb", UPGRADED))
    assert choice["source"] == "rollback" and choice["config_hash"] == "aaaa"
    assert choice["overrides"] == {"sglang_server_version": "0.5.4.post3"}
    assert "roll back from bbbb to aaaa" in choice["reason"]
    assert "sglang_server_version differs" in choice["reason"]


def test_a_rollback_with_nothing_ready_before_is_refused_with_the_reason():
    ledger = [ready_entry("bbbb", UPGRADED, NOW - 60)]
    choice = choose_rollback(UPGRADED, ledger, "n1", running("bbbb", UPGRADED))
    assert choice["source"] == "none"
    assert "nothing to roll back to" in choice["reason"]


def test_a_rejected_configuration_is_never_restarted_nor_reverted_to():
    ledger = [ready_entry("aaaa", BEFORE, NOW - 7200), ready_entry("bbbb", UPGRADED, NOW - 600),
              {"kind": "rejected", "host": "n1", "config_hash": "bbbb", "settings": UPGRADED},
              ready_entry("aaaa", BEFORE, NOW - 60)]
    assert set(rejected(ledger, "n1")) == {"bbbb"}
    # The inventory still names the upgrade: a start-up failure reverts, no fallback on it.
    choice = choose(verdict("stalled", "capturing_cuda_graph"), running("aaaa", BEFORE),
                    ledger, settings=UPGRADED)
    assert choice["source"] in ("restart", "last_known_good")
    assert choice["overrides"] == {"sglang_server_version": "0.5.4.post3"}
    crashed = choose(verdict("crashed", "loading_weights"), running("cccc", UPGRADED),
                     ledger, settings=UPGRADED)
    assert crashed["source"] == "last_known_good" and crashed["config_hash"] == "aaaa"
    assert "was rejected by a rollback" in crashed["reason"]
    # A second rollback passes over the rejected one.
    again = choose_rollback(BEFORE, ledger, "n1", running("aaaa", BEFORE))
    assert again["source"] == "none"


def test_a_later_ready_start_of_a_rejected_configuration_lifts_the_rejection():
    ledger = [{"kind": "rejected", "host": "n1", "config_hash": "bbbb", "settings": UPGRADED},
              ready_entry("bbbb", UPGRADED, NOW - 10)]
    assert rejected(ledger, "n1") == {}
    assert rejected(ledger[:1], "n2") == {}
