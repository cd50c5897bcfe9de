"""Deploys that must stop early, loudly, and without harm."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess

import pytest

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet, run_playbook

pytestmark = pytest.mark.integration



def test_bad_nccl_name_fails_before_touching_any_node(tmp_path):
    fleet = make_fleet(tmp_path, hosts=2)
    run = fleet.deploy(extra={"sglang_server_nccl_profile": {"NCCL_P2P_LEVL": "SYS"}})
    assert run.rc != 0
    assert ("fatal: [sim-node-1, sim-node-2]: LaunchSpec refused (the same on 2 hosts):\n"
            "    sglang_server_nccl_profile='NCCL_P2P_LEVL'") in run.output
    assert "did you mean NCCL_P2P_LEVEL?" in run.output
    assert not fleet.root.exists(), "nothing may be written to a node"


def test_a_typo_on_four_hosts_is_said_once_naming_them(tmp_path):
    """ansible-core 2.19 prints a failed task twice (an [ERROR] block with a source excerpt,
    then the result as YAML, which doubles quotes): 70 lines for one typo on four hosts.
    The refusal is one block: the hosts, then the reason with its fix."""
    fleet = make_fleet(tmp_path, hosts=4)
    run = fleet.deploy(extra={"sglang_server_attention_backend": "flashinfr"})
    assert run.rc == 2
    start = run.output.index("fatal: [")
    block = run.output[start:run.output.index("PLAY RECAP")].strip().splitlines()
    assert block[0] == ("fatal: [sim-node-1, sim-node-2, sim-node-3, sim-node-4]: LaunchSpec "
                        "refused (the same on 4 hosts):")
    assert len(block) == 2, block  # the hosts, then the one problem on one line
    text = block[1].strip()
    assert text.startswith("sglang_server_attention_backend='flashinfr': is not one of SGLang "
                           "0.5.23's choices for --attention-backend. Fix: 'flashinfer' is the "
                           "closest, but rule flashinfer-mla-sm120-graph-capture-hang refuses "
                           "it on this hardware: set sglang_server_attention_backend: 'triton'")
    assert run.output.count("is not one of SGLang 0.5.23's choices") == 1
    assert "[ERROR]" not in run.output and "Origin:" not in run.output
    assert "''" not in run.output
    assert not fleet.root.exists()


def test_different_refusals_get_a_block_each(tmp_path):
    fleet = make_fleet(tmp_path, hosts=3)
    fleet.set_host_vars("sim-node-3", {"sglang_server_tp": 16})
    run = fleet.deploy(extra={"sglang_server_kv_cache_dtype": "fp8"})
    assert run.rc == 2
    assert "fatal: [sim-node-1, sim-node-2]: LaunchSpec refused (the same on 2 hosts):" in \
        run.output
    assert "fatal: [sim-node-3]: LaunchSpec refused:" in run.output
    assert run.output.count("choices for --kv-cache-dtype") == 2  # once per block
    assert "sglang_server_tp=16" in run.output


def test_known_bad_rule_is_refused_with_its_fix(tmp_path):
    fleet = make_fleet(tmp_path, hosts=1)
    run = fleet.deploy(extra={"sglang_server_attention_backend": "flashinfer"})
    assert run.rc != 0
    assert "flashinfer-mla-sm120-graph-capture-hang" in run.output
    assert "set sglang_server_attention_backend: 'triton'" in run.output
    assert not fleet.root.exists()


def test_gpu_count_mismatch_is_caught_by_preflight(one_node):
    run = one_node.deploy(extra={"sglang_server_sim_gpu_count": 4})
    assert run.rc != 0
    assert "the node has 4 GPU(s)" in run.output
    assert "sglang_server_gpu_count=8" in run.output
    assert one_node.processes("sim-node-1") == []


def test_a_flag_sglang_lacks_is_refused_before_any_node(one_node):
    run = one_node.deploy(extra={"sglang_server_extra_args": ["--no-such-flag"]})
    assert run.rc != 0
    assert ("sglang_server_extra_args='--no-such-flag': --no-such-flag is not an option of "
            "SGLang 0.5.23") in run.output
    assert not one_node.root.exists()


def test_the_node_parser_is_the_last_word(tmp_path):
    """After the controller's catalogue check, the node's installed SGLang parses the command
    line itself: an environment that cannot import SGLang's parser, or refuses a flag, fails
    in seconds with the reason."""
    import json
    import subprocess
    import sys

    from sglang_fleet.testfleet.local import BIN, REPO, ansible_env

    def argcheck(parser: str, args: list[str]) -> dict:
        module_args = json.dumps({"python": sys.executable, "parser": parser, "args": args})
        proc = subprocess.run([str(BIN / "ansible"), "localhost", "-c", "local", "-o",
                               "-m", "sglang.fleet.sglang_argcheck", "-a", module_args,
                               "-e", f"ansible_python_interpreter={sys.executable}"],
                              cwd=REPO, env=ansible_env(), capture_output=True, text=True,
                              timeout=120)
        return json.loads(proc.stdout.split("=>", 1)[1])

    missing = argcheck("sglang.srt.server_args:prepare_server_args", ["--model-path", "m"])
    assert "cannot import SGLang's argument parser" in missing["msg"]
    assert "No module named 'sglang'" in missing["msg"]
    refused = argcheck("sglang_fleet.sim.args.server_args:prepare_server_args",
                       ["--model-path", "m", "--no-such-flag"])
    assert "SGLang rejected the rendered arguments" in refused["msg"]
    assert "unrecognized arguments: --no-such-flag" in refused["msg"]


def test_a_node_whose_sglang_rejects_the_arguments_starts_nothing(one_node, tmp_path):
    """The node's installed SGLang is the last word. Here it is an older release than the
    pinned one the controller checked against (the simulator's parser of 0.5.4.post3, behind
    the server's interpreter), which lacks a flag the inventory asks for. The node check
    parses, the argument check names the refusal, nothing is written or started and the
    deployment's lock, taken by the node check, is released."""
    import sys

    older = tmp_path / "python-with-sglang-0.5.4"
    older.write_text(f'#!/bin/sh\nSGLANG_SIM_VERSION=0.5.4.post3 exec {sys.executable} "$@"\n')
    older.chmod(0o755)
    run = one_node.deploy("-v", extra={"sglang_server_python": str(older),
                                 "sglang_server_extra_args": ["--enable-dynamic-chunking"]})
    assert run.rc != 0
    out = " ".join(run.output.split())
    assert "the installed SGLang rejects the arguments (the argument check says why)" in out
    assert "TASK [sglang.fleet.sglang_server : Parse the rendered arguments with the installed " \
        "SGLang]" in out
    assert "SGLang rejected the rendered arguments" in out
    assert "unrecognized arguments: --enable-dynamic-chunking" in out
    root = one_node.host_root("sim-node-1")
    deployment = f"Kimi-K2.5-{one_node.port('sim-node-1')}"
    assert not (root / "conf" / f"{deployment}.launch.sh").exists(), "nothing written"
    assert one_node.processes("sim-node-1") == []
    assert not (root / "run" / f"{deployment}.recover.lock").exists(), "the lock is released"


def test_api_key_stays_out_of_output_script_and_log(one_node):
    secret = "sk-fleet-test-0123456789"
    run = one_node.deploy("-vv", extra={"sglang_server_api_key": secret,
                                        "sglang_server_hf_token": "hf_testtoken987"})
    assert run.rc == 0, run.output[-3000:]
    assert secret not in run.output and "hf_testtoken987" not in run.output
    root = one_node.host_root("sim-node-1")
    port = one_node.port("sim-node-1")
    assert secret not in (root / "conf" / f"Kimi-K2.5-{port}.launch.sh").read_text()
    assert secret in (root / "conf" / f"Kimi-K2.5-{port}.env").read_text()
    assert secret not in one_node.log_file("sim-node-1").read_text()
    import requests
    url = one_node.url("sim-node-1")
    assert requests.get(url + "/v1/models", timeout=5).status_code == 401
    assert requests.get(url + "/v1/models", timeout=5,
                        headers={"Authorization": f"Bearer {secret}"}).status_code == 200


def test_other_failures_keep_ansibles_own_output(tmp_path):
    """Only messages the project words itself lose ansible-core's [ERROR] block: a template
    error keeps it, with its source excerpt; a rescue that fails again says so in one line."""
    playbook = tmp_path / "pb.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: A template error\n      ansible.builtin.fail: {msg: '{{ nope.x }}'}\n"
        "      ignore_errors: true\n"
        "    - name: A failure of our own words\n      block:\n"
        "        - name: Fail\n          ansible.builtin.fail:\n"
        "            msg: \"the server's 'words'\\nsecond line\"\n"
        "      rescue:\n        - name: Fail again\n          ansible.builtin.fail:\n"
        "            msg: '{{ ansible_failed_result.msg }}'\n")
    out = subprocess.run([str(BIN / "ansible-playbook"), "-v", "-i", "localhost,", "-c",
                          "local", str(playbook)], cwd=REPO, env=ansible_env(), capture_output=True,
                         text=True, timeout=120).stdout
    template = out[out.index("TASK [A template error]"):out.index("TASK [Fail]")]
    assert "[ERROR]: Task failed: Finalization of task args" in template
    assert "Origin: " in template and "'nope' is undefined" in template
    own = out[out.index("TASK [Fail]"):out.index("PLAY RECAP")]
    assert "fatal: [localhost]: FAILED! =>\n    the server's 'words'\n    second line\n" in own
    # The rescue that fails the host with the failure it rescued is not printed again.
    assert own.count("the server's 'words'") == 1
    assert "[ERROR]" not in own and "Origin:" not in own


