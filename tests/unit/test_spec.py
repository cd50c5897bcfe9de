"""LaunchSpec building and every validation the inventory can fail."""

from __future__ import annotations

import json

import pytest

from sglang_fleet.launch.spec import (
    build_launch_spec,
    group_consistency_errors,
    launch_refusals,
)
from sglang_fleet.testfleet.local import role_defaults


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
    env = spec["install"]["env"]
    assert env["path"] == f"/opt/sglang-fleet/envs/{env['id']}"
    assert argv[:3] == [f"{env['path']}/bin/python", "-m", "sglang.launch_server"]
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


def test_a_release_older_than_the_builder_knows_is_refused_without_fetching_anything():
    only_error(build(version="0.4.0"), "sglang_server_version='0.4.0'",
               "not supported: releases before 0.5.4.post3", "release add 0.4.0")
    only_error(build(version="latest"), "'latest' is not a release number")


def test_attention_backend_checked_against_pinned_release_with_did_you_mean():
    text = only_error(build(attention_backend="flashinfr", model_family="MHA"),
                      "host node1", "sglang_server_attention_backend='flashinfr'",
                      "did you mean 'flashinfer'")
    assert "0.5.23" in text
    # On SM120 with an MLA model a Rule refuses flashinfer: the suggestion says so.
    text = only_error(build(attention_backend="flashinfr"),
                      "'flashinfer' is the closest, but rule "
                      "flashinfer-mla-sm120-graph-capture-hang refuses it on this hardware",
                      "set sglang_server_attention_backend: 'triton'")
    assert "did you mean" not in text
    # cutlass_mla existed in 0.5.4 and is gone in 0.5.23
    only_error(build(attention_backend="cutlass_mla"),
               "not one of SGLang 0.5.23's choices for --attention-backend")
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
               "--tp-size sets SGLang's tp_size, which the toolkit renders from "
               "sglang_server_tp", "set sglang_server_tp instead")
    # An alias cannot slip past: it resolves to the same option.
    only_error(build(attention_backend="triton", extra_args=["--tensor-parallel-size", "4"]),
               "--tensor-parallel-size sets SGLang's tp_size", "set sglang_server_tp instead")


def test_parallel_sizes_against_gpus():
    only_error(build(attention_backend="triton", tp=16),
               "sglang_server_tp=16", "needs 16 GPUs per node", "sglang_server_gpu_count is 8")
    only_error(build(attention_backend="triton", tp=4, dp=4), "tp x pp x dp = 16")
    # Fewer GPUs than the node has is allowed, and the idle ones are named (a model the
    # controller does not know: Kimi-K2.5 itself does not fit on four 96 GB GPUs).
    ok = build(attention_backend="triton", tp=4, model_path="/models/in-house-moe")
    assert ok["ok"] and "uses 4 of 8 GPUs per node; idle: GPUs 4-7" in ok["warnings"][0]


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
    ("env_keep", 0, "out of range"),
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
    result = build(attention_backend="triton", api_key="sk-very-secret-0123456789",
                   hf_token="hf_tok_123")
    blob = json.dumps(result)
    assert "sk-very-secret" not in blob and "hf_tok_123" not in blob
    spec = result["spec"]
    assert ["--api-key", "SGLANG_FLEET_API_KEY"] in spec["config_options"]
    assert spec["secret_env_names"] == ["SGLANG_FLEET_API_KEY", "HF_TOKEN"]
    assert "********" in spec["server_args"]
    # The key changes what runs, not the configuration's name.
    assert spec["config_hash"] == build(attention_backend="triton",
                                        api_key="another-key-0123456789",
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
                                     host="192.0.2.12", allow_unauthenticated=True),
                            "a02", members, "192.0.2.11")["spec"]
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


# ---- settings table and catalogue (real SGLang as the reference) ------------------------

def test_unknown_sglang_server_variable_is_refused_with_did_you_mean():
    s = settings(attention_backend="triton")
    s["sglang_server_attention_backnd"] = "flashinfer"
    text = only_error(build_launch_spec(s, "node1"),
                      "sglang_server_attention_backnd='flashinfer'",
                      "is not a setting of the sglang_server role",
                      "did you mean sglang_server_attention_backend?")
    assert text.count("host node1") == 1


def test_overrides_win_and_are_checked():
    result = build(attention_backend="flashinfer",
                   overrides={"sglang_server_attention_backend": "triton"})
    assert result["ok"], result["errors"]
    argv = result["spec"]["argv"]
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    assert result["spec"]["settings"]["sglang_server_attention_backend"] == "triton"
    only_error(build(attention_backend="triton", overrides={"sglang_server_tpp": 4}),
               "sglang_server_tpp=4", "(inside sglang_server_overrides)",
               "did you mean sglang_server_tp?")


