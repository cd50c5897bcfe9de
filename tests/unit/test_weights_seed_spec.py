"""sglang_server_weights_from_instance: the release's remote_instance flags rendered from the
seed host's own variables, and each refusal naming the variable, its value and the fix."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sglang_fleet.launch import seed
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.testfleet.local import role_defaults

PORTS = list(range(30100, 30108))


def _settings(**overrides):
    base = {**role_defaults(), "sglang_server_port": 30002,
            "sglang_server_weights_from_instance": "node1",
            "sglang_server_weights_from_instance_ports": PORTS}
    base.update({"sglang_server_" + k: v for k, v in overrides.items()})
    return base


def _seed(name="node1", in_inventory=True, machine="m1", own_machine="m1", members=(),
          **settings):
    return {"name": name, "in_inventory": in_inventory, "ansible_host": "10.0.0.1",
            "machine": machine, "own_machine": own_machine, "group_members": list(members),
            "settings": {"sglang_server_port": 30001,
                         **{"sglang_server_" + k: v for k, v in settings.items()}}}


def build(seed_of=None, host="node2", **overrides):
    return build_launch_spec(_settings(**overrides), host,
                             seed_of=_seed() if seed_of is None else seed_of)


def refused(result, variable, *needles):
    assert not result["ok"], "expected a refusal"
    text = "\n".join(result["errors"])
    assert f"{variable}=" in text, text
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{text}"
    assert "Fix:" in text
    return text


def _flag(args, flag):
    return args[args.index(flag) + 1]


def test_the_seed_s_address_port_and_group_ports_render_the_release_s_flags():
    result = build()
    assert result["ok"], result["errors"]
    args = result["spec"]["server_args"]
    assert _flag(args, "--load-format") == "remote_instance"
    # The seed listens on loopback (the role's default) on the same machine: that address.
    assert _flag(args, seed.IP_FLAG) == "127.0.0.1"
    assert _flag(args, seed.PORT_FLAG) == "30001"
    assert json.loads(_flag(args, seed.PORTS_FLAG)) == PORTS
    assert _flag(args, seed.BACKEND_FLAG) == "nccl"
    assert result["spec"]["weights_from_instance"] == {
        "seed": "node1", "url": "http://127.0.0.1:30001", "ports": PORTS, "backend": "nccl"}
    # The pinned release's own pipeline is asked about them, each owned by its variable.
    case = result["release_case"]
    assert seed.PORTS_FLAG in case["argv"]
    assert case["sources"]["remote_instance_weight_loader_send_weights_group_ports"][0] == \
        "sglang_server_weights_from_instance_ports"
    assert case["sources"]["remote_instance_weight_loader_seed_instance_ip"][0] == \
        "sglang_server_weights_from_instance"


def test_a_seed_listening_on_every_interface_is_reached_at_its_ansible_host():
    result = build(seed_of=_seed(host="0.0.0.0", allow_unauthenticated=True), host="node2")
    assert result["ok"], result["errors"]
    assert _flag(result["spec"]["server_args"], seed.IP_FLAG) == "10.0.0.1"


def test_a_seed_whose_endpoints_need_a_key_is_refused():
    """SGLang's loader posts to the seed without an Authorization header."""
    refused(build(seed_of=_seed(host="0.0.0.0", api_key="Zq8xP2mLw4Rt7Yk9")),
            "sglang_server_weights_from_instance", "requires an API key",
            "sends none")


def test_the_older_release_has_no_backend_flag_and_loads_over_nccl():
    seed_of = _seed(version="0.5.4.post3")
    result = build(seed_of=seed_of, version="0.5.4.post3")
    assert result["ok"], result["errors"]
    args = result["spec"]["server_args"]
    assert _flag(args, "--load-format") == "remote_instance"
    assert seed.BACKEND_FLAG not in args
    refused(build(seed_of=seed_of, version="0.5.4.post3",
                  weights_from_instance_backend="transfer_engine"),
            "sglang_server_weights_from_instance", "SGLang 0.5.4.post3 loads from an instance "
            "over NCCL only")


def test_without_a_seed_nothing_renders():
    settings = {**role_defaults(), "sglang_server_port": 30002}
    result = build_launch_spec(settings, "node2")
    assert result["ok"], result["errors"]
    assert "--load-format" not in result["spec"]["server_args"]
    assert result["spec"]["weights_from_instance"] is None


def test_a_seed_not_in_the_inventory_is_refused():
    refused(build(seed_of=_seed(name="node9", in_inventory=False), weights_from_instance="node9"),
            "sglang_server_weights_from_instance", "'node9'", "is not a host of this inventory")


def test_a_server_cannot_be_its_own_seed():
    refused(build(host="node1"), "sglang_server_weights_from_instance", "names this server "
            "itself")


@pytest.mark.parametrize(("seed_settings", "needle"), [
    ({"served_model_name": "DeepSeek-V3"}, "it serves 'DeepSeek-V3', this server 'Kimi-K2.5'"),
    ({"tp": 4, "gpu_count": 4}, "its tp is 4, this server's 8"),
    ({"version": "0.5.4.post3"}, "it runs SGLang 0.5.4.post3, this server 0.5.23"),
])
def test_a_seed_of_another_deployment_release_or_layout_is_refused(seed_settings, needle):
    refused(build(seed_of=_seed(**seed_settings)), "sglang_server_weights_from_instance",
            needle, "the seed must be a server of this deployment")


