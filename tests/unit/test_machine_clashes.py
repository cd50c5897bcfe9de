"""Two servers of one inventory on one machine: the same port (HTTP, a prefill's KV bootstrap
port, a group's rendezvous port) or the same GPUs are refused on the controller, naming both
hosts, the variable, the value and the fix."""

from __future__ import annotations

from sglang_fleet.launch.clashes import LOCAL_MACHINE, clash_errors, gpu_ids, machine_of
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.testfleet.local import role_defaults


def binds(**overrides):
    settings = dict(role_defaults(), **{f"sglang_server_{k}": v for k, v in overrides.items()})
    result = build_launch_spec(settings, "node")
    assert result["ok"], result["errors"]
    return result["spec"]["binds"]


def test_one_port_on_one_machine_is_refused_naming_both_hosts_and_the_fix():
    both = {"a": binds(), "b": binds(extra_args=["--base-gpu-id", "0"])}
    errors = clash_errors("a", {"a": "10.0.0.5", "b": "10.0.0.5"}, both)
    port = [e for e in errors if "port" in e.split(" of one machine")[0]]
    assert port == [
        "a and b would both listen on port 30000 of one machine (10.0.0.5): "
        "sglang_server_port=30000 on a (at 127.0.0.1), sglang_server_port=30000 on b (at "
        "127.0.0.1). The later one would load its weights and then fail with [Errno 98] "
        "Address already in use. Fix: give each server on one machine its own port "
        "(sglang_server_port on a or sglang_server_port on b), or put them on different "
        "machines (ansible_host)"]
    # Other machines, or other loopback addresses of one machine, do not clash.
    assert clash_errors("a", {"a": "10.0.0.5", "b": "10.0.0.6"}, both) == []
    apart = {"a": binds(gpu_count=16), "b": binds(gpu_count=16, host="127.0.0.2",
                                                  extra_args=["--base-gpu-id", "8"])}
    assert clash_errors("a", {"a": "m", "b": "m"}, apart) == []
    # A server on every address meets one on loopback.
    wild = {"a": binds(gpu_count=16, host="0.0.0.0", api_key="7f3a9c2e1b8d4f6a0c5e9b2d7a1f4c8e"),
            "b": binds(gpu_count=16, extra_args=["--base-gpu-id", "8"])}
    assert len(clash_errors("b", {"a": "m", "b": "m"}, wild)) == 1


def test_the_same_gpus_of_one_machine_are_refused_and_other_gpus_pass():
    same = {"a": binds(gpu_count=16, tp=8), "b": binds(gpu_count=16, tp=8, port=30001)}
    (error,) = clash_errors("b", {"a": "m", "b": "m"}, same)
    assert error.startswith("b and a would both use GPU 0,1,2,3,4,5,6,7 of one machine (m): ")
    assert "Fix: give each server its own GPUs (--base-gpu-id in sglang_server_extra_args, " \
        "or CUDA_VISIBLE_DEVICES in sglang_server_extra_env)" in error
    split = {"a": same["a"], "b": binds(gpu_count=16, tp=8, port=30001,
                                        extra_args=["--base-gpu-id", "8"])}
    assert clash_errors("b", {"a": "m", "b": "m"}, split) == []
    # CUDA_VISIBLE_DEVICES maps SGLang's indices to the machine's GPUs.
    assert gpu_ids(0, 1, 2, "4,5,6,7") == [4, 5]
    assert gpu_ids(2, 2, 2, None) == [2, 4]


def test_a_prefills_bootstrap_port_and_a_groups_rendezvous_port_are_ports_it_binds():
    prefill = binds(disaggregation_mode="prefill", pd_deployment="pd",
                    disaggregation_bootstrap_port=31000, disaggregation_transfer_backend="nixl")
    assert prefill["ports"] == {"sglang_server_port": 30000,
                                "sglang_server_disaggregation_bootstrap_port": 31000}
    other = binds(port=31000, extra_args=["--base-gpu-id", "8"], gpu_count=16)
    (error,) = clash_errors("p", {"p": "m", "o": "m"}, {"p": prefill, "o": other})
    assert "sglang_server_disaggregation_bootstrap_port=31000 on p" in error
    assert "sglang_server_port=31000 on o" in error


def test_the_controllers_own_hosts_are_one_machine():
    hostvars = {"a": {"ansible_connection": "local"}, "b": {"ansible_connection": "local"},
                "c": {"ansible_host": "10.0.0.5"}, "d": {}}
    assert machine_of(hostvars, "a") == machine_of(hostvars, "b") == LOCAL_MACHINE
    assert machine_of(hostvars, "c") == "10.0.0.5" and machine_of(hostvars, "d") == "d"
