"""Shared-memory cleanup stays in its lane: in a folder shared with others it removes only
segments bound to the deployment's last run (a PID of that run in the name where SGLang and
torch put it, or seen open by that run's processes), never a bystander's or another
deployment's of the same name family."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from sglang_fleet.node.process import shm


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def run(tmp_path):
    """A deployment whose last run is over: its state file, its shm folder, its marker."""
    folder = tmp_path / "shm"
    folder.mkdir()
    state = tmp_path / "run" / "d-30000.pid"
    state.parent.mkdir()
    main = dead_pid()
    state.write_text(json.dumps({"pid": main, "started_at": time.time() - 60}))
    return {"shm": folder, "state": state, "main": main,
            "marker": f"n:{uuid.uuid4().hex}"}  # nothing runs with it


def touch(folder, name):
    path = folder / name
    path.write_bytes(b"x")
    return path


def test_creator_pids_are_read_where_sglang_and_torch_put_them():
    assert shm.creator_pid("sgl_shm_mq_4242_0a1b2c3d") == 4242
    assert shm.creator_pid("sgl_shm_nodecheck_17_deadbeef") == 17
    assert shm.creator_pid("multi_tokenizer_args_99") == 99
    assert shm.creator_pid("torch_321_1804289383_0") == 321
    assert shm.creator_pid("psm_4242abcd") is None
    assert shm.creator_pid("nccl-abcdef") is None
    assert shm.record_path("/o/run/d-30000.pid") == "/o/run/d-30000.shm.json"


def test_only_segments_bound_to_the_last_run_are_removed_from_a_shared_folder(run):
    """Trial: in a shm folder shared with others the cleanup removed a bystander's psm_* and
    torch_* files and another deployment's segment ("4 leaked segments removed")."""
    ours = dead_pid()
    shm.record_run(str(run["state"]), [ours])  # as the gate or the stop found it
    record = json.loads((run["state"].parent / "d-30000.shm.json").read_text())
    record["segments"] = ["psm_5f3a9c"]  # seen open by one of the run's processes
    (run["state"].parent / "d-30000.shm.json").write_text(json.dumps(record))
    mine = [touch(run["shm"], n) for n in (
        f"sgl_shm_mq_{run['main']}_0a1b2c3d", f"sgl_shm_mm_{ours}_11223344",
        f"torch_{ours}_1804289383_0", f"multi_tokenizer_args_{run['main']}", "psm_5f3a9c")]
    other = dead_pid()
    theirs = [touch(run["shm"], n) for n in (
        "psm_bystander01", f"torch_{other}_846930886_0", f"sgl_shm_mq_{other}_99887766",
        "nccl-AbCdEf", "sglang_loads_other_1a2b3c4d.shm")]
    link = run["shm"] / f"sgl_shm_mq_{ours}_ffffffff"
    link.symlink_to(theirs[0])
    remove, kept = shm.leaked_segments(str(run["shm"]), str(run["state"]), run["marker"],
                                       os.getuid())
    assert sorted(remove) == sorted(str(p) for p in mine)
    assert kept == []


def test_a_record_of_an_earlier_run_binds_nothing(run):
    ours = dead_pid()
    shm.record_run(str(run["state"]), [ours])
    state = json.loads(run["state"].read_text())
    run["state"].write_text(json.dumps(dict(state, pid=None, started_at=time.time() - 5)))
    touch(run["shm"], f"sgl_shm_mq_{ours}_0a1b2c3d")
    assert shm.leaked_segments(str(run["shm"]), str(run["state"]), run["marker"],
                               os.getuid()) == ([], [])


def test_the_run_records_its_processes_and_the_segments_they_hold(run, tmp_path):
    held = run["shm"] / "psm_0011aabb"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nf = open(sys.argv[1], 'wb')\nprint('open', flush=True)\n"
        "time.sleep(60)"), str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        touch(run["shm"], "psm_notours")
        record = shm.record_run(str(run["state"]), [holder.pid], str(run["shm"]))
        assert record["pids"] == [holder.pid] and record["segments"] == ["psm_0011aabb"]
        # Still held open: kept, not removed.
        assert shm.leaked_segments(str(run["shm"]), str(run["state"]), run["marker"],
                                   os.getuid()) == ([], [str(held)])
    finally:
        holder.kill()
        holder.wait()
    assert shm.leaked_segments(str(run["shm"]), str(run["state"]), run["marker"],
                               os.getuid()) == ([str(held)], [])
    # The next run starts its own record.
    state = json.loads(run["state"].read_text())
    run["state"].write_text(json.dumps(dict(state, started_at=time.time())))
    assert shm.record_run(str(run["state"]), [], str(run["shm"]))["segments"] == []
