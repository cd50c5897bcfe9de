"""What SGLang or the model would refuse an hour into a start, refused on the controller before
any node is touched: SGLang's checks after its parser, the model's heads, experts, layers and
weights against the layout and the GPUs, and a server open to the network without a key. The
simulator refuses the same things with SGLang's own message and exit path."""

from __future__ import annotations

import json

import pytest

from sglang_fleet.known.models import gpu_memory_bytes, known_model, known_models
from sglang_fleet.known.sglang_checks import CHECKS_0_5_23
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.node.gpu import modelfit
from sglang_fleet.sim.args.server_args import prepare_server_args
from sglang_fleet.sim.engine.failures import SGLangError
from sglang_fleet.testfleet.local import role_defaults

CHECK = {check.id: check for check in CHECKS_0_5_23}

# The combinations SGLang 0.5.23 refuses after its parser accepted them: the inventory that
# asks for each, the variable the refusal names, and SGLang's own final line.
POST_PARSE = {
    "attn-dp-3-on-tp-8": ({"extra_args": ["--attn-dp-size", "3"]}, "sglang_server_extra_args",
                          "AssertionError at sglang/srt/arg_groups/parallel_hook.py:326: "
                          "assert cfg.tp_size % cfg.attn_dp_size == 0"),
    "dp-attention-3": ({"dp": 3, "tp": 2, "extra_args": ["--enable-dp-attention"],
                        "disable_custom_all_reduce": True, "model_path": "/models/in-house"},
                       "sglang_server_tp", "assert cfg.tp_size % cfg.attn_dp_size == 0"),
    "attn-dp-with-dp": ({"dp": 2, "tp": 4, "extra_args": ["--attn-dp-size", "2"],
                         "model_path": "/models/in-house"}, "sglang_server_dp",
                        "ValueError: --dp-size 2 with --attn-dp-size 2: data-parallel replicas "
                        "combined with attention data parallelism are not supported."),
    "ep-3": ({"ep": 3}, "sglang_server_ep",
             "ValueError: parallel topology is inconsistent (set by override_permanently):; "
             "tp_size == moe_ep_size * moe_dp_size * moe_tp_size;   8 != 3 * 1 * 2 (= 6)"),
    "ep-16-on-tp-8": ({"ep": 16}, "sglang_server_ep", "8 != 16 * 1 * 0 (= 0)"),
    "served-name-colon": ({"served_model_name": "kimi:prod", "deployment_name": "kimi-prod"},
                          "sglang_server_served_model_name",
                          "AssertionError: served_model_name cannot contain a colon (':') "
                          "character."),
    "tokenizer-workers-0": ({"extra_args": ["--tokenizer-worker-num", "0"]},
                            "sglang_server_extra_args",
                            "AssertionError: Tokenizer worker num must >= 1"),
    "padding-and-compile": ({"extra_args": ["--disable-cuda-graph-padding",
                                            "--enable-torch-compile"]},
                            "sglang_server_extra_args",
                            "AssertionError: --disable-cuda-graph-padding is incompatible with "
                            "--enable-torch-compile."),
}


def build(node="node1", members=None, dist=None, **overrides):
    settings = role_defaults()
    settings.update({"sglang_server_attention_backend": "triton"})
    settings.update({"sglang_server_" + k: v for k, v in overrides.items()})
    return build_launch_spec(settings, node, members, dist)


def refusal(result) -> str:
    assert not result["ok"], "expected a refusal"
    return "\n".join(result["errors"])


@pytest.mark.parametrize("case", sorted(POST_PARSE))
def test_each_post_parse_refusal_is_made_on_the_controller_with_sglangs_reason(case):
    overrides, variable, reason = POST_PARSE[case]
    text = refusal(build(**overrides))
    assert f"host node1: {variable}=" in text
    assert "SGLang 0.5.23 refuses it before any worker starts: " in text
    assert reason in text
    assert text.count("\n") == 0, "one refusal per cause (a follow-on check is not repeated)"
    assert ". Fix: " in text