def test_the_node_check_refuses_weights_its_own_gpus_cannot_hold(one_node):
    """The controller is told of 1000 GB GPUs; the node's own GPUs (NVML, simulated here) and
    its copy of the model (config.json, safetensors index) say the weights cannot fit at TP 4.
    Refused before anything on the node changes: no lock, no files, no process."""
    run = one_node.deploy(extra={"sglang_server_tp": 4, "sglang_server_gpu_memory_gb": 1000})
    assert run.rc != 0
    text = " ".join(run.output.split())
    assert ("sglang_server_tp=4: the model at " in text and "'s weights are 553 GiB: over tp x "
            "pp = 4 GPUs that is 138.3 GiB per GPU, more than the 90.8 GiB a 95.6 GiB GPU "
            "gives them" in text), run.output[-2000:]
    assert "(read from its config.json and checkpoint on this node)" in text
    assert one_node.processes("sim-node-1") == []
    assert not list((one_node.host_root("sim-node-1") / "conf").glob("*.launch.sh"))


def test_a_key_that_resolves_to_nothing_never_restarts_the_server_open(one_node):
    key = "k" + secrets.token_hex(12)
    first = one_node.deploy(extra={"sglang_server_api_key": key})
    assert first.rc == 0, first.output[-2000:]
    pid = one_node.main_pid("sim-node-1")
    # The variable the inventory reads the key from is unset: the key resolves to "".
    again = one_node.deploy(extra={"sglang_server_api_key": ""})
    assert again.rc != 0
    text = " ".join(again.output.split())
    assert ("sglang_server_api_key resolves to nothing, but this deployment last started "
            "with it (config ") in text
    assert "sha256:" in text and key not in again.output
    assert "sglang_server_drop_secrets: [sglang_server_api_key]" in text
    assert one_node.main_pid("sim-node-1") == pid
    # Removed on purpose: the deploy goes ahead.
    dropped = one_node.deploy(extra={"sglang_server_api_key": "",
                                     "sglang_server_drop_secrets": ["sglang_server_api_key"]})
    assert dropped.rc == 0, dropped.output[-2000:]
    assert one_node.main_pid("sim-node-1") != pid


