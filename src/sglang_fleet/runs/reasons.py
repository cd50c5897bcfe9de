"""Failure reasons as an operator reads them: whole (never cut in a word, never without the
fix), and said once for every host that fails the same way.

Used by the stdout callback (ansible-playbook), the CLI's live progress and its final
table, so that a refused LaunchSpec reads the same everywhere.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from typing import Any

WIDTH = 100


_LIMIT = "--limit \0"  # a message's `--limit <host>`, standing for the hosts it applies to

# ansible-core 2.19 words a template error as the chain of what it was doing: "Task failed:
# Finalization of task args for 'ansible.builtin.set_fact' failed: Error while resolving value
# for 'sglang_server__launch': <cause>". The cause (an inventory's undef(hint=...), "'x' is
# undefined") is what the operator acts on; the chain names only the project's own internals.
_ANSIBLE_CHAIN = re.compile(r"^(?:Task failed: |Finalization of task args for '[^']*' failed: "
                            r"|Error while resolving value for '[^']*': )+")


def without_host(message: str, host: str) -> str:
    """The message without the LaunchSpec's `host <name>: ` and the playbooks' `<name>: `
    prefixes on its lines."""
    return re.sub(r"^(?:host )?" + re.escape(host) + r": ", "", message.strip(), flags=re.M)


def ansible_cause(message: str) -> str:
    """A task's failure message without ansible-core's chain of what it was doing."""
    return _ANSIBLE_CHAIN.sub("", message)


def group_by_reason(items: Iterable[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """(hosts, reason) for each distinct reason, in order of first appearance, hosts in
    natural order; each reason as it reads for any host (without_host), its `--limit
    <host>` naming all of its hosts."""
    groups: dict[str, list[str]] = {}
    for host, message in items:
        reason = re.sub(r"--limit " + re.escape(host) + r"\b", _LIMIT,
                        without_host(message, host))
        groups.setdefault(reason, []).append(host)
    out = []
    for reason, hosts in groups.items():
        hosts = sorted(hosts, key=host_order)
        out.append((hosts, reason.replace(_LIMIT, "--limit " + ",".join(hosts))))
    return out


def host_order(host: str) -> list[Any]:
    """node-2 before node-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", host)]


def wrap(text: str, width: int = WIDTH, indent: str = "    ",
         more: str = "      ") -> list[str]:
    """Each line of `text` wrapped at spaces (words, paths and flags are never broken),
    first lines indented by `indent`, continuations by `more`."""
    out: list[str] = []
    for line in text.splitlines() or [""]:
        out += textwrap.wrap(line, width=width, initial_indent=indent, subsequent_indent=more,
                             break_long_words=False, break_on_hyphens=False) or [indent]
    return out


def shorten(text: str, width: int) -> str:
    """The first line of `text`, cut at a word boundary to fit `width` with an ellipsis;
    only for a column whose full text is printed elsewhere."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if len(first) <= width:
        return first
    return textwrap.shorten(first, width=width, placeholder=" ...", break_long_words=False)


def counted(n: int, noun: str, plural: str = "") -> str:
    """'1 trial', '3 trials', '2 variables differ' needs counted(2, 'variable')."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def hosts_text(hosts: list[str]) -> str:
    return ", ".join(hosts)