def test_multi_node_refusals_name_the_group_layout():
    members = ["a", "b", "c"]
    tp16 = refusal(build("a", members, "10.0.0.1", tp=16, group="g", gpu_count=8))
    assert "tp x pp = 16 is not divisible by the group's 3 nodes" in tp16
    dp = refusal(build("a", members[:2], "10.0.0.1", tp=8, dp=2, group="g", gpu_count=8))
    assert ("AssertionError: multi-node data-parallel replicas are not supported; use "
            "attention DP (--attn-dp-size) across nodes") in dp
    assert "Fix: set sglang_server_dp: 1 and use --attn-dp-size across the 2 nodes" in dp


# The same refusals as a server meets them: its command line, and SGLang's final line.
SIM_ARGV = {
    "attn-dp-3-on-tp-8": (["--tp-size", "8", "--attn-dp-size", "3"], "AssertionError"),
    "dp-attention-3": (["--tp-size", "2", "--dp-size", "3", "--enable-dp-attention"],
                       "AssertionError"),
    "attn-dp-with-dp": (["--tp-size", "4", "--dp-size", "2", "--attn-dp-size", "2"],
                        POST_PARSE["attn-dp-with-dp"][2]),
    "ep-3": (["--tp-size", "8", "--ep-size", "3"],
             "ValueError: parallel topology is inconsistent (set by override_permanently):\n"
             "tp_size == moe_ep_size * moe_dp_size * moe_tp_size\n  8 != 3 * 1 * 2 (= 6)"),
    "ep-16-on-tp-8": (["--tp-size", "8", "--ep-size", "16"],
                      "ValueError: parallel topology is inconsistent (set by "
                      "override_permanently):\ntp_size == moe_ep_size * moe_dp_size * "
                      "moe_tp_size\n  8 != 16 * 1 * 0 (= 0)"),
    "served-name-colon": (["--tp-size", "8", "--served-model-name", "kimi:prod"],
                          "AssertionError: served_model_name cannot contain a colon (':') "
                          "character. The colon is reserved for the 'model:adapter' syntax "
                          "used in LoRA adapter specification. Invalid value: 'kimi:prod'"),
    "tokenizer-workers-0": (["--tp-size", "8", "--tokenizer-worker-num", "0"],
                            "AssertionError: Tokenizer worker num must >= 1"),
    "padding-and-compile": (["--tp-size", "8", "--disable-cuda-graph-padding",
                             "--enable-torch-compile"],
                            "AssertionError: " + CHECK["graph-padding-vs-compile"].test(
                                {"disable_cuda_graph_padding": True,
                                 "enable_torch_compile": True})),
}


@pytest.mark.parametrize("case", sorted(SIM_ARGV))
def test_the_simulator_refuses_each_with_sglangs_error_and_traceback(case):
    flags, final = SIM_ARGV[case]
    args = prepare_server_args(["--model-path", "/models/x", *flags])
    with pytest.raises(SGLangError) as raised:
        args.resolve_once()
        args.check_server_args()
    error = raised.value
    assert isinstance(error, AssertionError | ValueError)  # what SGLang raises
    assert error.final_line == final
    text = error.traceback_text()
    assert text.startswith("Traceback (most recent call last):\n")
    assert 'sglang/launch_server.py", line 84, in <module>\n    run_server(server_args)' in text
    assert text.endswith(final + "\n")
    assert set(SIM_ARGV) == set(POST_PARSE)


def test_kimi_at_tp_3_is_refused_for_its_heads_and_its_weights_with_the_arithmetic():
    text = refusal(build(tp=3))
    assert ("sglang_server_tp=3: Kimi-K2.5 has 64 attention heads, which TP 3 does not "
            "divide: SGLang fails while loading the model (sglang/srt/models/deepseek_v2.py: "
            "assert num_heads % attn_tp_size == 0)") in text
    assert ("Kimi-K2.5's weights are 553 GiB: over tp x pp = 3 GPUs that is 184.4 GiB per "
            "GPU, more than the 90.8 GiB a 95.6 GiB GPU gives them at 0.95") in text
    assert "Fix: spread the model over at least 7 GPUs" in text
    # TP 4 divides the heads, but four 96 GB GPUs cannot hold the weights either.
    four = refusal(build(tp=4))
    assert "attention heads" not in four and "138.3 GiB per GPU" in four
    # The default fleet's layout fits, with what is left for the KV cache.
    assert build()["ok"]


def test_a_model_the_controller_does_not_know_is_left_to_the_node_check():
    ok = build(tp=3, model_path="/models/our-own-finetune")
    assert ok["ok"], ok["errors"]
    assert "idle: GPUs 3-7" in ok["warnings"][0]