def test_a_secret_has_one_way_in():
    secret = "an-overridden-secret-key-0123"
    result = build(attention_backend="triton",
                   overrides={"sglang_server_api_key": secret})
    text = only_error(result, "sglang_server_overrides", "carries the secret "
                      "sglang_server_api_key", "set sglang_server_api_key itself")
    assert secret not in json.dumps(result)
    text = only_error(build(attention_backend="triton",
                            extra_args=["--api-key", secret]),
                      "--api-key sets SGLang's api_key", "set sglang_server_api_key instead")
    assert secret not in text
    only_error(build(attention_backend="triton", extra_env={"HF_TOKEN": "hf_abc"}),
               "HF_TOKEN looks like a secret", "sglang_server_hf_token")
    only_error(build(attention_backend="triton", extra_env={"MY_SERVICE_TOKEN": "x"}),
               "looks like a secret")


@pytest.mark.parametrize("key,needle", [
    ("short-key", "9 characters long: too short"),
    ("a key with spaces in it", "bearer token cannot carry"),
    ("aaaaaaaaaaaaaaaaaaaaaaa", "too common"),
    ("fraction-static", "15 characters"),
    ("mem-fraction-static", "too common"),
])
def test_api_keys_that_cannot_be_masked_safely_are_refused(key, needle):
    result = build(attention_backend="triton", api_key=key)
    text = only_error(result, "sglang_server_api_key=<secret>", needle, "openssl rand")
    assert key not in text


def test_catalogue_choices_for_enumerated_settings():
    only_error(build(attention_backend="triton", kv_cache_dtype="fp9"),
               "sglang_server_kv_cache_dtype='fp9'",
               "is not one of SGLang 0.5.23's choices for --kv-cache-dtype", "fp8_e4m3")
    only_error(build(attention_backend="triton", quantization="fp9"),
               "choices for --quantization", "did you mean 'fp8'?")
    assert build(attention_backend="triton", quantization="fp8", kv_cache_dtype="fp8_e4m3")["ok"]


@pytest.mark.parametrize("extra,needles", [
    (["--atention-backend", "flashinfer"], ["is not an option of SGLang 0.5.23",
                                            "did you mean --attention-backend"]),
    (["--context-len", "32k"], ["abbreviation of --context-length", "write the full flag"]),
    (["--ep", "8"], ["--ep sets SGLang's ep_size", "set sglang_server_ep instead"]),
    (["--cuda-graph-max-bs-decode", "64"], ["sglang_server_cuda_graph_max_bs"]),
    (["--disable-prefill-cuda-graph"], ["sglang_server_cuda_graph instead"]),
    (["--load-format", "tensors"], ["'tensors' is not a choice of --load-format"]),
    (["--watchdog-timeout", "soon"], ["not a valid value for --watchdog-timeout"]),
])
def test_extra_args_are_checked_token_by_token(extra, needles):
    text = only_error(build(attention_backend="triton", extra_args=extra), *needles)
    assert "sglang_server_extra_args" in text


def test_extra_args_sglang_accepts_pass_with_deprecations_warned():
    ok = build(attention_backend="triton", extra_args=["--context-length", "32k",
                                                       "--enable-dp-attention"])
    assert ok["ok"], ok["errors"]
    assert any("--enable-dp-attention is deprecated" in w for w in ok["warnings"])


def test_cuda_graph_false_disables_every_capture_of_the_release():
    argv = build(attention_backend="triton", cuda_graph=False)["spec"]["argv"]
    assert argv[argv.index("--cuda-graph-backend-decode") + 1] == "disabled"
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    old = build(attention_backend="triton", cuda_graph=False, version="0.5.4.post3")
    assert "--disable-cuda-graph" in old["spec"]["argv"]


@pytest.mark.parametrize("cc,family,backend", [
    ("12.0", "MLA", "triton"), ("9.0", "MLA", "fa3"), ("10.0", "MLA", "trtllm_mla"),
    ("12.0", "MHA", "flashinfer"), ("10.0", "MHA", "trtllm_mha"), ("9.0", "MHA", "fa3"),
])
def test_unset_backend_is_sglangs_default_for_the_gpu(cc, family, backend):
    result = build(gpu_compute_capability=cc, model_family=family)
    assert result["ok"], result["errors"]
    assert result["spec"]["facts"]["attention_backend"] == backend
    assert "--attention-backend" not in result["spec"]["argv"]


