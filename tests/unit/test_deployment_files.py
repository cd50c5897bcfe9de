"""One node module writes a deployment's folders and files: changes, diffs that never show a
secret, modes, atomic replacement."""

from __future__ import annotations

import os
import stat

from sglang_fleet.node.deploy.deployfiles import apply, plan
from sglang_fleet.node.process.service import content_digest, files_digest


def _files(tmp_path, script=b"#!/bin/sh\necho v1\n", env=b"SGLANG_FLEET_API_KEY=sekrit-0123\n"):
    return ([{"path": str(tmp_path / "conf"), "mode": "0750"}],
            [{"path": str(tmp_path / "conf" / "x.launch.sh"), "content": script, "mode": "0755"},
             {"path": str(tmp_path / "conf" / "x.env"), "content": env, "mode": "0600",
              "secret": True}])


def test_first_write_creates_everything_with_its_mode(tmp_path):
    folders, files = _files(tmp_path)
    actions, diffs = plan(folders, files)
    assert [kind for kind, _ in actions] == ["mkdir", "write", "write"]
    apply(actions)
    assert stat.S_IMODE(os.stat(tmp_path / "conf").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(tmp_path / "conf" / "x.env").st_mode) == 0o600
    assert (tmp_path / "conf" / "x.launch.sh").read_bytes() == b"#!/bin/sh\necho v1\n"
    # Nothing left to do: a second pass changes nothing.
    assert plan(folders, files) == ([], [])
    assert not [p for p in os.listdir(tmp_path / "conf") if p.startswith(".")], "no temp files"


def test_diffs_show_changes_but_never_a_secret(tmp_path):
    folders, files = _files(tmp_path)
    apply(plan(folders, files)[0])
    folders, files = _files(tmp_path, script=b"#!/bin/sh\necho v2\n",
                            env=b"NCCL_PROTO=Simple\nSGLANG_FLEET_API_KEY=other-secret-456\n")
    actions, diffs = plan(folders, files)
    assert len(actions) == 2
    script, env = diffs
    assert "echo v1" in script["before"] and "echo v2" in script["after"]
    blob = repr(env)
    assert "sekrit" not in blob and "other-secret" not in blob
    # Every other line shows as it is; a secret's value only as its fingerprint, which
    # changes with the key.
    lines = env["prepared"].splitlines()
    assert lines[:2] == [f"--- before: {tmp_path}/conf/x.env (mode 0600)",
                         f"+++ after: {tmp_path}/conf/x.env (mode 0600)"]
    assert "+NCCL_PROTO=Simple" in lines
    before_key, = [x for x in lines if x.startswith("-SGLANG_FLEET_API_KEY=******** (sha256:")]
    after_key, = [x for x in lines if x.startswith("+SGLANG_FLEET_API_KEY=******** (sha256:")]
    assert before_key[1:] != after_key[1:]


def test_an_env_file_without_a_secret_shows_its_change_through_ansibles_masking(tmp_path):
    """The env file's content is a no_log parameter: Ansible hides any result string that
    holds it whole. The diff of an env file with no secret in it still shows its lines."""
    from ansible.module_utils.basic import remove_values

    folders, files = _files(tmp_path, env=b"# managed\nNCCL_PROTO=LL\n")
    apply(plan(folders, files)[0])
    new = b"# managed\nNCCL_PROTO=Simple\n"
    folders, files = _files(tmp_path, env=new)
    diffs = remove_values(plan(folders, files)[1], {new.decode()})
    assert len(diffs) == 1 and "VALUE_SPECIFIED" not in diffs[0]["prepared"]
    assert diffs[0]["prepared"].splitlines()[2:] == [
        "@@ -1,2 +1,2 @@", " # managed", "-NCCL_PROTO=LL", "+NCCL_PROTO=Simple", ""]


def test_a_mode_change_alone_is_a_change(tmp_path):
    folders, files = _files(tmp_path)
    apply(plan(folders, files)[0])
    os.chmod(tmp_path / "conf" / "x.env", 0o644)
    actions, diffs = plan(folders, files)
    assert [item["path"] for _, item in actions] == [str(tmp_path / "conf" / "x.env")]
    assert diffs[0]["prepared"].splitlines()[:2] == [
        f"--- before: {tmp_path}/conf/x.env (mode 0644)",
        f"+++ after: {tmp_path}/conf/x.env (mode 0600)"]
    apply(actions)
    assert stat.S_IMODE(os.stat(tmp_path / "conf" / "x.env").st_mode) == 0o600