def test_an_explicit_memory_fraction_and_gpu_memory_enter_the_arithmetic():
    text = refusal(build(tp=8, mem_fraction_static=0.5))
    assert "more than the 47.8 GiB a 95.6 GiB GPU gives them at --mem-fraction-static 0.5" \
        in text
    assert build(tp=8, gpu_model="H200")["ok"]
    assert refusal(build(tp=8, gpu_model="some new GPU", gpu_memory_gb=40))


def test_known_models_and_gpus_are_found_by_path_hub_id_and_name():
    assert known_model("/models/Kimi-K2.5").name == "Kimi-K2.5"
    assert known_model("moonshotai/Kimi-K2.5").name == "Kimi-K2.5"
    assert known_model("/data/deepseek-ai/DeepSeek-R1/").name == "DeepSeek-V3"
    assert known_model("/models/unknown") is None
    assert gpu_memory_bytes("NVIDIA H200") == 143771 << 20
    assert gpu_memory_bytes("A100 80GB PCIe") == 81920 << 20
    assert gpu_memory_bytes("mystery") is None
    assert gpu_memory_bytes("mystery", 80) == 80 * 10**9
    for model in known_models().values():
        shape = modelfit.model_shape(model.config_json())
        assert shape == model.shape, model.name


def test_the_node_reads_a_checkpoint_config_json_and_index(tmp_path):
    # Kimi-K2.5's config nests its language model under text_config.
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"num_attention_heads": 64, "num_key_value_heads": 64,
                        "num_hidden_layers": 61, "n_routed_experts": 384,
                        "kv_lora_rank": 512}}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 594 * 10**9}, "weight_map": {}}))
    shape, weights = modelfit.read_model(str(tmp_path))
    assert shape["attention"] == "MLA" and shape["num_attention_heads"] == 64
    assert weights == 594 * 10**9
    layout = {"tp": 8, "pp": 1, "attn_dp": 1, "ep": 5}
    problems = modelfit.layout_problems("m", shape, layout)
    assert [p["variable"] for p in problems] == ["ep"]
    assert "384 routed experts, which EP 5 does not divide" in problems[0]["problem"]
    assert modelfit.layout_problems("m", shape, dict(layout, ep=8, pp=62))[0]["variable"] == "pp"
    # Without the index, the weight files' sizes.
    (tmp_path / "model.safetensors.index.json").unlink()
    (tmp_path / "model-1.safetensors").write_bytes(b"\0" * 1000)
    assert modelfit.read_model(str(tmp_path))[1] == 1000
    assert modelfit.read_model(str(tmp_path / "absent")) is None


def test_key_value_heads_bind_an_mha_model():
    shape = modelfit.model_shape({"num_attention_heads": 64, "num_key_value_heads": 8,
                                  "num_hidden_layers": 80})
    assert shape["attention"] == "MHA"
    assert modelfit.layout_problems("llama", shape, {"tp": 16, "pp": 1}) == []  # 16 % 8 == 0
    six = modelfit.layout_problems("llama", dict(shape, num_attention_heads=48),
                                   {"tp": 6, "pp": 1})
    assert "8 key/value heads: TP 6 neither divides them nor is a multiple of them" in \
        six[0]["problem"]


def test_a_server_open_to_the_network_needs_a_key_or_a_decision():
    text = refusal(build(host="0.0.0.0"))
    assert ("sglang_server_api_key=<empty>: is empty while the server listens on 0.0.0.0 "
            "(sglang_server_host): anyone who reaches the port can use it. Fix: set "
            "sglang_server_api_key") in text
    assert "sglang_server_allow_unauthenticated: true" in text
    assert build(host="0.0.0.0", api_key="k3y-0123456789abcdefXYZ")["ok"]
    assert build(host="0.0.0.0", allow_unauthenticated=True)["ok"]
    assert build(host="127.0.0.2")["ok"] and build(host="::1")["ok"]


def test_every_check_names_its_file_line_statement_and_fix():
    ids = [c.id for c in CHECKS_0_5_23]
    assert len(ids) == len(set(ids))
    for check in CHECKS_0_5_23:
        assert check.source.startswith("sglang/srt/") and check.line > 0 and check.code
        assert check.fix and check.dests