def test_a_seed_that_is_not_rank_0_of_its_group_is_refused():
    refused(build(seed_of=_seed(members=["node0", "node1"], group="pair")),
            "sglang_server_weights_from_instance", "not rank 0 of its multi-node group")


@pytest.mark.parametrize(("ports", "needle"), [
    ([30100, 30101], "has 2 ports for tp 8"),
    ([], "has 0 ports for tp 8"),
    ([30100] * 8, "names a port twice"),
    ([0, *PORTS[1:]], "must be port numbers"),
    ([30001, *PORTS[1:]], "holds the seed's HTTP port 30001"),
])
def test_a_port_list_that_does_not_give_each_tp_rank_its_own_port_is_refused(ports, needle):
    refused(build(weights_from_instance_ports=ports),
            "sglang_server_weights_from_instance_ports", needle)


def test_group_ports_without_a_seed_are_refused():
    refused(build(weights_from_instance=None), "sglang_server_weights_from_instance_ports",
            "group ports without a seed")


def test_a_seed_on_loopback_of_another_machine_is_refused():
    refused(build(seed_of=_seed(machine="gpu-a", own_machine="gpu-b")),
            "sglang_server_weights_from_instance", "listens on 127.0.0.1 only")


def test_transfer_engine_needs_a_seed_that_publishes_its_weights():
    refused(build(weights_from_instance_backend="transfer_engine"),
            "sglang_server_weights_from_instance_backend",
            seed.SEED_TRANSFER_ENGINE_FLAG)
    ok = build(seed_of=_seed(extra_args=[seed.SEED_TRANSFER_ENGINE_FLAG]),
               weights_from_instance_backend="transfer_engine")
    assert ok["ok"], ok["errors"]
    assert _flag(ok["spec"]["server_args"], seed.BACKEND_FLAG) == "transfer_engine"


def test_extra_args_may_not_set_another_load_format():
    refused(build(extra_args=["--load-format", "dummy"]), "sglang_server_extra_args",
            "sets --load-format while sglang_server_weights_from_instance loads")


def test_a_release_without_the_load_format_is_refused():
    options = {"--load-format": SimpleNamespace(choices=("auto", "safetensors"))}
    assert seed.release_problem(SimpleNamespace(by_flag=options), "nccl") == \
        "has no --load-format remote_instance"
    options["--load-format"] = SimpleNamespace(choices=("auto", "remote_instance"))
    assert seed.release_problem(SimpleNamespace(by_flag=options), "nccl").startswith(
        "has no --remote-instance-weight-loader-seed-instance-ip")


def test_the_seed_is_read_from_its_own_inventory_variables():
    hostvars = {"node1": {"ansible_host": "10.0.0.1", "sglang_server_port": 30001,
                          "sglang_server_launch_spec": {}, "sglang_server__spec_ready": True},
                "node2": {"ansible_host": "10.0.0.2"}}
    groups = {"all": ["node1", "node2"]}
    found = seed.seed_host_of("node1", "node2", hostvars, groups)
    assert found["settings"] == {"sglang_server_port": 30001}  # no outputs, no private facts
    assert (found["machine"], found["own_machine"]) == ("10.0.0.1", "10.0.0.2")
    assert seed.seed_host_of("node9", "node2", hostvars, groups) == {
        "name": "node9", "in_inventory": False}
    assert seed.seed_host_of(None, "node2", hostvars, groups) is None


# The request's thread raises after logging, as SGLang's does (Python prints its traceback).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_loader_whose_seed_does_not_answer_fails_as_sglang_s(monkeypatch, capsys):
    """The simulated loader against a closed port, with torch's 30-minute group timeout cut to
    a second: the release's log lines, then the missing `_model_update_group` through the
    release's frames."""
    import socket

    from sglang_fleet.sim.engine import failures
    from sglang_fleet.sim.srt.model_loader import remote_instance

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setattr(remote_instance, "DEFAULT_PG_TIMEOUT_S", 1)
    args = SimpleNamespace(remote_instance_weight_loader_seed_instance_ip="127.0.0.1",
                           remote_instance_weight_loader_seed_instance_service_port=closed,
                           remote_instance_weight_loader_send_weights_group_ports=[closed])
    with pytest.raises(AttributeError) as raised:
        remote_instance.load_model_from_remote_instance(args, 0, " TP0", 0.0)
    out = capsys.readouterr().out
    assert "TP0] Loading weights from remote instance ..." in out
    # TP rank 0 asked the seed first, in a thread of its own, and said why that failed.
    assert (f"Failed to trigger init_weights_send_group_for_remote_instance_request to seed "
            f"instance http://127.0.0.1:{closed}: ") in out
    assert f"init custom process group: master_address=127.0.0.1, master_port={closed}, " \
           "rank_offset=1, world_size=2" in out
    assert "Failed to initialize custom process group: The client socket has timed out" in out
    text = failures.scheduler_traceback("loading_weights", raised.value)
    assert text.rstrip().endswith("AttributeError: 'RemoteInstanceConnector' object has no "
                                  "attribute '_model_update_group'")
    assert "in load_model_from_remote_instance_by_nccl" in text
