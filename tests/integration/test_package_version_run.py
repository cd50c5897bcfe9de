"""A real ansible-playbook run of a collection whose version is not the installed package's:
the stdout callback, the filters and the action plugins each say both versions and the fix."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import sglang_fleet
from sglang_fleet.testfleet.local import BIN, REPO, ansible_env

pytestmark = pytest.mark.integration

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
"""
FILTER_TASK = PLAY + """
    - name: A filter that builds on the package
      ansible.builtin.debug:
        msg: "{{ 'ledger.jsonl' | sglang.fleet.sglang_fleet_state_path(None) }}"
      ignore_errors: true
"""
ACTION_TASK = PLAY + """
    - name: An action plugin that imports the package
      sglang.fleet.sglang_ledger:
        path: x.jsonl
        entry: {}
"""
SAID = ("the collection sglang.fleet is version 9.8.7 but the Python package sglang-fleet that "
        f"its plugins import is version {sglang_fleet.__version__}")
FIX = "Fix: pip install 'sglang-fleet==9.8.7' into the Python that runs ansible-playbook"


def _run(tmp_path: Path, playbook: str) -> tuple[int, str, str]:
    """ansible-playbook with the collection, at version 9.8.7, as the only one it finds."""
    fleet = tmp_path / "collections" / "ansible_collections" / "sglang" / "fleet"
    if not fleet.exists():
        fleet.mkdir(parents=True)
        for part in ("plugins", "meta"):
            (fleet / part).symlink_to(REPO / part)
        (fleet / "MANIFEST.json").write_text(json.dumps({"collection_info": {
            "namespace": "sglang", "name": "fleet", "version": "9.8.7"}}))
    (tmp_path / "play.yml").write_text(playbook)
    env = {k: v for k, v in ansible_env().items() if k != "ANSIBLE_CONFIG"}
    env.update({"ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections"),
                "ANSIBLE_STDOUT_CALLBACK": "sglang.fleet.sglang_fleet"})
    proc = subprocess.run([str(BIN / "ansible-playbook"), "play.yml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, " ".join(proc.stdout.split()), " ".join(proc.stderr.split())


def test_the_callback_and_a_filter_name_both_versions_and_the_fix(tmp_path):
    rc, stdout, stderr = _run(tmp_path, FILTER_TASK)
    assert f"[ERROR]: {SAID}" in stderr and FIX in stderr, stderr  # the callback, at the start
    assert "sglang.fleet.sglang_fleet_state_path' failed" in stdout, stdout
    assert SAID in stdout and FIX in stdout, stdout
    assert rc == 0  # the filter's task ignores its error


def test_an_action_plugin_stops_the_run_naming_both_versions_and_the_fix(tmp_path):
    rc, stdout, stderr = _run(tmp_path, ACTION_TASK)
    assert rc != 0
    assert SAID in stderr and FIX in stderr, stdout + stderr
    assert "PLAY RECAP" not in stdout  # the run stops at the plugin's load
    assert not (tmp_path / "x.jsonl").exists()
