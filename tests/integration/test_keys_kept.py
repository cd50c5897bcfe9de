"""A key read from the controller's environment that resolves to nothing never brings a server
back open, whichever command restarts it (`sglang-fleet recover`, `sglang-fleet watch
--recover`): the run fails naming the variable, the evidence is kept, and the server stays
down rather than serving without its key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import requests

from sglang_fleet.node.process import procs
from sglang_fleet.testfleet.local import (
    BIN,
    FAST_GATE,
    REPO,
    SMALL_TP,
    ansible_env,
    make_fleet,
    wait_for,
)

pytestmark = pytest.mark.integration

# The variable the inventory reads the key from, as the example inventories read theirs.
KEY_VAR = "SGLANG_FLEET_TRIAL_API_KEY"
KEY = "sk-trial-kept-7c41e9b2d05a"


@pytest.fixture
def keyed_node(tmp_path):
    """One simulated node whose inventory reads sglang_server_api_key from KEY_VAR, deployed
    ready with the variable set."""
    fleet = make_fleet(tmp_path, hosts=1, time_factor=0.005, tp=SMALL_TP)
    fleet.update_group_vars("sglang_servers", {
        "sglang_server_api_key": "{{ lookup('ansible.builtin.env', '" + KEY_VAR + "') }}"})
    try:
        run = cli(fleet, "deploy", tmp_path / "runs" / "deploy", key=KEY)
        assert run.returncode == 0, run.stdout[-3000:]
        yield fleet
    finally:
        fleet.kill_leftovers()


def cli(fleet, command: str, run_dir: Path, *more: str, key: str | None = None
        ) -> subprocess.CompletedProcess:
    """sglang-fleet as an operator's shell (or cron job) runs it: KEY_VAR set only when given."""
    env = {k: v for k, v in ansible_env().items() if k != KEY_VAR}
    if key is not None:
        env[KEY_VAR] = key
    return subprocess.run(
        [str(BIN / "sglang-fleet"), command, "-i", str(fleet.inventory), "--run-dir",
         str(run_dir), "-e", json.dumps(fleet.with_stores(**FAST_GATE)), *more],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=600)


def crash(fleet) -> int:
    """SIGKILL the server's main process, as the OOM killer or an operator would."""
    pid = fleet.main_pid("sim-node-1")
    assert pid, "the keyed node runs a server"
    os.kill(pid, signal.SIGKILL)
    return pid


def words(text: str) -> str:
    return " ".join(text.split())


def assert_refused_and_down(fleet, out: str) -> None:
    text = words(out)
    assert ("sglang_server_api_key resolves to nothing, but this deployment last started "
            "with it (config ") in text, out[-4000:]
    assert "sglang_server_drop_secrets: [sglang_server_api_key]" in text
    assert KEY not in out
    # Not brought back open: nothing of the deployment runs, nothing answers on its port.
    wait_for(lambda: fleet.processes("sim-node-1") == [], timeout=60)
    with pytest.raises(requests.ConnectionError):
        requests.get(fleet.url("sim-node-1") + "/v1/models", timeout=5)
    bundles = list((Path(fleet.extra["sglang_fleet_evidence_dir"]) / "sim-node-1").iterdir())
    assert bundles, "the evidence of the failure is kept"
    assert (bundles[-1] / "summary.json").exists()


def test_recover_without_the_key_fails_naming_it_and_never_restarts_open(keyed_node, tmp_path):
    crash(keyed_node)
    run = cli(keyed_node, "recover", tmp_path / "runs" / "recover")
    assert run.returncode == 1, run.stdout[-4000:]
    assert_refused_and_down(keyed_node, run.stdout)
    assert "sim-node-1: stopped and freed, not redeployed: configuration " in words(run.stdout)
    assert "failed again" not in run.stdout
    # With the variable set again the same command brings it back, with its key.
    again = cli(keyed_node, "recover", tmp_path / "runs" / "again", key=KEY)
    assert again.returncode == 0, again.stdout[-4000:]
    url = keyed_node.url("sim-node-1") + "/v1/models"
    assert requests.get(url, timeout=10).status_code == 401
    assert requests.get(url, headers={"Authorization": f"Bearer {KEY}"},
                        timeout=10).status_code == 200


def test_watch_recover_from_cron_without_the_key_never_restarts_open(keyed_node, tmp_path):
    crash(keyed_node)
    run = cli(keyed_node, "watch", tmp_path / "runs" / "watch", "--recover", "--count", "1",
              "--interval", "1")
    out = run.stdout
    assert "recovering sim-node-1" in out, out[-4000:]
    assert "sim-node-1: not recovered: " in out
    assert run.returncode != 0, out[-4000:]
    assert_refused_and_down(keyed_node, out)


# ---- stopping needs only the identity: a broken secret never keeps a hung server up -------

BROKEN = {"sglang_server_api_key": "x",  # refused by the LaunchSpec: 1 character long
          "sglang_server_extra_args": ["--no-such-flag"]}


def test_recover_stops_a_hung_server_whatever_else_the_inventory_breaks(keyed_node, tmp_path):
    """The inventory no longer builds (a one-character key, an unknown flag): recovery still
    judges the hung server by the LaunchSpec the node started it from, keeps the evidence and
    stops it, then refuses the restart naming what is broken."""
    pids = [p["pid"] for p in keyed_node.server_processes("sim-node-1")]
    procs.signal_pids(pids, signal.SIGSTOP)  # frozen: a hung server, /health times out
    keyed_node.set_host_vars("sim-node-1", BROKEN)  # the inventory, as a broken vault leaves it
    try:
        run = cli(keyed_node, "recover", tmp_path / "runs" / "recover", key=KEY)
    finally:
        procs.signal_pids(pids, signal.SIGCONT)
    out = words(run.stdout)
    # A host failed after the node was touched (stopped): exit 1, not 2 (no node touched).
    assert run.returncode == 1, run.stdout[-4000:]
    assert "[sim-node-1] the inventory's settings are invalid (" in out
    assert "sglang_server_api_key=<secret>: is 1 characters long" in out
    assert "HEALTH [sim-node-1] unhealthy" in run.stdout
    assert "sim-node-1: stopped and freed, not redeployed: configuration " in out
    assert keyed_node.processes("sim-node-1") == [], "the hung server was stopped"
    assert all(not os.path.exists(f"/proc/{pid}") for pid in pids)
    bundles = list((Path(keyed_node.extra["sglang_fleet_evidence_dir"]) / "sim-node-1").iterdir())
    assert bundles and (bundles[-1] / "summary.json").exists()
    assert KEY not in run.stdout
