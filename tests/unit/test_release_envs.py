"""Release environments side by side: their names, the marker each holds, and which ones a
keep count prunes (never the serving one nor the ledger's previous ready and last known good)."""

from __future__ import annotations

import json

from sglang_fleet.launch.envs import env_id, env_of_settings, environment, pip_requirements
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.node.deploy import envs as node_envs
from sglang_fleet.recovery.decisions import kept_envs
from sglang_fleet.settings.server import TABLE
from sglang_fleet.testfleet.local import role_defaults

DEFAULTS = {s.variable: s.default for s in TABLE}


def spec(**overrides):
    settings = role_defaults()
    settings.update({"sglang_server_" + k: v for k, v in overrides.items()})
    result = build_launch_spec(settings, "node1")
    assert result["ok"], result["errors"]
    return result["spec"]


def test_an_environment_is_named_by_its_sorted_requirement_lines():
    assert env_id(["sglang[all]==0.5.23", "py-spy"]) == env_id(["py-spy", "sglang[all]==0.5.23"])
    assert env_id(["sglang[all]==0.5.23", "py-spy"]) != env_id(["sglang[all]==0.5.22", "py-spy"])
    assert len(env_id(["x"])) == 12


def test_each_release_gets_its_own_pip_environment_and_the_launch_runs_its_python():
    a = spec(attention_backend="triton", version="0.5.4.post3")
    b = spec(attention_backend="triton")
    ea, eb = a["install"]["env"], b["install"]["env"]
    assert ea["id"] != eb["id"] and ea["kind"] == eb["kind"] == "pip"
    assert ea["requirements"] == ["sglang[all]==0.5.4.post3", "py-spy"]
    assert a["argv"][0] == ea["python"] == f"/opt/sglang-fleet/envs/{ea['id']}/bin/python"
    assert ea["marker"] == f"{ea['path']}/sglang-fleet-env.json"
    # The pip extra arguments (a local wheelhouse) do not rename the environment.
    assert spec(attention_backend="triton", pip_extra_args="--no-index")["install"]["env"] == eb


def test_an_existing_interpreter_and_the_plain_simulator_have_no_environment_of_ours():
    existing = spec(attention_backend="triton", install_mode="existing",
                    python="/srv/py/bin/python")
    assert existing["install"]["env"]["kind"] == "existing"
    assert existing["install"]["env"]["id"] is None
    assert existing["argv"][0] == "/srv/py/bin/python"
    assert environment("simulator", False, "/r", ["x==1"], "/py")["id"] is None
    assert environment("simulator", True, "/r", ["x==1"], "/py")["python"] == \
        f"/r/envs/{env_id(['x==1'])}/bin/python"


def test_the_ledger_settings_name_the_environment_a_configuration_ran_on():
    settings = {"sglang_server_install_mode": "pip", "sglang_server_version": "0.5.4.post3"}
    assert env_of_settings(settings, DEFAULTS) == env_id(
        pip_requirements("sglang[all]", "0.5.4.post3", ["py-spy"]))
    # Overrides (a recovery's) win, as in the LaunchSpec.
    moved = {**settings, "sglang_server_overrides": {"sglang_server_version": "0.5.23"}}
    assert env_of_settings(moved, DEFAULTS) == env_id(
        pip_requirements("sglang[all]", "0.5.23", ["py-spy"]))
    assert env_of_settings({"sglang_server_install_mode": "existing"}, DEFAULTS) is None


def _ready(version, config_hash):
    return {"kind": "ready", "host": "h", "config_hash": config_hash,
            "settings": {"sglang_server_install_mode": "pip", "sglang_server_version": version}}


def test_a_prune_keeps_the_previous_ready_and_the_last_known_good_environments():
    a, b, c = (env_of_settings(_ready(v, "")["settings"], DEFAULTS)
               for v in ("0.5.4.post3", "0.5.23", "0.5.22"))
    ledger = [_ready("0.5.4.post3", "A"), _ready("0.5.23", "B")]
    assert kept_envs(ledger, "h", "B", DEFAULTS) == [a]
    # B rolled back to A (B rejected), then C deployed: the previous ready and the last known
    # good are both A; B's environment is free to go.
    ledger += [{"kind": "rejected", "host": "h", "config_hash": "B"}, _ready("0.5.4.post3", "A"),
               _ready("0.5.22", "C")]
    assert kept_envs(ledger, "h", "C", DEFAULTS) == [a]
    assert b not in kept_envs(ledger, "h", "C", DEFAULTS) and c != a
    assert kept_envs(ledger, "other", "C", DEFAULTS) == []


def _env(root, ident, requirements, ready_at=None):
    folder = root / ident
    folder.mkdir(parents=True)
    (folder / "bin").mkdir()
    (folder / node_envs.MARKER).write_text(json.dumps(
        {"requirements": requirements, "installed_at": "2026-01-01T00:00:00+00:00",
         "ready_at": ready_at}))


def test_the_marker_makes_the_install_a_no_op_and_records_the_ready_time(tmp_path):
    marker = tmp_path / "e1" / node_envs.MARKER
    (tmp_path / "e1").mkdir()
    assert not node_envs.installed(str(marker), ["a==1"])  # a folder without one: unfinished
    assert node_envs.record_installed(str(marker), ["b", "a==1"], "t0") is True
    assert node_envs.installed(str(marker), ["a==1", "b"])
    assert node_envs.record_installed(str(marker), ["a==1", "b"], "t1") is False
    assert not node_envs.installed(str(marker), ["a==2", "b"])
    assert node_envs.record_ready(str(marker), "t2")
    assert json.loads(marker.read_text())["ready_at"] == "t2"
    assert oct(marker.stat().st_mode & 0o777) == "0o600"


def test_a_prune_removes_the_oldest_beyond_the_keep_count_and_never_a_protected_one(tmp_path):
    _env(tmp_path, "old", ["x==1"], "2026-01-01T00:00:00+00:00")
    _env(tmp_path, "mid", ["x==2"], "2026-01-02T00:00:00+00:00")
    _env(tmp_path, "never", ["x==3"])  # installed, never served ready: the oldest
    _env(tmp_path, "new", ["x==4"], "2026-01-03T00:00:00+00:00")
    (tmp_path / "unfinished").mkdir()  # no marker: not ours to judge
    assert node_envs.prune(str(tmp_path), 2, {"new", "old"}, check=True) == ["never", "mid"]
    assert (tmp_path / "never").exists()  # check mode removed nothing
    assert node_envs.prune(str(tmp_path), 3, {"new"}) == ["never"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mid", "new", "old", "unfinished"]
    # Protected ones stay even beyond the count.
    assert node_envs.prune(str(tmp_path), 1, {"new", "old", "mid"}) == []
