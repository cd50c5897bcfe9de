"""Reading an inventory's servers on the controller, with Ansible's own inventory code: for
the CLI's plans made before a playbook runs (slices, the hosts a recovery must hold)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SERVERS_GROUP = "sglang_servers"
ROUTERS_GROUP = "sglang_routers"


@dataclass(frozen=True)
class InventoryServers:
    values: dict[str, dict[str, Any]]  # each server: the named variables, templated
    groups: dict[str, list[str]]       # each inventory group: its hosts
    routers: list[str]
    selected: list[str]                # the servers a --limit leaves (all without one)


def read_servers(inventory: str | None, names: Sequence[str],
                 limit: str | None = None) -> InventoryServers:
    """The hosts of the sglang_servers group with the variables `names` (None where unset),
    the inventory's groups, its routers, and the servers `limit` selects."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[inventory] if inventory else None)
    variables = VariableManager(loader=loader, inventory=manager)
    # get_hosts warns on a group the inventory lacks; a fleet without routers is fine.
    hosts = manager.get_hosts(SERVERS_GROUP) if SERVERS_GROUP in manager.groups else []
    values = {}
    for host in hosts:
        hostvars = variables.get_vars(host=host)
        templar = Templar(loader=loader, variables=hostvars)
        values[host.name] = {n: templar.template(hostvars.get(n)) for n in names}
    groups = {name: [h.name for h in group.get_hosts()] for name, group in manager.groups.items()}
    routers = [h.name for h in manager.get_hosts(ROUTERS_GROUP)] \
        if ROUTERS_GROUP in manager.groups else []
    if limit:
        manager.subset(limit)
    selected = [h.name for h in manager.get_hosts(SERVERS_GROUP)] if values else []
    return InventoryServers(values, groups, routers, selected)
