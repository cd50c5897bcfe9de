"""A rollback on demand (`sglang-fleet rollback`, issue 42's first part) through real
ansible-playbook runs on the simulated fleet: an upgrade from SGLang 0.5.4.post3 to 0.5.23
that is ready is taken back to 0.5.4.post3 (the simulator serves either release's flags and
version). The rollback restarts the server on the configuration that was ready before, with
no install task; the ledger then rejects the upgrade for that deployment, and a recovery
never brings it back."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sglang_fleet.node.process import procs
from sglang_fleet.testfleet.local import FAST_GATE, make_fleet, sglang_fleet, wait_for

pytestmark = pytest.mark.integration


def ledger(fleet) -> list[dict]:
    path = Path(fleet.extra["sglang_fleet_ledger"])
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def words(text: str) -> str:
    return " ".join(text.split())


def server_info(fleet, host: str) -> dict:
    import requests
    return requests.get(fleet.url(host) + "/server_info", timeout=10).json()


@pytest.fixture
def fleet(tmp_path):
    fleet = make_fleet(tmp_path / "fleet", hosts=1)
    yield fleet
    fleet.stop()
    fleet.kill_leftovers()


def test_an_upgrade_rolled_back_on_demand_installs_nothing_and_stays_rejected(fleet, tmp_path):
    before = {"sglang_server_version": "0.5.4.post3"}
    common = ("-i", str(fleet.inventory), "-e", json.dumps(fleet.with_stores(**FAST_GATE)))

    first = sglang_fleet("deploy", *common, "-e", json.dumps(before),
                         "--run-dir", str(tmp_path / "before"))
    assert first.returncode == 0, first.stdout[-3000:]
    assert server_info(fleet, "sim-node-1")["version"] == "0.5.4.post3"
    good = [e for e in ledger(fleet) if e["kind"] == "ready"][-1]["config_hash"]

    upgrade = sglang_fleet("deploy", *common, "--run-dir", str(tmp_path / "upgrade"))
    assert upgrade.returncode == 0, upgrade.stdout[-3000:]
    assert server_info(fleet, "sim-node-1")["version"] == "0.5.23"
    upgraded = [e for e in ledger(fleet) if e["kind"] == "ready"][-1]["config_hash"]
    assert upgraded != good

    back = sglang_fleet("rollback", "--limit", "sim-node-1", *common,
                        "--run-dir", str(tmp_path / "rollback"))
    assert back.returncode == 0, back.stdout[-4000:]
    out = words(back.stdout)
    assert f"rolled back: configuration {upgraded} rejected, it was (ready" in out
    assert (f"roll back from {upgraded} to {good}, the last configuration ready before it; "
            "sglang_server_version differs") in out
    assert 'Keep it: set {"sglang_server_version": "0.5.4.post3"} in the inventory.' in out
    assert server_info(fleet, "sim-node-1")["version"] == "0.5.4.post3"
    assert [e for e in ledger(fleet) if e["kind"] == "ready"][-1]["config_hash"] == good
    rejected = [e for e in ledger(fleet) if e["kind"] == "rejected"]
    assert [(e["config_hash"], e["back_to"]) for e in rejected] == [(upgraded, good)]
    # Nothing was installed: no pip task ran in the rollback (its events), and the run's
    # page names the rollback.
    events = [json.loads(p.read_text()) for p in
              (tmp_path / "rollback" / "runner").glob("artifacts/*/job_events/*.json")]
    assert any(e.get("event") == "runner_on_ok" for e in events)
    assert not [e for e in events if e.get("event") == "runner_on_ok" and
                str((e.get("event_data") or {}).get("task_action")).endswith("pip")]
    page = (tmp_path / "rollback" / "run.json").read_text()
    assert f"configuration {upgraded} -> {good} (rollback)" in page

    # A crash of the rolled-back server restarts 0.5.4.post3 although the inventory names
    # 0.5.23: the ledger rejected it.
    pids = [p["pid"] for p in fleet.processes("sim-node-1")]
    procs.signal_pids(pids, signal.SIGKILL)
    wait_for(lambda: not fleet.processes("sim-node-1"), timeout=30)
    again = sglang_fleet("recover", "--limit", "sim-node-1", *common,
                         "--run-dir", str(tmp_path / "recover"))
    assert again.returncode == 0, again.stdout[-4000:]
    assert server_info(fleet, "sim-node-1")["version"] == "0.5.4.post3"
    assert upgraded not in [e["config_hash"] for e in ledger(fleet) if e["kind"] == "ready"][-1:]

    # Nothing earlier than 0.5.4.post3 was ready, and the upgrade is rejected: a second
    # rollback is refused before the server is touched.
    pid = fleet.processes("sim-node-1")[0]["pid"]
    refused = sglang_fleet("rollback", "--limit", "sim-node-1", *common,
                           "--run-dir", str(tmp_path / "refused"))
    assert refused.returncode != 0
    assert "not rolled back, nothing was touched" in words(refused.stdout)
    assert "nothing to roll back to" in words(refused.stdout)
    assert fleet.processes("sim-node-1")[0]["pid"] == pid