def test_a_stop_needs_only_the_deployments_identity(one_node):
    """An operator whose vault or environment is broken can still stop the fleet: stop.yml
    reads only the settings that name the deployment, never a secret or a flag."""
    assert one_node.deploy().rc == 0
    assert one_node.processes("sim-node-1")
    run = run_playbook("playbooks/stop.yml", one_node.inventory, {
        **one_node.extra, "sglang_server_api_key": "x",
        "sglang_server_extra_args": ["--no-such-flag"],
        "sglang_server_ssl_keyfile_password": "{{ undefined_variable_of_a_broken_vault }}"})
    assert run.rc == 0, run.output[-2000:]
    assert "sim-node-1: stopped (Kimi-K2.5-" in " ".join(run.output.split())
    assert one_node.processes("sim-node-1") == []


# ---- two servers on one machine: one port, or one GPU set --------------------------------

def test_two_servers_on_one_port_of_one_machine_are_refused_before_any_node(tmp_path):
    """The default simulated inventory, with sim-node-2 given sim-node-1's port: both run on
    this controller (ansible_connection=local). `sglang-fleet check` and the deploy refuse
    the pair, naming both hosts, the variable, the value and the fix; no node is touched."""
    fleet = make_fleet(tmp_path, hosts=2)
    taken = fleet.port("sim-node-1")
    fleet.set_host_vars("sim-node-2", {"sglang_server_port": taken})
    check = subprocess.run([str(BIN / "sglang-fleet"), "check", "-i", str(fleet.inventory),
                            "-e", json.dumps(fleet.extra)], cwd=REPO, env=ansible_env(),
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 2, check.stdout + check.stderr
    out = " ".join(check.stdout.split())
    assert (f"sim-node-2 and sim-node-1 would both listen on port {taken} of one machine "
            f"(this controller (ansible_connection=local)): sglang_server_port={taken} on "
            f"sim-node-2 (at 127.0.0.1), sglang_server_port={taken} on sim-node-1 (at "
            f"127.0.0.1)") in out, check.stdout
    assert "Fix: give each server on one machine its own port" in out
    assert "result: refused (exit 2): 2 of 2 hosts have problems; no node was contacted" in out
    run = fleet.deploy()
    assert run.rc == 2
    assert f"sim-node-1 and sim-node-2 would both listen on port {taken}" in \
        " ".join(run.output.split())
    # A deploy of one of them alone is refused too: the other's port comes from the inventory.
    alone = fleet.deploy("--limit", "sim-node-2")
    assert alone.rc == 2
    assert f"sim-node-2 and sim-node-1 would both listen on port {taken}" in \
        " ".join(alone.output.split())
    assert not fleet.root.exists(), "nothing may be written to a node"


def test_two_example_hosts_on_one_address_are_refused_for_port_and_gpus(tmp_path):
    """inventory/examples/rtxpro6000-fleet with gpu-node-01 and gpu-node-02 given one
    ansible_host: one machine, one port (30000 on every address) and GPUs 0-7 twice."""
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory" / "examples" / "rtxpro6000-fleet", inventory)
    (inventory / "host_vars").mkdir()
    for host in ("gpu-node-01", "gpu-node-02"):
        (inventory / "host_vars" / f"{host}.yml").write_text("ansible_host: 192.0.2.11\n")
    env = dict(ansible_env(), SGLANG_API_KEY=secrets.token_hex(24))
    check = subprocess.run([str(BIN / "sglang-fleet"), "check", "-i", str(inventory)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 2, check.stdout + check.stderr
    out = " ".join(check.stdout.split())
    assert ("gpu-node-01 and gpu-node-02 would both listen on port 30000 of one machine "
            "(192.0.2.11): sglang_server_port=30000 on gpu-node-01 (at 0.0.0.0), "
            "sglang_server_port=30000 on gpu-node-02 (at 0.0.0.0)") in out, check.stdout
    assert ("gpu-node-01 and gpu-node-02 would both use GPU 0,1,2,3,4,5,6,7 of one machine "
            "(192.0.2.11)") in out
    assert "2 of 8 hosts have problems; no node was contacted" in out
    assert "gpu-node-03" not in out.split("result:")[0]


def test_a_root_and_port_changed_together_leave_no_server_behind(one_node):
    """A deploy that moves the root and the port at once would start a second server beside
    the first, which no longer has files under the new root. The node check finds the
    host's server still running under its previous root (the ledger's last ready starts) and
    refuses with the command that stops it; that command stops it."""
    from sglang_fleet.node.process import procs
    from sglang_fleet.testfleet.local import free_port_block

    host = "sim-node-1"
    assert one_node.deploy().rc == 0
    old_port, old_root = one_node.port(host), str(one_node.host_root(host))
    old = [p["pid"] for p in one_node.processes(host)]
    new_port = free_port_block(1)
    new_marker = f"{host}:Kimi-K2.5-{new_port}"
    one_node.set_host_vars(host, {"sglang_server_root": str(one_node.root / "moved"),
                                  "sglang_server_port": new_port})
    try:
        run = one_node.deploy()
        assert run.rc != 0
        out = " ".join(run.output.split())
        assert (f"another deployment of {host} still runs under its previous root {old_root}: "
                f"{host}:Kimi-K2.5-{old_port} (port {old_port}") in out, run.output[-3000:]
        stop = (f"ansible-playbook playbooks/stop.yml --limit {host} -e "
                f"sglang_server_deployment_name=Kimi-K2.5-{old_port} -e "
                f"sglang_server_port={old_port} -e sglang_server_root={old_root}")
        assert stop in out
        assert all(procs.process_info(pid) for pid in old), "the old server was left as it was"
        assert procs.deployment_processes(new_marker) == [], "no second server was started"
        # The command it names stops the old server.
        stopped = run_playbook("playbooks/stop.yml", one_node.inventory, {
            **one_node.extra, "sglang_server_deployment_name": f"Kimi-K2.5-{old_port}",
            "sglang_server_port": old_port, "sglang_server_root": old_root}, "--limit", host)
        assert stopped.rc == 0, stopped.output[-3000:]
        left = [procs.process_info(pid) for pid in old]
        assert not [p for p in left if p and p["state"] != "Z"], (left, stopped.output[-3000:])
    finally:
        procs.stop_deployment(new_marker, term_timeout=5)
