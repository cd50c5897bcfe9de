# -*- coding: utf-8 -*-
# Small state files on the node (pid/digest records, gate observations): read tolerantly,
# written atomically so a reader never sees half a file.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import json
import os


def read_json(path):
    """The file's JSON, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, IOError, ValueError):
        return None


def write_json_atomic(path, data):
    """Write `data` whole, private (0600): these records name the deployment's settings and
    processes. The temporary file is created anew (never through a link left in its place)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)
