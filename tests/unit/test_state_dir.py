"""The controller's state lives in one place: the project's stores, or SGLANG_FLEET_STATE_DIR."""

from __future__ import annotations

from sglang_fleet.runs.store import STATE_DIR_VAR, state_path


def test_project_stores_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv(STATE_DIR_VAR, raising=False)
    assert state_path("ledger.jsonl", tmp_path) == str(tmp_path / ".sglang-fleet" / "ledger.jsonl")
    assert state_path("evidence", tmp_path) == str(tmp_path / "evidence")


def test_state_dir_moves_everything(monkeypatch, tmp_path):
    monkeypatch.setenv(STATE_DIR_VAR, str(tmp_path / "state"))
    for name in ("ledger.jsonl", "results.jsonl", "evidence", "runs"):
        assert state_path(name, "/elsewhere") == str(tmp_path / "state" / name)


def test_the_suite_runs_with_its_own_state_dir():
    import os

    from sglang_fleet.testfleet.local import REPO

    assert os.environ[STATE_DIR_VAR] and not os.environ[STATE_DIR_VAR].startswith(str(REPO))
