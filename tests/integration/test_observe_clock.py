"""The gate's observation on a real node: time is the node's monotonic clock, so a server whose
TZ differs from the node's, or a log without stamps, is judged as one written in step.

A process this test starts (a `sleep` carrying a deployment marker of the test's own) stands
for the server; its log is a file the test writes, line by line, as SGLang would. The stall
window (5 s) is ten times the interval between lines, so that a loaded machine, which delays
an observation by seconds, cannot turn steady progress into a stall."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from sglang_fleet.node.health import gate
from sglang_fleet.node.process import procs

pytestmark = pytest.mark.integration

WINDOW = 5.0
WINDOWS = {p: WINDOW for p in ("launching", "loading_weights", "allocating_kv_cache",
                            "capturing_cuda_graph", "starting_http", "warming_up")}


@pytest.fixture
def node(tmp_path):
    marker = f"clock-test:{uuid.uuid4().hex}"
    child = subprocess.Popen(["sleep", "300"], env={**os.environ, procs.MARKER_VAR: marker},
                             start_new_session=True)
    # Until the child has exec'd `sleep` it is a copy of this process, without the marker,
    # and the gate would call the server gone; a loaded machine can make that last a while.
    deadline = time.monotonic() + 30
    while procs.marker_of(child.pid) != marker and time.monotonic() < deadline:
        time.sleep(0.01)
    ident = procs.identity(child.pid)
    state = tmp_path / "server.pid"
    state.write_text(json.dumps({"pid": child.pid, "pid_start": ident["start_ticks"],
                                 "boot_id": ident["boot_id"], "started_at": time.time(),
                                 "marker": marker, "manager": "supervisor"}))
    p = {"marker": marker, "state_file": str(state), "log_file": str(tmp_path / "server.log"),
         "gate_state_file": str(tmp_path / "gate.json"), "manager": "supervisor",
         "unit_name": None, "host": "127.0.0.1", "port": 1, "serves_http": False,
         "health_timeout": 1.0, "gpu_backend": "simulated", "sim_dir": str(tmp_path / "gpus"),
         "gpu_timeout": 1.0, "kernel_log": "none", "cuda_graph": True,
         "stall_windows": WINDOWS, "ceilings": {k: 1000 for k in WINDOWS}, "wait": 0,
         "poll": 0.25}
    yield p
    child.kill()
    child.wait()


def stamp(offset_h: float | None) -> str:
    if offset_h is None:
        return ""
    return time.strftime("[%Y-%m-%d %H:%M:%S TP0] ", time.localtime(time.time() + offset_h * 3600))


@pytest.mark.parametrize("offset_h", [-3, 3, None], ids=["tz-3h", "tz+3h", "no-stamps"])
def test_the_servers_clock_never_decides_progress_or_a_stall(node, offset_h):
    log = Path(node["log_file"])
    log.write_text(f"{stamp(offset_h)}server_args=ServerArgs(tp_size=1)\n")
    seen = []
    for shard in range(1, 6):  # loading steadily: a line a second
        with log.open("a") as f:
            f.write(f"{stamp(offset_h)}Load weight begin. avail mem=70.00 GB\n"
                    f"Loading safetensors checkpoint shards: {shard * 20}% Completed | "
                    f"{shard}/5 [00:0{shard}<00:00,  1.00s/it]\n")
        seen.append(gate.judge(node, check_mode=False))
        time.sleep(0.5)
    assert [v["verdict"] for v in seen] == ["progressing"] * 5
    assert all(v["quiet_s"] < WINDOW for v in seen), [v["quiet_s"] for v in seen]
    with log.open("a") as f:  # a stamped last line (an undated bar would be dated by mtime)
        f.write(f"{stamp(offset_h)}Load weight end. type=LlamaForCausalLM, avail mem=60 GB\n")
    assert gate.judge(node, check_mode=False)["verdict"] == "progressing"
    # Then nothing: stalled after the window on the node's clock, not at once, not never.
    deadline = time.monotonic() + 60
    while True:
        verdict = gate.judge(node, check_mode=False)
        if verdict["verdict"] != "progressing" or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert verdict["verdict"] == "stalled", verdict
    assert WINDOW <= verdict["quiet_s"] < 4 * WINDOW, verdict["quiet_s"]
