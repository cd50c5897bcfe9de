# -*- coding: utf-8 -*-
# Reads a server log within stated bounds: the start of the current run (its start-up lines,
# up to HEAD_BYTES from where the run began) and the end (the last TAIL_BYTES), with a marker
# line between them naming how much was not read. A regular file is read by seeking; a pipe
# is read once through, keeping only the head and a rolling tail, up to STREAM_LIMIT bytes;
# a device (/dev/zero) is refused. Binary bytes are decoded with replacement characters.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import stat

from .logphase import gap_line

MIB = 1 << 20
HEAD_BYTES = 1 * MIB  # start-up lines of the current run
TAIL_BYTES = 8 * MIB  # the latest lines
STREAM_LIMIT = 2048 * MIB  # a pipe is read no further than this
_CHUNK = MIB


class LogUnreadable(Exception):
    """The path is not a log that can be read (missing, a folder, a device, no permission)."""


class LogText(object):
    """What was read: the text (head, gap line, tail), the file's modification time (None for
    a pipe), the bytes of the file or stream, the bytes left out, and a note saying so."""

    __slots__ = ("text", "mtime", "size", "skipped", "note", "whole")

    def __init__(self, text, mtime, size, skipped, note):
        self.text, self.mtime, self.size, self.skipped, self.note = text, mtime, size, \
            skipped, note
        self.whole = skipped == 0  # line numbers then count from the file's first line


def _decode(data):
    return data.decode("utf-8", "replace")


def _joined(head, tail, skipped):
    if not skipped:
        return _decode(head + tail)
    # Cut at line ends: half a line on either side of the gap says nothing.
    cut = head.rfind(b"\n")
    head = head[:cut + 1] if cut >= 0 else b""
    cut = tail.find(b"\n")
    tail = tail[cut + 1:] if cut >= 0 else tail
    return _decode(head) + gap_line(skipped) + _decode(tail)


def _note(skipped, head, tail):
    if not skipped:
        return ""
    return ("read the first %s and the last %s; %s in between not read"
            % (_size(head), _size(tail), _size(skipped)))


def _size(n):
    return "%d MiB" % (n // MIB) if n >= MIB else "%d KiB" % max(1, n // 1024)


def read_bounded(path, start=0, head=HEAD_BYTES, tail=TAIL_BYTES):
    """The log at `path` from byte `start` (where the current run began, when known), its
    first `head` and last `tail` bytes at most."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise LogUnreadable("%s: %s" % (path, exc.strerror)) from exc
    if stat.S_ISDIR(info.st_mode):
        raise LogUnreadable("%s: is a folder, not a log" % path)
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        raise LogUnreadable("%s: is a device, not a log" % path)
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(info.st_mode):  # a named pipe, /dev/stdin from a pipe
                return read_stream(f, head, tail)
            size = info.st_size
            start = start if 0 <= start <= size else 0
            length = size - start
            f.seek(start)
            if length <= head + tail:
                return LogText(_decode(f.read(length)), info.st_mtime, size, 0, "")
            first = f.read(head)
            f.seek(size - tail)
            last = f.read(tail)
    except (OSError, IOError) as exc:
        raise LogUnreadable("%s: %s" % (path, exc.strerror)) from exc
    skipped = length - head - tail
    return LogText(_joined(first, last, skipped), info.st_mtime, size, skipped,
                   _note(skipped, head, tail))


def read_stream(f, head=HEAD_BYTES, tail=TAIL_BYTES, limit=STREAM_LIMIT):
    """A stream read once through: its first `head` bytes and a rolling last `tail` bytes,
    stopping after `limit` bytes."""
    first = b""
    kept = []
    kept_bytes = total = 0
    while total < limit:
        chunk = f.read(min(_CHUNK, limit - total))
        if not chunk:
            break
        total += len(chunk)
        if len(first) < head:
            take = head - len(first)
            first += chunk[:take]
            chunk = chunk[take:]
        if chunk:
            kept.append(chunk)
            kept_bytes += len(chunk)
            while kept and kept_bytes - len(kept[0]) >= tail:
                kept_bytes -= len(kept.pop(0))
    last = b"".join(kept)
    if len(last) > tail:
        last = last[-tail:]
    skipped = total - len(first) - len(last)
    note = _note(skipped, head, tail)
    if total >= limit:
        note = ("stopped reading after %s; " % _size(limit)) + (note or "read all of it")
    return LogText(_joined(first, last, skipped), None, total, skipped, note)
