"""A mapping setting given with -e replaces the inventory's whole mapping: what it drops, said.

Ansible's extra variables win over every other source and replace a variable whole (its
default `hash_behaviour = replace`; `merge` is deprecated and would merge every dictionary of
every source, not just this one). So `-e '{"sglang_server_gate_stall_windows": {"launching":
20}}'` over an inventory that sets six windows leaves one: the other five go back to the role's
defaults, silently. That is what an experienced Ansible user expects of -e, and what the fleet
keeps; it names, before the run, each key the inventory (or the role's defaults) had that the
-e value lacks, per host, with the whole mapping to pass instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sglang_fleet.node.common.secrets import mask_secrets
from sglang_fleet.settings import router as router_settings
from sglang_fleet.settings import server as settings


def mapping_defaults() -> dict[str, dict[str, Any]]:
    """Every setting of both roles whose value is a mapping, with the role's default."""
    return {s.variable: dict(s.default or {}) for table in (settings.TABLE, router_settings.TABLE)
            for s in table if s.kind == "dict"}


def dropped_keys(given: dict[str, Any], inventory: dict[str, dict[str, Any]]
                 ) -> dict[str, dict[tuple[str, ...], list[str]]]:
    """{variable: {dropped keys: [hosts]}} for each mapping setting in `given` (the -e
    variables) that lacks keys the host's inventory value (else the role's default) has.
    `inventory`: each host's inventory values of the mapping settings (those it sets)."""
    defaults = mapping_defaults()
    out: dict[str, dict[tuple[str, ...], list[str]]] = {}
    for variable, value in given.items():
        if variable not in defaults or not isinstance(value, dict):
            continue
        for host in sorted(inventory):
            had = inventory[host].get(variable, defaults[variable])
            if not isinstance(had, dict):
                continue
            lost = tuple(sorted((str(k) for k in had if k not in value), key=str))
            if lost:
                out.setdefault(variable, {}).setdefault(lost, []).append(host)
    return out


def _hosts_text(hosts: list[str]) -> str:
    return ", ".join(hosts) if len(hosts) <= 4 else f"{', '.join(hosts[:3])} and " \
                                                    f"{len(hosts) - 3} more hosts"


def warnings(given: dict[str, Any], inventory: dict[str, dict[str, Any]]) -> list[str]:
    """One line per mapping setting and set of dropped keys, naming the hosts, the keys and
    their values (secrets masked), and the whole mapping to pass instead."""
    defaults = mapping_defaults()
    lines = []
    for variable, drops in dropped_keys(given, inventory).items():
        for lost, hosts in drops.items():
            had = inventory[hosts[0]].get(variable, defaults[variable])
            shown = mask_secrets({k: had[k] for k in had if str(k) in lost})
            whole = mask_secrets({**had, **given[variable]})
            lines.append(
                f"WARNING: -e {variable} replaces the whole mapping, it does not merge into it "
                f"(Ansible's extra variables replace a variable): on {_hosts_text(hosts)} it "
                f"drops {', '.join(f'{k}: {json.dumps(v)}' for k, v in shown.items())}, which "
                f"fall back to the role's defaults. Fix: pass the whole mapping, "
                f"-e '{json.dumps({variable: whole})}'")
    return lines


def inventory_mappings(inventory: Path, variables: list[str], limit: str | None = None
                       ) -> dict[str, dict[str, Any]]:
    """Each host's (of `limit`) own values of `variables` in `inventory` (hosts, group_vars,
    host_vars), as written, without extra variables and without templating anything."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(inventory)])
    if limit:
        manager.subset(limit)
    variable_manager = VariableManager(loader=loader, inventory=manager)
    out: dict[str, dict[str, Any]] = {}
    for host in manager.get_hosts():
        values = variable_manager.get_vars(host=host, include_hostvars=False)
        out[host.name] = {v: values[v] for v in variables if v in values}
    return out


def replacement_warnings(inventory: Path | None, given: dict[str, Any],
                         limit: str | None = None) -> list[str]:
    """The warnings for a run with these -e variables over this inventory; none when no mapping
    setting is given, or when the inventory cannot be read here (Ansible will say why)."""
    variables = [v for v in given if v in mapping_defaults() and isinstance(given[v], dict)]
    if not variables or inventory is None:
        return []
    try:
        found = inventory_mappings(inventory, variables, limit)
    except Exception:  # noqa: BLE001 - a vault, a plugin: the run itself reports it
        return []
    return warnings(given, found)
