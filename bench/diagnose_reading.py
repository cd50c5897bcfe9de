"""How long `sglang-fleet diagnose` takes on a gigabyte piped in, and the memory it needs.

    .venv/bin/python bench/diagnose_reading.py [--gib 1]

Pipes binary data mixed with log lines and escape sequences (the worst a copied log holds)
into `sglang-fleet diagnose -` and prints the seconds, the command's peak resident memory and
what it said about the bounds it read within (the target: seconds, under 200 MB).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

from test_diagnose import _diagnose_stdin, binary_chunk  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    args = parser.parse_args()
    chunk = binary_chunk()
    size = int(args.gib * (1 << 30))
    code, out, seconds, peak = _diagnose_stdin(chunk, size // len(chunk) + 1)
    bounds = next((line for line in out.splitlines() if "not read" in line), "")
    print(f"diagnose on {args.gib:g} GiB through a pipe: exit {code}, {seconds:.1f} s, "
          f"peak {peak / (1 << 20):.0f} MB")
    print(f"  {bounds.strip()}")


if __name__ == "__main__":
    main()
