"""Malformed inventories, table-driven: each gives a clear error naming the variable, the value
and the fix, before any node is touched. One deploy validates every case at once (one host per
case), as an operator's fleet-wide typo would be reported."""

from __future__ import annotations

import json

import pytest
import yaml

from sglang_fleet.testfleet.local import make_fleet, sglang_fleet

pytestmark = pytest.mark.integration

# host var overrides -> (variable named in the error, words of the problem or fix)
CASES = {
    "tp-as-word": ({"sglang_server_tp": "eight"}, "sglang_server_tp", "must be an integer"),
    "tp-huge": ({"sglang_server_tp": 10**12}, "sglang_server_tp", "out of range 1..1024"),
    "port-huge": ({"sglang_server_port": 70000}, "sglang_server_port", "out of range 1..65535"),
    "gpu-count-float": ({"sglang_server_gpu_count": 8.5}, "sglang_server_gpu_count",
                        "must be an integer"),
    "mem-fraction-text": ({"sglang_server_mem_fraction_static": "lots"},
                          "sglang_server_mem_fraction_static", "between 0 and 1"),
    "bool-maybe": ({"sglang_server_cuda_graph": "maybe"}, "sglang_server_cuda_graph",
                   "must be a boolean"),
    "nccl-as-string": ({"sglang_server_nccl_profile": "NCCL_P2P_LEVEL=SYS"},
                       "sglang_server_nccl_profile", "must be a mapping"),
    "nccl-shell": ({"sglang_server_nccl_profile": {"NCCL_P2P_LEVEL": "SYS; reboot"}},
                   "sglang_server_nccl_profile", "is not a plain NCCL value"),
    "nccl-unicode": ({"sglang_server_nccl_profile": {"NCCL_PROTO": "LL\u2192"}},
                     "sglang_server_nccl_profile", "is not a plain NCCL value"),
    "nccl-typo": ({"sglang_server_nccl_profile": {"NCCL_P2P_LEVL": "SYS"}},
                  "sglang_server_nccl_profile", "did you mean NCCL_P2P_LEVEL"),
    "extra-args-string": ({"sglang_server_extra_args": "--log-level debug"},
                          "sglang_server_extra_args", "must be a list of strings"),
    "env-name-space": ({"sglang_server_extra_env": {"BAD NAME": 1}}, "sglang_server_extra_env",
                       "not a usable environment variable name"),
    "name-unicode": ({"sglang_server_served_model_name": "Kimi-K2.5-\u6a21\u578b"},
                     "sglang_server_served_model_name", "letters, digits"),
    "name-shell": ({"sglang_server_deployment_name": "kimi;reboot"},
                   "sglang_server_deployment_name", "letters, digits"),
    "name-traversal": ({"sglang_server_deployment_name": "../../etc"},
                       "sglang_server_deployment_name", "letters, digits"),
    "name-huge": ({"sglang_server_served_model_name": "x" * 100000},
                  "sglang_server_served_model_name", "100000 characters long, the limit"),
    "model-path-newline": ({"sglang_server_model_path": "/models/kimi\n--api-key x"},
                           "sglang_server_model_path", "newline or NUL"),
    "root-relative": ({"sglang_server_root": "opt/x"}, "sglang_server_root",
                      "must be an absolute path"),
    "backend-typo": ({"sglang_server_attention_backend": "flashinfer2"},
                     "sglang_server_attention_backend",
                     "rule flashinfer-mla-sm120-graph-capture-hang refuses it on this hardware"),
    "backend-typo-mha": ({"sglang_server_attention_backend": "flashinfer2",
                          "sglang_server_model_family": "MHA"},
                         "sglang_server_attention_backend", "did you mean 'flashinfer'"),
    "variable-typo": ({"sglang_server_attention_backnd": "flashinfer"},
                      "sglang_server_attention_backnd",
                      "did you mean sglang_server_attention_backend?"),
    "extra-args-alias": ({"sglang_server_extra_args": ["--tensor-parallel-size", "4"]},
                         "sglang_server_extra_args", "set sglang_server_tp instead"),
    "extra-args-unknown": ({"sglang_server_extra_args": ["--enable-torch-compiel"]},
                           "sglang_server_extra_args", "did you mean --enable-torch-compile"),
    "kv-dtype-choice": ({"sglang_server_kv_cache_dtype": "fp8"}, "sglang_server_kv_cache_dtype",
                        "choices for --kv-cache-dtype"),
    "secret-in-overrides": ({"sglang_server_overrides": {
                                "sglang_server_api_key": "overridden-key-0123456789"}},
                            "sglang_server_overrides", "a secret has one way in"),
    "api-key-short": ({"sglang_server_api_key": "ready"}, "sglang_server_api_key",
                      "too short to keep out of logs"),
    "version-unknown": ({"sglang_server_version": "0.5.99"}, "sglang_server_version",
                        "is not a release in the package registry; the nearest are: "),
    "window-negative": ({"sglang_server_gate_stall_windows": {"loading_weights": -5}},
                        "sglang_server_gate_stall_windows", "positive number of seconds"),
    "tp-beyond-gpus": ({"sglang_server_tp": 16}, "sglang_server_tp", "needs 16 GPUs per node"),
    "tp-times-dp": ({"sglang_server_dp": 2}, "sglang_server_tp", "tp x pp x dp = 16"),
    "rank-without-group": ({"sglang_server_node_rank": 1}, "sglang_server_node_rank",
                           "contradicts itself"),
    "group-missing": ({"sglang_server_group": "nope"}, "sglang_server_group",
                      "not a member of inventory group 'nope'"),
    "known-bad-rule": ({"sglang_server_attention_backend": "flashinfer"},
                       "sglang_server_attention_backend", "sglang_server_allow_rules"),
}


