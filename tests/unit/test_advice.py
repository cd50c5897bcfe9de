"""The failure block every tool words a failed host with: verdict, cause, next step, a
matching Rule, the fix and the evidence."""

from __future__ import annotations

from sglang_fleet.node.health.classify import stall_advice
from sglang_fleet.runs.advice import failure_block, operator_stopped

INCIDENT_FACTS = {"attention_backend": "flashinfer", "model_family": "MLA",
                  "compute_capability": "12.0", "interconnect": "pcie", "tp": 8,
                  "custom_all_reduce": True, "cuda_graph": True, "sglang_version": "0.5.23"}
SCHEDULERS = [{"pid": 4100, "cmdline": "sglang::scheduler_TP0"},
              {"pid": 4101, "cmdline": "sglang::scheduler_TP1"},
              {"pid": 4000, "cmdline": "/bin/sh launch.sh"}]


def test_a_stall_says_what_it_waits_on_the_rank_to_dump_the_nccl_variables_and_the_rule():
    advice = stall_advice("capturing_cuda_graph", SCHEDULERS)
    assert advice.startswith("capturing_cuda_graph waits on running and recording each batch "
                             "size on every rank")
    assert "py-spy dump --pid 4100 (and 4101)" in advice
    assert "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL" in advice
    verdict = {"verdict": "stalled", "phase": "capturing_cuda_graph", "cause": "configuration",
               "headline": "stalled in capturing_cuda_graph: no progress for 601 s",
               "advice": advice}
    block = failure_block(verdict, "n1", INCIDENT_FACTS, evidence="/ev/n1/x").splitlines()
    assert block[0] == "n1: stalled in capturing_cuda_graph: no progress for 601 s"
    assert block[1].startswith("Cause: configuration")
    assert block[2] == f"Next: {advice}"
    assert block[3].startswith("Rule flashinfer-mla-sm120-graph-capture-hang matches: ")
    assert block[3].endswith("Fix: set sglang_server_attention_backend='triton'")
    assert block[4].startswith("Fix: recover it (sglang-fleet recover --limit n1, ")
    assert block[5] == "Evidence: /ev/n1/x"


def test_a_stall_of_eight_ranks_names_every_rank_to_dump():
    ranks = [{"pid": 5000 + r, "cmdline": f"sglang::scheduler_TP{r}"} for r in range(8)]
    advice = stall_advice("capturing_cuda_graph", ranks)
    assert "py-spy dump --pid 5000 (and 5001, 5002, 5003, 5004, 5005, 5006, 5007);" in advice


def test_a_fault_of_the_node_says_fix_the_node_and_names_no_rule():
    verdict = {"verdict": "crashed", "phase": "loading_weights", "cause": "environment",
               "headline": "crashed in loading_weights: the kernel's OOM killer killed pid 7"}
    block = failure_block(verdict, "n1", INCIDENT_FACTS)
    assert "Rule " not in block
    assert "Fix: fix the node, then recover it on the same configuration" in block


def test_a_stop_by_stop_yml_passes_and_never_advises_recovery():
    verdict = {"verdict": "stopped", "phase": "serving", "stopped_by": "stop.yml",
               "headline": "stopped: stopped by stop.yml at 2026-01-01 00:00:00 UTC"}
    assert operator_stopped(verdict)
    assert failure_block(verdict, "n1") == ("n1: stopped: stopped by stop.yml at 2026-01-01 "
                                            "00:00:00 UTC")
    outside = dict(verdict, stopped_by="SIGTERM")
    assert not operator_stopped(outside)
    assert "recover" not in failure_block(outside, "n1")


def test_a_simple_verdict_is_one_line_with_its_fix():
    verdict = {"verdict": "absent", "phase": "launching",
               "headline": "absent: no record of this deployment starting"}
    assert failure_block(verdict, "n1") == (
        "n1: absent: no record of this deployment starting. Fix: deploy it (sglang-fleet "
        "deploy --limit n1, or ansible-playbook deploy.yml --limit n1)")
