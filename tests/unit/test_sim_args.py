"""The simulator parses SGLang 0.5.23's command line the way SGLang's argparse does."""

from __future__ import annotations

import os
import subprocess
import sys

from sglang_fleet.sim.args.server_args import prepare_server_args
from sglang_fleet.sim.engine.graphs import backends


def parse_cli(*argv):
    code = ("import sys; from sglang_fleet.sim.args.server_args import prepare_server_args; "
            "prepare_server_args(sys.argv[1:])")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)


def test_prefix_flags_work_as_in_argparse():
    args = prepare_server_args(["--model-path", "/m", "--tp", "8"])
    assert args.tp_size == 8 and args.port == 30000 and args.host == "127.0.0.1"


def test_unknown_flag_is_rejected_like_sglang():
    proc = parse_cli("--model-path", "/m", "--no-such-flag")
    assert proc.returncode == 2
    assert "sglang serve: error: unrecognized arguments: --no-such-flag" in proc.stderr


def test_removed_cuda_graph_max_bs_is_an_argparse_error():
    proc = parse_cli("--model-path", "/m", "--cuda-graph-max-bs", "64")
    assert proc.returncode == 2 and "sglang serve: error:" in proc.stderr


def test_attention_backend_choices_are_the_pinned_release():
    proc = parse_cli("--model-path", "/m", "--attention-backend", "cutlass_mla")
    assert proc.returncode == 2 and "invalid choice: 'cutlass_mla'" in proc.stderr


def test_cuda_graph_disable_spellings():
    assert backends(prepare_server_args(["--model-path", "/m"]))[:2] == ("full", "breakable")
    for flags in (["--disable-cuda-graph"], ["--cuda-graph-backend-decode", "disabled"],
                  ["--disable-decode-cuda-graph"]):
        assert backends(prepare_server_args(["--model-path", "/m", *flags]))[0] == "disabled"
    # What the LaunchSpec renders for sglang_server_cuda_graph: false turns both off.
    both = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    assert backends(prepare_server_args(["--model-path", "/m", *both]))[:2] == (
        "disabled", "disabled")


def test_the_simulator_parses_with_the_pinned_release():
    code = ("import sys; from sglang_fleet.sim.args.server_args import prepare_server_args; "
            "prepare_server_args(sys.argv[1:])")
    import os
    old = subprocess.run([sys.executable, "-c", code, "--model-path", "/m",
                          "--attention-backend", "cutlass_mla"], capture_output=True, text=True,
                         env={**os.environ, "SGLANG_SIM_VERSION": "0.5.4.post3"})
    assert old.returncode == 0, old.stderr


def test_an_older_release_copies_its_long_parallel_names_as_from_cli_args_does():
    """0.5.4.post3 parses --tp-size into tensor_parallel_size and ServerArgs.from_cli_args
    copies it to tp_size (and pp, dp, ep likewise): the simulator serves that release too."""
    code = ("import sys; from sglang_fleet.sim.args.server_args import prepare_server_args; "
            "a = prepare_server_args(sys.argv[1:]); print(a.tp_size, a.pp_size, a.dp_size)")
    proc = subprocess.run([sys.executable, "-c", code, "--model-path", "/m", "--tp-size", "4",
                           "--dp-size", "2"], capture_output=True, text=True,
                          env={**os.environ, "SGLANG_SIM_VERSION": "0.5.4.post3"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["4", "1", "2"]