def test_the_controller_and_the_node_name_the_files_alike(tmp_path):
    folders, files = _files(tmp_path)
    apply(plan(folders, files)[0])
    assert content_digest([(f["path"], f["content"]) for f in files]) == \
        files_digest([f["path"] for f in files])


def test_a_symlinked_folder_is_refused_and_its_target_untouched(tmp_path):
    """Trial: a `logs` folder that was a symlink to a 0700 folder elsewhere had its target
    chmod'ed 0755 (and the server log written into it)."""
    import pytest

    from sglang_fleet.node.deploy.deployfiles import DeployFilesError

    private = tmp_path / "elsewhere"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    root = tmp_path / "root"
    root.mkdir()
    (root / "logs").symlink_to(private)
    folders = [{"path": str(root), "mode": "0755"}, {"path": str(root / "logs"), "mode": "0755"}]
    with pytest.raises(DeployFilesError, match=r"logs is a symbolic link \(to .*elsewhere\).*"
                                               r"Fix: replace the link by a folder"):
        plan(folders, [])
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    assert list(private.iterdir()) == []


def test_the_node_line_names_each_changed_setting_with_its_old_and_new_value():
    """What the NODE line appends to `the launch files differ ...`: one `name: old -> new`
    per changed setting, a nested mapping by key, a setting new or removed as `unset`."""
    from sglang_fleet.node.deploy.nodecheck import setting_changes

    before = {"sglang_server_tp": 8, "sglang_server_nccl_profile": {"NCCL_PROTO": "LL",
                                                                     "NCCL_IB_DISABLE": 1},
              "sglang_server_mem_fraction_static": 0.9, "sglang_server_model_path": "/m"}
    after = {"sglang_server_tp": 4, "sglang_server_nccl_profile": {"NCCL_PROTO": "Simple",
                                                                    "NCCL_IB_DISABLE": 1},
             "sglang_server_num_continuous_decode_steps": 4, "sglang_server_model_path": "/m"}
    assert setting_changes(before, after) == [
        "sglang_server_mem_fraction_static: 0.9 -> unset",
        "sglang_server_nccl_profile.NCCL_PROTO: LL -> Simple",
        "sglang_server_num_continuous_decode_steps: unset -> 4",
        "sglang_server_tp: 8 -> 4"]
    assert setting_changes(before, dict(before)) == []
    many = {f"sglang_server_x{i}": i for i in range(9)}
    assert setting_changes({}, many, most=6)[-1] == (
        "3 more: sglang_server_x6, sglang_server_x7, sglang_server_x8")
    assert setting_changes({"a": "x" * 60}, {"a": "y"}) == [f"a: {'x' * 37}... -> y"]


def test_the_argument_record_is_private_and_never_written_through_a_link(tmp_path):
    """A run folder that is a link is refused before the record is written into its target;
    the record itself is 0600, as the rest of the run folder."""
    import pytest

    from sglang_fleet.node.deploy.argcheck import record_args_checked
    from sglang_fleet.node.deploy.deployfiles import DeployFilesError
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "linked").symlink_to(target)
    with pytest.raises(DeployFilesError, match=r"linked is a symbolic link \(to .*elsewhere\)"):
        record_args_checked(str(tmp_path / "linked" / "x.argcheck.json"), {"args": ["--a"]})
    assert list(target.iterdir()) == []
    record_args_checked(str(tmp_path / "run" / "x.argcheck.json"), {"args": ["--a"]})
    assert stat.S_IMODE(os.stat(tmp_path / "run" / "x.argcheck.json").st_mode) == 0o600


def test_the_change_summary_never_hides_a_setting_behind_the_keys_of_another():
    """Six stall windows changed beside an injected fault: the fault is shown with its values,
    and every change beyond six is named."""
    from sglang_fleet.node.deploy.nodecheck import setting_changes

    phases = ("allocating_kv_cache", "capturing_cuda_graph", "launching", "loading_weights",
              "starting_http", "warming_up")
    before = {"sglang_server_gate_stall_windows": {p: 10 for p in phases},
              "sglang_server_sim_fault": ""}
    after = {"sglang_server_gate_stall_windows": {p: 20 for p in phases},
             "sglang_server_sim_fault": "hang:loading_weights"}
    lines = setting_changes(before, after)
    assert len(lines) == 7
    assert "sglang_server_sim_fault:  -> hang:loading_weights" in lines
    assert lines[-1] == "1 more: sglang_server_gate_stall_windows.warming_up"
    shown = [line for line in lines[:-1] if "gate_stall_windows" in line]
    assert shown[0] == "sglang_server_gate_stall_windows.allocating_kv_cache: 10 -> 20"
    # Every change is either shown with its values or named.
    text = "\n".join(lines)
    assert all(p in text for p in phases)
