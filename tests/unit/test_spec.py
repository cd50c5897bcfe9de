"""LaunchSpec building and every validation the inventory can fail."""

from __future__ import annotations

import json

import pytest

from helpers import role_defaults
from sglang_fleet.spec import build_launch_spec, group_consistency_errors


def settings(**overrides):
    base = role_defaults()
    for key, value in overrides.items():
        base["sglang_server_" + key] = value
    return base


def build(host="node1", **overrides):
    return build_launch_spec(settings(**overrides), host)


def only_error(result, *needles):
    assert not result["ok"], "expected a validation error"
    text = "\n".join(result["errors"])
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{text}"
    return text


def test_defaults_build_the_incident_configuration():
    result = build(attention_backend="triton")
    assert result["ok"], result["errors"]
    spec = result["spec"]
    argv = spec["argv"]
    assert argv[:3] == ["/opt/sglang-fleet/venv/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--tp-size") + 1] == "8"
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    assert spec["env"]["SGLANG_FLEET_DEPLOYMENT"] == "node1:Kimi-K2.5-30000"
    assert spec["group"]["serves_http"] is True
    assert spec["http"]["url"] == "http://127.0.0.1:30000"


def test_hash_is_stable_and_names_one_variable_change():
    a = build(attention_backend="triton")["spec"]["config_hash"]
    b = build(attention_backend="triton")["spec"]["config_hash"]
    c = build(attention_backend="triton", num_continuous_decode_steps=4)["spec"]["config_hash"]
    assert a == b != c


def test_unknown_version_names_the_known_ones():
    only_error(build(version="0.9.99"), "sglang_server_version='0.9.99'", "0.5.23")


def test_attention_backend_checked_against_pinned_release_with_did_you_mean():
    text = only_error(build(attention_backend="flashinfr"),
                      "host node1", "sglang_server_attention_backend='flashinfr'",
                      "did you mean 'flashinfer'")
    assert "0.5.23" in text
    # cutlass_mla existed in 0.5.4 and is gone in 0.5.23
    only_error(build(attention_backend="cutlass_mla"), "not an attention backend of SGLang 0.5.23")
    assert build(attention_backend="cutlass_mla", version="0.5.4.post3")["ok"]


def test_removed_flag_in_extra_args_names_its_replacement():
    only_error(build(attention_backend="triton", extra_args=["--cuda-graph-max-bs", "64"]),
               "--cuda-graph-max-bs was removed in SGLang 0.5.23", "--cuda-graph-max-bs-decode")


def test_cuda_graph_max_bs_renders_the_pinned_release_flag():
    new = build(attention_backend="triton", cuda_graph_max_bs=64)["spec"]["argv"]
    old = build(attention_backend="triton", cuda_graph_max_bs=64,
                version="0.5.4.post3")["spec"]["argv"]
    assert "--cuda-graph-max-bs-decode" in new and "--cuda-graph-max-bs" not in new
    assert "--cuda-graph-max-bs" in old


def test_disabled_cuda_graph_uses_the_release_spelling():
    argv = build(attention_backend="triton", cuda_graph=False)["spec"]["argv"]
    assert argv[argv.index("--cuda-graph-backend-decode") + 1] == "disabled"


def test_flag_rendered_by_the_toolkit_is_refused_in_extra_args():
    only_error(build(attention_backend="triton", extra_args=["--tp-size=4"]),
               "--tp-size is rendered by the toolkit", "set sglang_server_tp instead")


def test_parallel_sizes_against_gpus():
    only_error(build(attention_backend="triton", tp=16),
               "sglang_server_tp=16", "needs 16 GPUs per node", "sglang_server_gpu_count is 8")
    only_error(build(attention_backend="triton", tp=4, dp=4), "tp x dp = 16")
    ok = build(attention_backend="triton", tp=4)
    assert ok["ok"] and "uses 4 of 8 GPUs" in ok["warnings"][0]


def test_unknown_nccl_variable_gets_did_you_mean():
    only_error(build(attention_backend="triton", nccl_profile={"NCCL_P2P_LEVL": "SYS"}),
               "NCCL_P2P_LEVL is not a known NCCL variable", "did you mean NCCL_P2P_LEVEL?")
    only_error(build(attention_backend="triton", nccl_profile={"P2P_LEVEL": "SYS"}),
               "not an NCCL variable")
    ok = build(attention_backend="triton", nccl_profile={"NCCL_P2P_LEVEL": "SYS",
                                                          "NCCL_IB_DISABLE": True})
    assert ok["spec"]["env"]["NCCL_P2P_LEVEL"] == "SYS"
    assert ok["spec"]["env"]["NCCL_IB_DISABLE"] == "1"


def test_extra_env_names_are_checked():
    only_error(build(attention_backend="triton", extra_env={"bad-name": 1}), "'bad-name'")
    only_error(build(attention_backend="triton", extra_env={"SGLANG_FLEET_DEPLOYMENT": "x"}),
               "reserved")
    only_error(build(attention_backend="triton", extra_env={"NCCL_DEBUG": "INFO"}),
               "belongs in the NCCL profile")


