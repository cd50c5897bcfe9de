"""What the release check's questions cost: N new command lines asked of SGLang 0.5.23 one at a
time (as N playbook runs with new lines each ask them), by a fresh interpreter per question
(`RefEnv.probe("check")`, how the check ran before its warm probe) or by the warm probe
(`RefEnv.check`, known/warm_probe.py; its start counted). Run each under bench/acct_cpu.py for
the CPU of every process, the warm probe's forked children included:

    .venv/bin/python bench/acct_cpu.py -- .venv/bin/python bench/release_check_cpu.py --fresh
    .venv/bin/python bench/acct_cpu.py -- .venv/bin/python bench/release_check_cpu.py --warm

The questions go straight to the release (no verdict cache), and the warm probe is this run's
own (a reference folder of its own for its name), stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from sglang_fleet.known import refenv

VERSION = "0.5.23"


def question(model_dir: str, i: int) -> dict:
    """The i-th distinct command line: a TP=8 layout on its own port."""
    return {"argv": ["--model-path", model_dir, "--tp-size", "8", "--port", str(30000 + i)],
            "gpu_memory_mb": 96 * 1024, "capability": [12, 0], "node_paths": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--fresh", action="store_true", help="a fresh interpreter per question")
    how.add_argument("--warm", action="store_true", help="the warm probe")
    parser.add_argument("-n", type=int, default=5, help="questions (default 5)")
    args = parser.parse_args()
    real = refenv.ensure(VERSION, quiet=True)
    model_dir = str(refenv.sample_model_dir())
    with tempfile.TemporaryDirectory() as own:
        os.environ["SGLANG_FLEET_REF_DIR"] = own
        env = refenv.RefEnv(VERSION, real.python, real.sglang_dir)
        began = time.monotonic()
        ask = env.check if args.warm else (lambda cases: env.probe("check", cases))
        try:
            for i in range(args.n):
                (verdict,) = ask([question(model_dir, i)])
                assert verdict["ok"], verdict
        finally:
            env.stop_warm_probe()
        wall = time.monotonic() - began
    print(f"{args.n} questions, {'warm probe' if args.warm else 'fresh interpreter each'}: "
          f"{wall:.1f} s wall, {wall / args.n:.2f} s each")


if __name__ == "__main__":
    main()
