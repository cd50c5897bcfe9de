# -*- coding: utf-8 -*-
# Small state files on the node (pid/digest records, gate observations): read tolerantly,
# written atomically so a reader never sees half a file.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

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
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)
