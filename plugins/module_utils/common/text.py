# -*- coding: utf-8 -*-
# Text that came from a node (log lines, process titles, HTTP bodies) made inert before it is
# shown or written anywhere: a terminal, JSON, JUnit XML, HTML. A log line can hold escape
# sequences that clear the screen, move the cursor over earlier output, set the terminal's
# title, or bytes that make an XML document invalid; each such character is shown as text
# (`\x1b`, `\x00`, `\u202e`) instead. Pure Python; shipped to nodes as module_utils and
# imported by the controller package as sglang_fleet.node.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# Colour codes (SGR: ESC [ digits m) change only how text looks: node data has them removed;
# the controller's own output keeps the colours it adds itself.
SGR = re.compile(r"\x1b\[[0-9;]*m")
# C0 controls but tab and newline, DEL and C1 controls (\x9b is a one-byte CSI), the Unicode
# controls that reorder or hide text (bidi overrides and isolates, zero-width marks), the BOM,
# and what XML 1.0 cannot hold (surrogates, U+FFFE, U+FFFF).
_UNSAFE = re.compile(u"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069"
                     u"\ufeff\ud800-\udfff\ufffe\uffff]")
_UNSAFE_LINE = re.compile(_UNSAFE.pattern[:-1] + u"\n]")


def _escaped(match):
    code = ord(match.group(0))
    if code == 0x0a:
        return "\\n"
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code


def inert(text, keep_newlines=True, keep_colour=False):
    """`text` with every control character shown as an escape (`\\x1b`), so that it can be
    printed or written into JSON, XML or HTML as the characters it holds. Newlines are kept
    unless `keep_newlines` is false (one log line: a newline in it is shown as `\\n`); colour
    codes are removed unless `keep_colour` (the controller's own coloured output)."""
    if text is None:
        return text
    if not isinstance(text, str):
        text = str(text)
    if "\x1b" in text and not keep_colour:
        text = SGR.sub("", text)
    pattern = _UNSAFE if keep_newlines else _UNSAFE_LINE
    if keep_colour and "\x1b" in text:
        parts = []
        last = 0
        for m in SGR.finditer(text):
            parts.append(pattern.sub(_escaped, text[last:m.start()]))
            parts.append(m.group(0))
            last = m.end()
        parts.append(pattern.sub(_escaped, text[last:]))
        return "".join(parts)
    return pattern.sub(_escaped, text)


def inert_data(value):
    """`inert` applied to every string in a JSON-like structure (dicts, lists, strings)."""
    if isinstance(value, str):
        return inert(value)
    if isinstance(value, dict):
        return dict((inert(k) if isinstance(k, str) else k, inert_data(v))
                    for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [inert_data(v) for v in value]
    return value
