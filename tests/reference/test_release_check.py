"""The pinned release's own verdict on LaunchSpecs the builder accepts: every case below goes
through build_launch_spec (the toolkit's own checks pass it) and then, all together, through
one run of SGLang 0.5.23's resolution pipeline (release_check.batch_problems, as the
validation play calls it). Each refusal is SGLang's final line, file and line, with the
inventory variables behind it; what could not be checked for lack of a fact is said."""

from __future__ import annotations

import json

import pytest

from sglang_fleet.known import release_check
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.testfleet.local import role_defaults

VERSION = "0.5.23"
IN_HOUSE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}

# case -> (inventory values, host's group members, variables named, SGLang's own words)
CASES = {
    "attn-dp-3-on-tp-8": ({"extra_args": ["--attn-dp-size", "3"]}, None,
                          ["sglang_server_tp", "sglang_server_extra_args"],
                          "AssertionError (sglang/srt/arg_groups/parallel_hook.py:326: "
                          "assert cfg.tp_size % cfg.attn_dp_size == 0)"),
    "dp-attention-3-in-house": ({"dp": 3, "tp": 2, "extra_args": ["--enable-dp-attention"],
                                 "disable_custom_all_reduce": True, "gpu_count": 6,
                                 "model_path": "/models/in-house", "model_family": "MHA",
                                 "model_config": "{config}"}, None,
                                ["sglang_server_tp"], "assert cfg.tp_size % cfg.attn_dp_size"),
    "attn-dp-with-dp": ({"dp": 2, "tp": 4, "extra_args": ["--attn-dp-size", "2"],
                         "model_path": "/models/in-house", "model_family": "MHA",
                         "model_config": "{config}"}, None,
                        ["sglang_server_dp", "sglang_server_extra_args"],
                        "ValueError: --dp-size 2 with --attn-dp-size 2: data-parallel replicas "
                        "combined with attention data parallelism are not supported."),
    "ep-3": ({"ep": 3, "model_path": "/models/in-house", "model_family": "MHA",
              "model_config": "{config}"}, None, ["sglang_server_tp", "sglang_server_ep"],
             "tp_size == moe_ep_size * moe_dp_size * moe_tp_size;   8 != 3 * 1 * 2 (= 6)"),
    "served-name-colon": ({"served_model_name": "kimi:prod", "deployment_name": "kimi-prod"},
                          None, ["sglang_server_served_model_name"],
                          "AssertionError: served_model_name cannot contain a colon"),
    "multi-node-dp": ({"tp": 16, "dp": 2, "gpu_count": 16, "group": "g"}, ["a", "b"],
                      ["sglang_server_dp"], "AssertionError: multi-node data-parallel replicas "
                      "are not supported"),
    "prefill-fake": ({"pd_deployment": "kimi_pd", "disaggregation_mode": "prefill",
                      "disaggregation_transfer_backend": "fake"}, None,
                     ["sglang_server_disaggregation_transfer_backend"],
                     "Prefill server does not support 'fake' as the transfer backend "
                     "(sglang/srt/arg_groups/pd_disaggregation_hook.py:146)"),
}


def build(values: dict, members: list[str] | None) -> dict:
    settings = {**role_defaults(), "sglang_server_attention_backend": "triton",
                **{f"sglang_server_{k}": v for k, v in values.items()}}
    host = members[0] if members else "node1"
    return build_launch_spec(settings, host, members, "10.0.0.1" if members else None)


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    config = tmp_path_factory.mktemp("in-house") / "config.json"
    config.write_text(json.dumps(IN_HOUSE))
    cases, built = {}, {}
    for name, (values, members, _, _) in CASES.items():
        values = {k: str(config) if v == "{config}" else v for k, v in values.items()}
        built[name] = build(values, members)
        assert built[name]["ok"], (name, built[name]["errors"])
        cases[name] = built[name]["release_case"]
    unknown = build({"model_path": "/models/unknown", "model_family": "MHA"}, None)
    cases["unknown-model"] = unknown["release_case"]
    cases["accepted"] = build({}, None)["release_case"]
    return release_check.batch_problems(cases)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_release_refuses_with_its_reason_naming_the_variables(judged, name):
    _, _, variables, words = CASES[name]
    errors = judged[name]["errors"]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"host {name}: {variables[0]}="), errors[0]
    assert f"SGLang {VERSION} refuses the command line in its argument resolution" in errors[0]
    assert words in errors[0], errors[0]
    assert all(v in errors[0] for v in variables)
    assert ". Fix: change " in errors[0]


def test_a_known_model_with_known_gpus_is_checked_whole_and_accepted(judged):
    assert judged["accepted"] == {"errors": [], "notes": []}


def test_a_model_without_config_is_parsed_only_and_says_so(judged):
    assert judged["unknown-model"]["errors"] == []
    (note,) = judged["unknown-model"]["notes"]
    assert "not checked by SGLang 0.5.23 for lack of a fact" in note
    assert "set sglang_server_model_config" in note


def test_a_copy_of_config_json_that_is_not_one_is_refused_by_the_builder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    built = build({"model_path": "/models/in-house", "model_config": str(tmp_path)}, None)
    assert any("sglang_server_model_config=" in e and "has no architectures" in e
               for e in built["errors"]), built["errors"]