def write_hosts(fleet, hosts: dict[str, dict]) -> None:
    members = {name: {"sglang_sim_node_index": i, **values}
               for i, (name, values) in enumerate(hosts.items())}
    (fleet.inventory / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"sglang_servers": {"hosts": members}}}}, allow_unicode=True))


def deploy(fleet, tmp_path, name: str):
    run = sglang_fleet("deploy", "-i", str(fleet.inventory), "-e", json.dumps(fleet.with_stores()),
                       "--run-dir", str(tmp_path / name))
    summary_path = tmp_path / name / "summary.json"
    return run, json.loads(summary_path.read_text()) if summary_path.exists() else None


def test_every_malformed_value_is_refused_with_its_variable_and_fix(tmp_path):
    fleet = make_fleet(tmp_path, hosts=1)
    write_hosts(fleet, {name: values for name, (values, _, _) in CASES.items()})
    run, summary = deploy(fleet, tmp_path, "malformed")
    assert run.returncode == 2, run.stdout[-3000:]
    assert summary["result"] == "usage error"
    for name, (_, variable, words) in CASES.items():
        host = summary["hosts"][name]
        assert host["status"] == "failed" and host["stages"] == {"spec": "failed"}, name
        assert f"host {name}: {variable}=" in host["message"], (name, host["message"])
        assert words in host["message"] and "Fix:" in host["message"], (name, host["message"])
    assert len(max((h["message"] for h in summary["hosts"].values()), key=len)) < 2000
    # A refused secret is named, never shown: not in the output nor in any run artifact.
    secret = CASES["secret-in-overrides"][0]["sglang_server_overrides"]["sglang_server_api_key"]
    assert secret not in run.stdout
    for path in (tmp_path / "malformed").rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    # Nothing reached a node: no node folder, no process.
    assert not (tmp_path / "nodes").exists()


def test_contradictory_group_ranks_are_refused_for_the_whole_group(tmp_path):
    fleet = make_fleet(tmp_path, hosts=2)
    (fleet.inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "sglang_servers": {"hosts": {"sim-node-1": {"sglang_sim_node_index": 0,
                                                    "sglang_server_node_rank": 0},
                                     "sim-node-2": {"sglang_sim_node_index": 1,
                                                    "sglang_server_node_rank": 0}}},
        "tp16": {"hosts": {"sim-node-1": None, "sim-node-2": None},
                 "vars": {"sglang_server_group": "tp16", "sglang_server_tp": 16,
                          "sglang_server_dist_init_host": "127.0.0.1"}}}}}))
    run, summary = deploy(fleet, tmp_path, "ranks")
    assert run.returncode == 2, run.stdout[-3000:]
    message = summary["hosts"]["sim-node-1"]["message"]
    assert "group tp16: hosts sim-node-1 and sim-node-2 both have node rank 0" in message
    assert not (tmp_path / "nodes").exists()


def test_an_inventory_without_the_servers_group_is_a_usage_error(tmp_path):
    fleet = make_fleet(tmp_path, hosts=1)
    (fleet.inventory / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"gpu_nodes": {"hosts": {"sim-node-1": None}}}}}))
    run, summary = deploy(fleet, tmp_path, "nogroup")
    assert run.returncode == 2
    assert "no host ran: check --limit and the inventory" in run.stdout
    assert summary["hosts"] == {}
