"""Real ansible-playbook runs of deploy.yml and stop.yml against a simulated fleet."""

from __future__ import annotations

import stat

import pytest
import requests

from sglang_fleet.node.gpu.gpu import gpu_snapshot
from sglang_fleet.testfleet.local import http_status, make_fleet, run_playbook

# Task banners name the role by its collection name.
ROLE = "sglang.fleet.sglang_server"
pytestmark = pytest.mark.integration

NODE3_VARS = {"sglang_server_nccl_profile": {"NCCL_PROTO": "LL"}}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = make_fleet(tmp_path_factory.mktemp("fleet"))
    # An NCCL variable on one host, for the review step's diff of a change to it.
    fleet.set_host_vars("sim-node-3", NODE3_VARS)
    # -v: the tasks that ran are named, for the checks of which steps the node check spared.
    first = fleet.deploy("-v")
    fleet.first_run = first
    yield fleet
    fleet.stop()
    fleet.kill_leftovers()


def test_first_deploy_brings_every_host_to_ready(fleet):
    run = fleet.first_run
    assert run.rc == 0, run.output[-3000:]
    assert set(run.recap) == set(fleet.hosts) and not run.failed_hosts()
    for host in fleet.hosts:
        assert f"{host}: ready at {fleet.url(host)}" in run.output
        assert http_status(fleet.url(host) + "/health") == 200
        titles = sorted(p["cmdline"] for p in fleet.processes(host))
        assert titles.count("sglang::detokenizer") == 1
        assert [t for t in titles if t.startswith("sglang::scheduler_TP")] == [
            f"sglang::scheduler_TP{i}" for i in range(8)]
    # The node check parsed the arguments, took each deployment's lock, wrote the launch files
    # and started the server in its one run: the argument check, lock, files and service steps
    # are not even included; the lock was released after the gate.
    out = " ".join(run.output.split())
    assert out.count("the installed SGLang parsed the arguments in this check and accepts "
                     "them") == len(fleet.hosts)
    assert out.count("launch files written (") == len(fleet.hosts)
    for host in fleet.hosts:
        assert f"server started (pid {fleet.main_pid(host)})" in out
        assert f"{host}: ready at {fleet.url(host)} (Kimi-K2.5-{fleet.port(host)}, config " in out
        assert f"started, pid {fleet.main_pid(host)})" in out
    assert f"TASK [{ROLE} : Start the server, restarting it only if its launch files " \
        "changed]" not in run.output
    section = run.output.split(f"TASK [{ROLE} : Parse, lock and write what the node check "
                               "left to do]", 1)[1].split("TASK [")[0]
    assert "included:" not in section and section.count("skipping: [") == len(fleet.hosts)
    for task in ("Parse the rendered arguments with the installed SGLang",
                 "Take the deployment's lock for this deploy",
                 "Write the deployment's folders, launch script, env file (0600) and unit"):
        assert f"TASK [{ROLE} : {task}]" not in run.output
    assert not list(fleet.root.glob("*/run/*.recover.lock"))


def test_files_have_the_right_modes(fleet):
    conf = fleet.host_root("sim-node-1") / "conf"
    port = fleet.port("sim-node-1")
    env_mode = stat.S_IMODE((conf / f"Kimi-K2.5-{port}.env").stat().st_mode)
    script_mode = stat.S_IMODE((conf / f"Kimi-K2.5-{port}.launch.sh").stat().st_mode)
    config_mode = stat.S_IMODE((conf / f"Kimi-K2.5-{port}.config.yaml").stat().st_mode)
    assert env_mode == 0o600 and script_mode == 0o755 and config_mode == 0o600
    assert stat.S_IMODE(conf.stat().st_mode) == 0o750


def test_second_run_changes_nothing_and_restarts_nothing(fleet):
    pids = {h: fleet.main_pid(h) for h in fleet.hosts}
    run = fleet.deploy("-v", "-e", "sglang_fleet_serial=2")
    assert run.rc == 0, run.output[-3000:]
    assert run.changed_hosts() == set()
    assert {h: fleet.main_pid(h) for h in fleet.hosts} == pids
    assert run.output.count("PLAY [Deploy SGLang servers]") == 2  # two serial batches
    # The node check's one module run asked each server; no gate poll was needed.
    assert all(f"GATE [{h}]: ready: /health answered 200" in run.output for h in fleet.hosts)
    assert "TASK [sglang.fleet.sglang_server : Observe the server" not in run.output


