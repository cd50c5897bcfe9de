"""The gate's stack sampling settings through a real deploy: a window and interval from the
inventory decide a capture hang by its stacks, long before the phase's window; sampling turned
off leaves it to the window, and the verdict says why."""

from __future__ import annotations

import re

import pytest

from sglang_fleet.testfleet.local import make_fleet

pytestmark = pytest.mark.integration

HANG = {"sglang_server_sim_fault": "hang:capturing_cuda_graph"}


def failure_block(output: str, host: str) -> str:
    """The host's failure message, up to the next host's."""
    start = output.index(f"{host}: stalled in capturing_cuda_graph: ")
    end = output.find("fatal: [", start)
    return output[start:end if end > 0 else None]


def test_stack_window_from_the_inventory_decides_and_sampling_off_leaves_it_to_the_window(
        tmp_path):
    fleet = make_fleet(tmp_path, hosts=2)
    # The capture window long enough that only the stacks can call the hang on sim-node-1.
    fleet.set_host_vars("sim-node-1", {
        **HANG, "sglang_server_stack_interval": 2, "sglang_server_stack_window": 8,
        "sglang_server_gate_stall_windows": {"capturing_cuda_graph": 120}})
    fleet.set_host_vars("sim-node-2", {
        **HANG, "sglang_server_stack_sampling": False,
        "sglang_server_gate_stall_windows": {"capturing_cuda_graph": 12}})
    try:
        run = fleet.deploy()
        out = run.output
        assert run.failed_hosts() == {"sim-node-1", "sim-node-2"}, out[-4000:]

        one = failure_block(out, "sim-node-1")
        m = re.match(r"sim-node-1: stalled in capturing_cuda_graph: no progress for (\d+) s and "
                     r"every rank's stack stayed on the same frames over 3 samples: CUDA graph "
                     r"capture at capture_one_shape \(", one)
        assert m, one[:1500]
        # The inventory's 8 s window decided, not the phase's 120 s (3 samples of 8 ranks may
        # take longer than the window on a loaded machine).
        assert 8 <= int(m.group(1)) < 90, one[:600]
        assert "stack sampling is off" not in one

        two = failure_block(out, "sim-node-2")
        assert re.match(r"sim-node-2: stalled in capturing_cuda_graph: no progress for \d+ s "
                        r"\(window 12 s\)\n", two), two[:600]
        assert ("stack_sampling: 'stack sampling is off: turned off (stack_sampling: false); "
                "hangs are judged by the phases'' windows alone'") in " ".join(two.split()), \
            two[:3000]
        # Turned off by the operator: said in the verdict, never warned.
        assert "[WARNING]: stack sampling is off" not in out
    finally:
        fleet.kill_leftovers()
