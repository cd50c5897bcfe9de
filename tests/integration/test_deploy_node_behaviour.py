"""Deploy behaviour on the node: leaked shm, multi-node groups, the pip install path."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from sglang_fleet.launch.envs import env_id
from sglang_fleet.node.process import procs
from sglang_fleet.runs.runner import playbook_run
from sglang_fleet.testfleet.local import BIN, REPO, http_status, make_fleet, make_tp16_group

pytestmark = pytest.mark.integration



def test_leaked_shm_segments_of_the_last_run_are_removed(one_node):
    """Only the last run's own: in a folder shared with others (bystanders' psm_* and torch_*
    files, another deployment's sgl_shm_* segment, all as fresh and of the same user), the
    cleanup removed every matching name before."""
    assert one_node.deploy().rc == 0
    shm = one_node.host_root("sim-node-1") / "shm"
    old_pid = one_node.main_pid("sim-node-1")
    (leaked,) = shm.glob("sgl_shm_mq_*")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    bystanders = [shm / name for name in (
        "psm_someone_else", f"torch_{gone.pid}_1804289383_0",
        f"sgl_shm_mq_{gone.pid}_0a1b2c3d", "nccl-XyZ123", "cuda.shm.7")]
    for path in bystanders:
        path.write_bytes(b"x")
    # SIGKILL skips cleanup, as in the incident's kill -9.
    report = procs.stop_deployment(one_node.marker("sim-node-1"), 0, skip_term=True,
                                   session_id=old_pid)
    assert report["kill_sent"] and leaked.exists()
    run = one_node.deploy()
    assert run.rc == 0, run.output[-3000:]
    assert not leaked.exists()
    assert [p for p in bystanders if not p.exists()] == []
    assert "1 leaked shared-memory segment(s) removed" in run.output
    assert len(list(shm.glob("sgl_shm_mq_*"))) == 2  # the new run's own, another's


def test_two_simulated_nodes_form_one_tp16_server(tmp_path):
    fleet = make_tp16_group(tmp_path)
    try:
        run = fleet.deploy()
        assert run.rc == 0, run.output[-3000:]
        assert "sim-node-1: ready at" in run.output
        assert "sim-node-2: ready as node rank 1 of tp16; rank 0 serves HTTP" in run.output
        assert http_status(fleet.url("sim-node-1") + "/health") == 200
        # sim-node-2's own port of the fleet's block is unused: the group serves on rank 0's.
        assert http_status(f"http://127.0.0.1:{fleet.base_port + 1}/health", timeout=2) is None
        from sglang_fleet.node.process.procs import deployment_processes
        marker = fleet.marker("sim-node-2")
        assert marker == f"sim-node-2:Kimi-K2.5-{fleet.port('sim-node-1')}"
        rank1 = sorted(p["cmdline"] for p in deployment_processes(marker)
                       if p["cmdline"].startswith("sglang::scheduler"))
        assert rank1 == sorted(f"sglang::scheduler_TP{i}" for i in range(8, 16))
        script = (fleet.host_root("sim-node-2") / "conf" /
                  f"Kimi-K2.5-{fleet.port('sim-node-1')}.launch.sh").read_text()
        assert "--nnodes 2" in script and "--node-rank 1" in script
        assert re.search(r"--dist-init-addr 127\.0\.0\.1:\d+ ", script)
    finally:
        fleet.kill_leftovers()


def test_pip_install_path_in_check_mode(tmp_path):
    """The real install path cannot run here (no GPUs, no SGLang wheel deps): check mode shows
    what it would do, with the exact arguments, and touches nothing."""
    fleet = make_fleet(tmp_path, hosts=1)
    extra = {**fleet.extra, "sglang_server_install_mode": "pip",
             "sglang_server_python": "/usr/bin/python3",
             "sglang_server_root": str(tmp_path / "opt")}
    with playbook_run("deploy.yml", inventory=str(fleet.inventory), extravars=extra,
                      private_data_dir=str(tmp_path / "runner"),
                      cmdline="--check") as run:
        events = list(run.events)
        assert run.rc == 0, "\n".join(e.get("stdout", "") for e in events)[-3000:]
    pip = next(e["event_data"]["res"] for e in events
               if e["event"] == "runner_on_ok"
               and e["event_data"]["task"].startswith("Install the pinned SGLang"))
    args = pip["invocation"]["module_args"]
    assert args["name"] == ["sglang[all]==0.5.23", "py-spy"]
    # The release's own environment, named by its requirement lines (launch/envs.py).
    assert args["virtualenv"] == str(tmp_path / "opt" / "envs" / env_id(args["name"]))
    assert args["virtualenv_command"] == "/usr/bin/python3 -m venv"
    assert pip["changed"] is True
    files_task = next(e["event_data"]["res"] for e in events
                      if e["event"] == "runner_on_ok"
                      and e["event_data"]["task"].startswith("Write the deployment's folders"))
    assert files_task["changed"] is True
    assert str(tmp_path / "opt" / "conf" / "Kimi-K2.5-{}.launch.sh".format(
        fleet.port("sim-node-1"))) in files_task["changed_paths"]
    assert not (tmp_path / "opt").exists(), "check mode writes nothing"
    rendered = [e for e in events if e["event"] == "runner_on_ok"
                and e["event_data"]["task"] == "Start the server, restarting it only if its "
                                               "launch files changed"]
    assert rendered and rendered[0]["event_data"]["res"]["action"] == "started"
    assert str(BIN) and REPO  # the venv's ansible-playbook ran this


def test_leaked_memory_fault_keeps_gpu_memory_after_kill(tmp_path):
    from sglang_fleet.node.gpu.gpu import gpu_snapshot
    from sglang_fleet.testfleet.local import start_sim, wait_for
    sim = start_sim(tmp_path, "--tp-size", "4", "--attention-backend", "triton",
                    fault="leak_memory")
    wait_for(lambda: "fired up" in sim.log(), timeout=60)
    procs.stop_deployment(sim.marker, 0, skip_term=True)
    sim.proc.wait(5)
    snap = gpu_snapshot("simulated", str(sim.gpu_dir))
    assert all(d["memory_used"] > 80 * 1024**3 for d in snap[:4])
    assert all(d["processes"] == [] for d in snap)
    assert json.loads((sim.gpu_dir / "devices.json").read_text())[0]["index"] == 0
