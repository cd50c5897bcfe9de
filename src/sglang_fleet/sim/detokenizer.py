"""A simulated `sglang::detokenizer`: present, titled like SGLang's, dies with its parent."""

from __future__ import annotations

import signal
import sys

from setproctitle import setproctitle

from sglang_fleet.sim.scheduler import _die_with_parent


def main() -> None:
    setproctitle("sglang::detokenizer")
    _die_with_parent(int(sys.argv[1]))
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
