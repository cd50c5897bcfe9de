"""A simulated `sglang::detokenizer`: present, titled like SGLang's, dies with its parent."""

from __future__ import annotations

import signal
import sys

from setproctitle import setproctitle

from sglang_fleet.sim.scheduler import die_with_parent


def main() -> None:
    setproctitle("sglang::detokenizer")
    die_with_parent(int(sys.argv[1]))
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
