"""tqdm progress bars as SGLang's start-up draws them: redrawn with carriage returns on stderr.

Two formats: the shard loaders' BAR_FORMAT (sglang/srt/utils/common.py) and tqdm's default
`{l_bar}{bar}{r_bar}` used by the graph-capture loops. Rendering follows tqdm's format_meter
(elapsed/remaining as MM:SS, rate as `x.xxit/s` or `x.xxs/it` when slower than 1 it/s, a
ten-cell unicode bar when the output is not a terminal).
"""

from __future__ import annotations

import sys
import time

BAR_FORMAT = ("{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} "
              "[{elapsed}<{remaining}, {rate_fmt}]")
_PARTIAL = " ▏▎▍▌▋▊▉"


def format_interval(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours:d}:{m:02d}:{s:02d}" if hours else f"{m:02d}:{s:02d}"


def _bar(frac: float, width: int = 10) -> str:
    cells = frac * width
    full = int(cells)
    if full >= width:
        return "█" * width
    return ("█" * full + _PARTIAL[int((cells - full) * len(_PARTIAL))]).ljust(width)


class Bar:
    def __init__(self, desc: str, total: int, shards_format: bool, enabled: bool = True):
        self.desc, self.total = desc, total
        self.shards_format, self.enabled = shards_format, enabled
        self.n = 0
        self.start = time.monotonic()
        self.draw()

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self.draw()

    def update(self, n: int = 1) -> None:
        self.n += n
        self.draw()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def text(self) -> str:
        elapsed = time.monotonic() - self.start
        rate = self.n / elapsed if elapsed > 0 and self.n else None
        remaining = format_interval((self.total - self.n) / rate) if rate else "?"
        if rate is None:
            rate_fmt = "?it/s"
        elif rate < 1:
            rate_fmt = f"{1 / rate:5.2f}s/it"
        else:
            rate_fmt = f"{rate:5.2f}it/s"
        pct = 100 * self.n / self.total if self.total else 100.0
        if self.shards_format:
            return BAR_FORMAT.format(desc=self.desc, percentage=pct, n_fmt=self.n,
                                     total_fmt=self.total, elapsed=format_interval(elapsed),
                                     remaining=remaining, rate_fmt=rate_fmt)
        frac = self.n / self.total if self.total else 1.0
        desc = f"{self.desc}: " if self.desc else ""
        return (f"{desc}{pct:3.0f}%|{_bar(frac)}| {self.n}/{self.total} "
                f"[{format_interval(elapsed)}<{remaining}, {rate_fmt}]")

    def draw(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + self.text())
            sys.stderr.flush()
