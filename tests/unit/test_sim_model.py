"""The simulator's model of SGLang 0.5.23: process titles, capture plans, loader choice.

Arguments are plain namespaces with SGLang's dest names, as any parser produces them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_fleet.sim.engine.graphs import (
    backends,
    capture_plan,
    decode_sizes,
    memory_defaults,
    prefill_sizes,
)
from sglang_fleet.sim.engine.runtime import FAULT_KINDS, parse_faults
from sglang_fleet.sim.engine.scheduler import loads_multithreaded
from sglang_fleet.sim.engine.topology import Topology

RTX_PRO_6000_MIB = 95.59 * 1024


def args(**over):
    base = dict(tp_size=8, dp_size=1, pp_size=1, ep_size=1, nnodes=1, node_rank=0,
                base_gpu_id=0, disable_cuda_graph=False)
    return SimpleNamespace(**{**base, **over})


def titles(**over):
    topo = Topology.from_args(args(**over))
    return [(r.title, r.prefix, r.gpu_id) for r in topo.all_schedulers()]


def test_scheduler_titles_and_prefixes_as_configure_scheduler_process_builds_them():
    assert titles(tp_size=1) == [("sglang::scheduler", "", 0)]
    assert [t for t, _, _ in titles()] == [f"sglang::scheduler_TP{i}" for i in range(8)]
    assert titles(tp_size=2, dp_size=2) == [
        ("sglang::scheduler_DP0_TP0", " DP0 TP0", 0), ("sglang::scheduler_DP0_TP1", " DP0 TP1", 1),
        ("sglang::scheduler_DP1_TP0", " DP1 TP0", 2), ("sglang::scheduler_DP1_TP1", " DP1 TP1", 3)]
    assert titles(tp_size=2, pp_size=2, ep_size=2) == [
        ("sglang::scheduler_PP0_TP0_EP0", " PP0 TP0 EP0", 0),
        ("sglang::scheduler_PP0_TP1_EP1", " PP0 TP1 EP1", 1),
        ("sglang::scheduler_PP1_TP0_EP0", " PP1 TP0 EP0", 2),
        ("sglang::scheduler_PP1_TP1_EP1", " PP1 TP1 EP1", 3)]
    # EP rank = TP rank // (tp / ep): TP=8 with EP=2 puts TP0-3 on EP0 and TP4-7 on EP1.
    assert [p for _, p, _ in titles(ep_size=2)][3:5] == [" TP3 EP0", " TP4 EP1"]


def test_multi_node_ranks_and_gpus():
    rank1 = titles(tp_size=16, nnodes=2, node_rank=1)
    assert [t for t, _, _ in rank1] == [f"sglang::scheduler_TP{i}" for i in range(8, 16)]
    assert [g for _, _, g in rank1] == list(range(8))
    # PP across nodes: node 1 holds PP stage 1 of a pp=2 x tp=8 server.
    assert {p.split()[0] for _, p, _ in titles(pp_size=2, nnodes=2, node_rank=1)} == {"PP1"}


def test_data_parallel_controller_and_attention_dp():
    assert Topology.from_args(args(dp_size=2)).uses_dp_controller
    assert not Topology.from_args(args()).uses_dp_controller
    attn = Topology.from_args(args(tp_size=4, dp_size=2, enable_dp_attention=True))
    assert attn.attention_dp and attn.dp_replicas == 1
    assert [r.prefix for r in attn.all_schedulers()] == [" DP0 TP0", " DP0 TP1", " DP1 TP2",
                                                         " DP1 TP3"]


def test_capture_sizes_match_sglangs_generators():
    sizes = decode_sizes(512)
    assert sizes[:7] == [1, 2, 4, 8, 12, 16, 24] and sizes[-3:] == [480, 496, 512]
    assert len(sizes) == 52
    assert decode_sizes(160)[-1] == 160 and decode_sizes(100)[-2:] == [96, 100]
    assert prefill_sizes(8192)[:9] == [4, 8, 12, 16, 20, 24, 28, 32, 48]
    assert len(prefill_sizes(8192)) == 58 and prefill_sizes(8192)[-1] == 8192
    assert memory_defaults(RTX_PRO_6000_MIB, 8) == (8192, 512)
    assert memory_defaults(RTX_PRO_6000_MIB, 2) == (8192, 256)
    assert memory_defaults(179 * 1024, 8) == (16384, 512)  # B200
    assert memory_defaults(32 * 1024, 8) == (4096, 160)  # RTX 5090


@pytest.mark.parametrize("over, expected", [
    ({}, ("full", "breakable", False)),
    ({"disable_cuda_graph": True}, ("disabled", "disabled", True)),
    ({"disable_decode_cuda_graph": True}, ("disabled", "breakable", False)),
    ({"cuda_graph_backend_decode": "disabled"}, ("disabled", "breakable", False)),
    ({"disable_prefill_cuda_graph": True}, ("full", "disabled", True)),
    # the per-phase selector wins over the legacy switch, the JSON config over both
    ({"disable_cuda_graph": True, "cuda_graph_backend_prefill": "breakable"},
     ("disabled", "breakable", True)),
    ({"cuda_graph_config": '{"decode": {"backend": "breakable"}}'}, ("breakable", "breakable",
                                                                     False)),
])
def test_graph_backends_follow_parse_cuda_graph_config(over, expected):
    assert backends(args(**over)) == expected


def test_prefill_capture_defaults_off_for_pp_and_deepseek_trtllm_mla():
    plan = capture_plan(args(pp_size=2), RTX_PRO_6000_MIB, "DeepseekV3ForCausalLM", True,
                        "triton")
    assert not plan.prefill and plan.decode and "pipeline parallelism" in plan.prefill_note
    opt_in = capture_plan(args(pp_size=2, cuda_graph_backend_prefill="breakable"),
                          RTX_PRO_6000_MIB, "DeepseekV3ForCausalLM", True, "triton")
    assert opt_in.prefill and opt_in.prefill_note is None
    mla = capture_plan(args(), 179 * 1024, "DeepseekV3ForCausalLM", True, "trtllm_mla")
    assert not mla.prefill and "trtllm_mla" in mla.prefill_note
    plan = capture_plan(args(cuda_graph_max_bs_decode=16), RTX_PRO_6000_MIB,
                        "LlamaForCausalLM", False, "flashinfer")
    assert plan.decode_sizes == [1, 2, 4, 8, 12, 16] and plan.prefill_sizes[-1] == 8192


def test_shard_loader_choice_as_default_model_loader():
    assert loads_multithreaded(args(model_loader_extra_config="{}"))
    assert not loads_multithreaded(
        args(model_loader_extra_config='{"enable_multithread_load": false}'))
    assert not loads_multithreaded(args(model_loader_extra_config="{}",
                                        weight_loader_prefetch_checkpoints=True))
    assert loads_multithreaded(args(model_loader_extra_config='{"num_threads": 4}',
                                    weight_loader_prefetch_checkpoints=True))


def test_fault_spellings_are_checked_with_the_fix():
    faults = parse_faults("nccl_timeout,crash:loading_weights,xid43")
    assert [(f.kind, f.phase) for f in faults] == [
        ("nccl_timeout", "serving"), ("crash", "loading_weights"),
        ("xid", "capturing_cuda_graph")]
    assert faults[2].xid == 43
    with pytest.raises(ValueError, match="unknown fault 'nccl_timout'"):
        parse_faults("nccl_timout")
    with pytest.raises(ValueError, match="prefill_oom cannot strike in phase 'launching'; "
                                         "give one of: serving"):
        parse_faults("prefill_oom:launching")
    assert "not_enough_memory" in FAULT_KINDS