@pytest.mark.parametrize("name,value,needle", [
    ("port", 70000, "out of range"),
    ("port", "http", "must be an integer"),
    ("tp", True, "must be an integer"),
    ("mem_fraction_static", 1.5, "between 0 and 1"),
    ("model_family", "GQA", "use one of: MLA, MHA"),
    ("install_mode", "conda", "use one of: pip, existing, simulator"),
    ("service_manager", "runit", "use one of"),
    ("root", "relative/path", "absolute path"),
    ("deployment_name", "bad name!", "1-63 characters"),
    ("model_path", "", "is required"),
    ("model_path", "/models/x\nrm -rf /", "newline"),
    ("extra_args", "--log-level debug", "list of strings"),
    ("trust_remote_code", "maybe", "boolean"),
])
def test_bad_values_name_variable_value_and_fix(name, value, needle):
    text = only_error(build(attention_backend="triton", **{name: value}), needle)
    assert f"sglang_server_{name}=" in text and "Fix:" in text and "host node1" in text


def test_strings_from_extra_vars_are_accepted_like_ansible_does():
    result = build(attention_backend="triton", tp="8", port="30005", cuda_graph="false",
                   mem_fraction_static="0.85")
    assert result["ok"], result["errors"]
    assert "--mem-fraction-static" in result["spec"]["argv"]


def test_every_error_is_reported_at_once():
    result = build(attention_backend="nope", tp=99, port=0,
                   nccl_profile={"NCCL_P2P_LEVL": 1})
    assert len(result["errors"]) >= 4


def test_rule_refuses_the_incident_configuration_and_names_the_fix():
    text = only_error(build(attention_backend="flashinfer"),
                      "flashinfer-mla-sm120-graph-capture-hang",
                      "set sglang_server_attention_backend: 'triton'",
                      "sglang_server_allow_rules: [flashinfer-mla-sm120-graph-capture-hang]")
    assert "CUDA graph capture" in text


def test_rule_override_deploys_with_a_warning():
    result = build(attention_backend="flashinfer",
                   allow_rules=["flashinfer-mla-sm120-graph-capture-hang"])
    assert result["ok"]
    assert "deploying despite flashinfer-mla-sm120-graph-capture-hang" in result["warnings"][0]


def test_rule_does_not_fire_off_its_hardware():
    assert build(attention_backend="flashinfer", gpu_compute_capability="9.0")["ok"]
    assert build(attention_backend="flashinfer", model_family="MHA")["ok"]
    assert build(attention_backend="flashinfer", cuda_graph=False)["ok"]


def test_trtllm_mla_on_sm120_is_refused():
    only_error(build(attention_backend="trtllm_mla"), "trtllm-mla-sm120-prefill-unsupported")


def test_secrets_never_enter_the_spec():
    result = build(attention_backend="triton", api_key="sk-very-secret", hf_token="hf_tok_123")
    blob = json.dumps(result)
    assert "sk-very-secret" not in blob and "hf_tok_123" not in blob
    spec = result["spec"]
    assert {"env": "SGLANG_FLEET_API_KEY"} in spec["argv"]
    assert spec["secret_env_names"] == ["SGLANG_FLEET_API_KEY", "HF_TOKEN"]
    assert "********" in spec["server_args"]
    # The key changes what runs, not the configuration's name.
    assert spec["config_hash"] == build(attention_backend="triton", api_key="other",
                                        hf_token="x")["spec"]["config_hash"]


def _group(host, members, **over):
    return build_launch_spec(settings(attention_backend="triton", tp=16, group="g", **over),
                             host, members, "192.0.2.11")


def test_multi_node_ranks_and_address_come_from_the_group():
    members = ["a01", "a02"]
    a, b = (_group(h, members)["spec"] for h in members)
    assert (a["group"]["node_rank"], b["group"]["node_rank"]) == (0, 1)
    assert a["group"]["serves_http"] and not b["group"]["serves_http"]
    assert b["argv"][b["argv"].index("--dist-init-addr") + 1] == "192.0.2.11:20000"
    assert group_consistency_errors({"a01": a, "a02": b}) == []
    # Each node listens on its own address; that is not a disagreement.
    own = build_launch_spec(settings(attention_backend="triton", tp=16, group="g",
                                     host="192.0.2.12"), "a02", members, "192.0.2.11")["spec"]
    assert own["argv"][own["argv"].index("--host") + 1] == "192.0.2.12"
    assert group_consistency_errors({"a01": a, "a02": own}) == []


def test_multi_node_inconsistencies_are_reported():
    members = ["a01", "a02"]
    a = _group("a01", members)["spec"]
    b = _group("a02", members, node_rank=0)["spec"]
    text = "\n".join(group_consistency_errors({"a01": a, "a02": b}))
    assert "both have node rank 0" in text
    c = _group("a02", members, num_continuous_decode_steps=4)["spec"]
    assert "render different server arguments" in group_consistency_errors(
        {"a01": a, "a02": c})[0]
    d = build_launch_spec(settings(attention_backend="triton", tp=16, group="g"), "a02",
                          members, "192.0.2.99")["spec"]
    assert "disagree on the dist-init address" in group_consistency_errors(
        {"a01": a, "a02": d})[0]


def test_multi_node_needs_divisible_tp_and_an_address():
    only_error(build_launch_spec(settings(attention_backend="triton", tp=16, group="g"), "a01",
                                 ["a01", "a02", "a03"], "h"),
               "not divisible by the group's 3")
    only_error(build_launch_spec(settings(attention_backend="triton", tp=16, group="g"), "a01",
                                 ["a01", "a02"], None), "no address for the group's rank 0")
    only_error(build_launch_spec(settings(attention_backend="triton", group="g"), "zz",
                                 ["a01"], "h"), "not a member of inventory group")
