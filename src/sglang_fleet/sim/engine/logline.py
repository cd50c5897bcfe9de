"""SGLang's log line, for every simulated process (and the argument checks, which run before
the runtime exists)."""

from __future__ import annotations

import sys
import time


def log(message: str, prefix: str = "", end: str = "\n") -> None:
    """SGLang's log format: `[YYYY-mm-dd HH:MM:SS<prefix>] message`."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stdout.write(f"[{stamp}{prefix}] {message}{end}")
    sys.stdout.flush()
