"""Which servers a router fronts: the inventory group its sglang_router_workers_group names.
With several models in one inventory each router names its own deployment's group, and a
misspelt or empty group would leave that router serving nothing while the deploy carries on:
it is refused on the controller with the other router settings, before any node is touched."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from sglang_fleet.settings.problems import Problems
from sglang_fleet.settings.router import BY_NAME, PREFIX

VARIABLE = PREFIX + "workers_group"
DEFAULT = BY_NAME["workers_group"].default
SERVERS = "sglang_servers"
# Ansible's own groups: accepted, but never offered as a deployment's.
IMPLICIT = frozenset(("all", "ungrouped"))


def server_groups(groups: Mapping[str, Sequence[str]]) -> list[str]:
    """The inventory's groups that hold a server: those a router can front."""
    servers = set(groups.get(SERVERS, []))
    return sorted(name for name, hosts in groups.items()
                  if name not in IMPLICIT and servers & set(hosts))


def workers_group_errors(router: str, group: str | None,
                         groups: Mapping[str, Sequence[str]]) -> list[str]:
    """Why `router`'s workers group fronts no server ([] when it fronts one): a group the
    inventory does not have, or one without a host of the sglang_servers group."""
    group = str(group) if group else DEFAULT
    choices = server_groups(groups)
    fix = (f"set it to the group of the servers this router fronts, one of: {', '.join(choices)}"
           if choices else f"add the servers this router fronts to the {SERVERS} group")
    p = Problems(router, prefix="")
    if group not in groups:
        close = difflib.get_close_matches(group, choices, n=1)
        p.error(VARIABLE, group, "is not a group of this inventory: the router would front no "
                "server", f"did you mean {close[0]!r}? Or {fix}" if close else fix)
    elif not set(groups[group]) & set(groups.get(SERVERS, [])):
        p.error(VARIABLE, group, f"holds no host of the {SERVERS} group: the router would "
                "front no server", fix)
    return [str(e) for e in p.errors]
