"""Releases side by side on a node (issue 42): with pip release environments, through real
ansible-playbook runs of the CLI on the simulated fleet. Release A is deployed into its own
venv, release B into a second one (A kept), a rollback to A installs nothing, and a third
requirement set prunes B by the keep count (A, the last known good, stays).

The environments are made by a real pip (venv, install, marker) from a local wheelhouse of
tiny wheels built in the test (sglang_fleet.testfleet.wheels: `sglang-fleet-sim-release` at
each catalogued release, whose .pth puts the simulator on the venv's path), with
`--no-index`: nothing is downloaded. The simulator then runs from each venv's own Python
(sglang_server_sim_pip)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_fleet.launch.envs import env_id
from sglang_fleet.testfleet.local import FAST_GATE, sglang_fleet
from sglang_fleet.testfleet.wheels import (
    EXTRA_PACKAGE,
    RELEASE_PACKAGE,
    sim_pip_settings,
    sim_wheelhouse,
)

pytestmark = pytest.mark.integration
HOST = "sim-node-1"


def envs_on_node(fleet) -> dict[str, dict]:
    """{id: marker} of the node's finished release environments."""
    folder = fleet.host_root(HOST) / "envs"
    return {p.parent.name: json.loads(p.read_text())
            for p in sorted(folder.glob("*/sglang-fleet-env.json"))}


def events(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in
            (run_dir / "runner").glob("artifacts/*/job_events/*.json")]


def task_results(run_dir: Path, task: str) -> list[tuple[str, bool]]:
    """(event, changed) of each result of the task named `task` in a run."""
    return [(e["event"], bool(((e.get("event_data") or {}).get("res") or {}).get("changed")))
            for e in events(run_dir)
            if e.get("event") in ("runner_on_ok", "runner_on_skipped", "runner_on_failed")
            and (e.get("event_data") or {}).get("task") == task]


def server_info(fleet) -> dict:
    import requests
    return requests.get(fleet.url(HOST) + "/server_info", timeout=10).json()


INSTALL = "Install the pinned SGLang and py-spy into the release's environment"
LOOK = "Look for the release's environment on the node"


def test_releases_side_by_side_a_rollback_installs_nothing_and_the_keep_count_prunes(
        one_node, tmp_path):
    fleet = one_node
    wheels = sim_wheelhouse(tmp_path / "wheelhouse")
    common = ("-i", str(fleet.inventory), "-e", json.dumps(fleet.with_stores(**FAST_GATE)))

    def deploy(name: str, version: str, extra_packages=None):
        settings = sim_pip_settings(wheels, version, keep=2, extra_packages=extra_packages)
        proc = sglang_fleet("deploy", *common, "-e", json.dumps(settings),
                            "--run-dir", str(tmp_path / name))
        assert proc.returncode == 0, proc.stdout[-4000:]
        return settings

    env_a = env_id([f"{RELEASE_PACKAGE}==0.5.4.post3"])
    env_b = env_id([f"{RELEASE_PACKAGE}==0.5.23"])
    env_c = env_id([f"{RELEASE_PACKAGE}==0.5.23", f"{EXTRA_PACKAGE}==1.0"])

    deploy("a", "0.5.4.post3")
    assert task_results(tmp_path / "a", INSTALL) == [("runner_on_ok", True)]
    assert list(envs_on_node(fleet)) == [env_a]
    marker = envs_on_node(fleet)[env_a]
    assert marker["requirements"] == [f"{RELEASE_PACKAGE}==0.5.4.post3"]
    assert marker["ready_at"]  # the server on it reached ready
    assert server_info(fleet)["version"] == "0.5.4.post3"
    script = next((fleet.host_root(HOST) / "conf").glob("*.launch.sh")).read_text()
    assert f"{fleet.host_root(HOST)}/envs/{env_a}/bin/python -m sglang_fleet.sim" in script

    b_settings = deploy("b", "0.5.23")
    assert sorted(envs_on_node(fleet)) == sorted([env_a, env_b])  # A kept
    assert server_info(fleet)["version"] == "0.5.23"

    # Nothing changed: the environment is found, pip does not run, and nothing changes.
    again = fleet.deploy(extra={**FAST_GATE, **b_settings})
    assert again.rc == 0, again.output[-3000:]
    assert again.changed_hosts() == set(), again.output[-3000:]

    back = sglang_fleet("rollback", "--limit", HOST, *common, "-e", json.dumps(b_settings),
                        "--run-dir", str(tmp_path / "rollback"))
    assert back.returncode == 0, back.stdout[-4000:]
    assert server_info(fleet)["version"] == "0.5.4.post3"
    # The rollback found A's environment and skipped the install: no pip ran.
    assert task_results(tmp_path / "rollback", LOOK) == [("runner_on_ok", False)]
    assert task_results(tmp_path / "rollback", INSTALL) == [("runner_on_skipped", False)]
    assert not [e for e in events(tmp_path / "rollback")
                if str((e.get("event_data") or {}).get("task_action")).endswith("pip")
                and e.get("event") == "runner_on_ok"]
    assert sorted(envs_on_node(fleet)) == sorted([env_a, env_b])

    # A third requirement set reaches ready: three environments, two kept. B (rolled back
    # from, rejected) goes; A, the previous ready and last known good, stays.
    deploy("c", "0.5.23", extra_packages=[f"{EXTRA_PACKAGE}==1.0"])
    assert sorted(envs_on_node(fleet)) == sorted([env_a, env_c])
    assert not (fleet.host_root(HOST) / "envs" / env_b).exists()
    pruned = [e["event_data"]["res"] for e in events(tmp_path / "c")
              if e.get("event") == "runner_on_ok" and e["event_data"].get("task") ==
              "Record the ready start on its release environment and prune the oldest"]
    assert [r["pruned"] for r in pruned] == [[env_b]]
