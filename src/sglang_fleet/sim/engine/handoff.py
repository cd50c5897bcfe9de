"""How a simulated server hands its workers (schedulers, the data-parallel controller) the
parsed server arguments: through a pipe, pickled, as SGLang hands its subprocesses the
ServerArgs object (multiprocessing's spawn pickles it). A worker never parses the command line
again, and no argument shows in its command line."""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
from typing import Any


def spawn_with_args(module: str, options: list[str], args: Any,
                    pass_fds: tuple[int, ...]) -> subprocess.Popen:
    """A worker (`python -m module options`) handed the parsed server arguments through a
    pipe, as SGLang hands its workers the ServerArgs object (multiprocessing's spawn pickles
    it): nothing parses the command line again, and no argument shows in the worker's."""
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", module, *options, "--args-fd",
                                 str(read_fd)], pass_fds=(*pass_fds, read_fd))
    finally:
        os.close(read_fd)
    with os.fdopen(write_fd, "wb") as pipe:
        pickle.dump(dict(vars(args)), pipe)
    return proc


def read_args(fd: int) -> argparse.Namespace:
    """The server arguments spawn_with_args sent (from this worker's own parent)."""
    with os.fdopen(fd, "rb") as pipe:
        return argparse.Namespace(**pickle.load(pipe))  # noqa: S301 - the parent's own pipe