def test_rules_match_the_default_backend_that_will_run():
    # A DeepSeek-V3-family model on B200 gets trtllm_mla by default (SGLang's override), and
    # an MHA model on SM120 gets flashinfer: a Rule on those backends must see them.
    assert build(gpu_compute_capability="10.0")["spec"]["facts"]["attention_backend"] == \
        "trtllm_mla"
    assert build(model_family="MHA")["spec"]["facts"]["attention_backend"] == "flashinfer"


def test_huge_and_self_referencing_values_are_described_not_rendered():
    import time

    huge = "m" * 1_000_000
    text = only_error(build(attention_backend="triton", served_model_name=huge),
                      "sglang_server_served_model_name=", "1000000 characters long")
    assert len(text) < 1000
    bomb: list = ["x"]
    for _ in range(40):  # what a YAML alias bomb becomes: 2**40 strings, a few objects
        bomb = [bomb, bomb]
    started = time.monotonic()
    text = only_error(build(attention_backend="triton", extra_args=bomb,
                            nccl_profile={"NCCL_P2P_LEVEL": bomb}),
                      "sglang_server_extra_args=", "must be a list of strings")
    assert time.monotonic() - started < 1.0 and len(text) < 2000


def test_a_derived_name_error_names_the_variable_the_operator_set():
    text = only_error(build(attention_backend="triton", served_model_name="my model!"),
                      "sglang_server_served_model_name='my model!'",
                      "set sglang_server_deployment_name explicitly")
    assert "sglang_server_deployment_name=" not in text


def test_pipeline_parallel_counts_gpus():
    only_error(build(attention_backend="triton", pp=2), "tp x pp x dp = 16")
    ok = build(attention_backend="triton", tp=4, pp=2)
    assert ok["ok"], ok["errors"]
    assert "--pp-size" in ok["spec"]["argv"]


def test_group_check_names_members_not_built_yet():
    members = ["a01", "a02"]
    a = _group("a01", members)["spec"]
    errors = group_consistency_errors({"a01": a, "a02": None})
    assert "hosts a02 have no LaunchSpec yet" in errors[0] and "linear strategy" in errors[0]
    # Single-node servers are never held up by it.
    assert group_consistency_errors({"n1": build(attention_backend="triton")["spec"],
                                     "n2": None}) == []


def test_one_refusal_per_host_its_own_errors_first_then_its_groups():
    """spec.yml's one assert: a host refused on its own says only that; a valid member is
    held to the members that built, not to one refused on its own (which says why itself),
    and a member not built yet is named."""
    members = ["a01", "a02", "a03", "a04"]
    a = _group("a01", members)
    b = _group("a02", members, node_rank=0)  # the same rank as a01
    assert a["ok"] and b["ok"], a["errors"] + b["errors"]
    refused = {"ok": False, "errors": ["host a03: sglang_server_tp=3: ..."], "warnings": []}
    verdict = {h: {"ok": r["ok"]} for h, r in (("a01", a), ("a02", b))}
    assert launch_refusals(refused, {}, {}) == refused["errors"]
    errors = launch_refusals(a, {**verdict, "a03": refused},
                             {"a01": a["spec"], "a02": b["spec"], "a03": None})
    assert len(errors) == 1 and "both have node rank 0" in errors[0]
    c = _group("a02", members)
    assert launch_refusals(a, {"a01": {"ok": True}, "a02": {"ok": True}, "a03": refused},
                           {"a01": a["spec"], "a02": c["spec"], "a03": None}) == []
    unbuilt = launch_refusals(a, {"a01": {"ok": True}},
                              {"a01": a["spec"], "a02": c["spec"], "a03": None})
    assert "hosts a03 have no LaunchSpec yet" in unbuilt[0]


@pytest.mark.parametrize("host", ["../../etc", "a/b", "..", "."])
def test_a_host_name_that_is_not_one_folder_name_is_refused(host):
    """The controller keeps recovery evidence in evidence/<host>/: a host named `../x` put it
    outside the evidence folder. Deploy, recover and stop (identity only) refuse the name."""
    from sglang_fleet.launch.spec import build_identity
    for result in (build(host=host), build_identity(settings(), host)):
        only_error(result, f"host {host}: inventory_hostname='{host}'",
                   "is not usable as a folder name", "Fix: rename the host")
    assert build(host="sim-node-1.example:2")["ok"]