def test_a_fleet_without_a_router_gets_no_host_pattern_warning(fleet):
    """An inventory without a sglang_routers group runs every playbook without Ansible's
    "Could not match supplied host pattern" (a --limit that matches nothing still warns)."""
    assert "Could not match supplied host pattern" not in fleet.first_run.output
    for playbook in ("playbooks/health.yml", "playbooks/router.yml"):
        run = run_playbook(playbook, fleet.inventory, fleet.extra)
        assert "Could not match supplied host pattern" not in run.output, (playbook, run.output)
    assert run.rc == 0, run.output[-3000:]
    typo = run_playbook("playbooks/health.yml", fleet.inventory, fleet.extra, "--limit",
                        "sim-node-9")
    assert "Could not match supplied host pattern" in typo.output


def test_check_mode_with_diff_shows_the_change_and_touches_nothing(fleet):
    pids = {h: fleet.main_pid(h) for h in fleet.hosts}
    fleet.set_host_vars("sim-node-3", {"sglang_server_num_continuous_decode_steps": 4,
                                       "sglang_server_nccl_profile": {"NCCL_PROTO": "Simple"}})
    try:
        run = fleet.deploy("--check", "--diff")
        assert run.rc == 0, run.output[-3000:]
        assert run.changed_hosts() == {"sim-node-3"}
        assert "+    --num-continuous-decode-steps 4 \\" in run.output
        # The env file holds no secret here: its diff shows the NCCL variable's old and new
        # line, not a digest.
        assert "\n-NCCL_PROTO=LL\n" in run.output and "\n+NCCL_PROTO=Simple\n" in run.output, \
            run.output[-3000:]
        conf = fleet.host_root("sim-node-3") / "conf"
        port = fleet.port("sim-node-3")
        assert "--num-continuous-decode-steps" not in (conf / f"Kimi-K2.5-{port}.launch.sh"
                                                       ).read_text()
        assert "NCCL_PROTO=LL\n" in (conf / f"Kimi-K2.5-{port}.env").read_text()
        assert {h: fleet.main_pid(h) for h in fleet.hosts} == pids
    finally:
        fleet.set_host_vars("sim-node-3", NODE3_VARS)


def test_one_variable_change_restarts_only_that_server(fleet):
    pids = {h: fleet.main_pid(h) for h in fleet.hosts}
    fleet.set_host_vars("sim-node-2", {"sglang_server_num_continuous_decode_steps": 4})
    run = fleet.deploy("--diff")
    assert run.rc == 0, run.output[-3000:]
    assert run.changed_hosts() == {"sim-node-2"}
    # The node check wrote the changed launch script and unit, and showed their diffs.
    assert "+    --num-continuous-decode-steps 4 \\" in run.output
    assert "launch files written (" in run.output
    # The NODE line names the changed setting with its old and new value.
    node = [line for line in run.output.splitlines() if line.startswith("NODE [sim-node-2]")]
    assert len(node) == 1 and ("the launch files differ from the rendered ones: "
                               "sglang_server_num_continuous_decode_steps: 1 -> 4"
                               in node[0]), node
    after = {h: fleet.main_pid(h) for h in fleet.hosts}
    assert after["sim-node-2"] != pids["sim-node-2"]
    assert {h: p for h, p in after.items() if h != "sim-node-2"} == {
        h: p for h, p in pids.items() if h != "sim-node-2"}
    assert "sim-node-2: ready" in run.output and "restarted" in run.output
    assert http_status(fleet.url("sim-node-2") + "/health") == 200
    log = fleet.log_file("sim-node-2").read_text()
    assert log.count("===== sglang-fleet: start") == 2, "the first run's log is kept"
    info = requests.get(fleet.url("sim-node-2") + "/server_info", timeout=5).json()
    assert info["num_continuous_decode_steps"] == 4


def test_stop_ends_every_process_keeps_logs_and_frees_gpus(fleet):
    run = fleet.stop()
    assert run.rc == 0, run.output[-3000:]
    assert run.changed_hosts() == set(fleet.hosts)
    for host in fleet.hosts:
        assert fleet.processes(host) == []
        assert fleet.log_file(host).exists()
        snap = gpu_snapshot("simulated", str(fleet.host_root(host) / "sim" / "gpus"))
        assert all(d["memory_used"] == 0 and not d["processes"] for d in snap)
    again = fleet.stop()
    assert again.rc == 0 and again.changed_hosts() == set()
    assert "not running" in again.output
