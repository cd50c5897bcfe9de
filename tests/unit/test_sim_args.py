"""The simulator parses SGLang 0.5.23's command line the way SGLang's argparse does."""

from __future__ import annotations

import subprocess
import sys

from sglang_fleet.sim.server_args import cuda_graph_enabled, prepare_server_args


def parse_cli(*argv):
    code = ("import sys; from sglang_fleet.sim.server_args import prepare_server_args; "
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
    assert cuda_graph_enabled(prepare_server_args(["--model-path", "/m"]))
    for flags in (["--disable-cuda-graph"], ["--cuda-graph-backend-decode", "disabled"],
                  ["--disable-decode-cuda-graph"]):
        assert not cuda_graph_enabled(prepare_server_args(["--model-path", "/m", *flags]))
