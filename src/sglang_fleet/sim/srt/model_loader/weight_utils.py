"""sglang/srt/model_loader/weight_utils.py: the shard loaders. _load_file reads one safetensors
file; a read that never returns (a hung filesystem) leaves the rank here."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# While a shard loads, its bytes are read in pieces, as safetensors reads a file from slow
# storage: the process's read counters climb all the way.
READ_PIECE = 2 << 20
# The bytes read go into one buffer, read over and over: a fresh bytes object per read would
# cost the process a page fault per page, ten times the read itself.
_PIECE_BUFFER = memoryview(bytearray(READ_PIECE))


def _load_file(path: str, seconds: float, piece_every: float,
               hang: Callable[[], None] | None = None) -> None:
    if hang is not None:
        hang()
    ends = time.monotonic() + seconds
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            read = 0
            while read < READ_PIECE:
                got = os.preadv(fd, [_PIECE_BUFFER[:READ_PIECE - read]], 0)
                if not got:
                    break
                read += got
            left = ends - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, piece_every))
    finally:
        os.close(fd)


ShardHang = Callable[[int], Callable[[], None] | None]


def buffered_multi_thread_safetensors_weights_iterator(files: list[str], seconds_each: float,
                                                       piece_every: float,
                                                       on_shard: ShardHang) -> None:
    """Every shard in turn (the simulator loads them one at a time); `on_shard(i)` returns what
    hangs the i-th read, if anything does."""
    for i, path in enumerate(files, start=1):
        _load_file(path, seconds_each, piece_every, on_shard(i))
