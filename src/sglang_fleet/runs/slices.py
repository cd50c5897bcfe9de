"""Slices of a fleet for runs side by side, each multi-node server whole in one slice.

A fleet too large for one controller's run is deployed as several runs (parallel
ansible-runner jobs, the nodes of an AWX workflow), each with its own `--limit`. A slice that
holds part of a multi-node group would start a rank that waits at the rendezvous for nodes
another run deploys, so the deploy refuses it (whole_groups.py). This module plans slices that
never do: the units are the multi-node groups and the single-node hosts, weighed by their GPUs,
and each unit goes, largest first, to the slice with the fewest GPUs so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_fleet.runs.inventory_read import ROUTERS_GROUP, read_servers
from sglang_fleet.runs.inventory_read import SERVERS_GROUP as SERVERS_GROUP  # the CLI names it

DEFAULT_GPUS = 8  # the role's sglang_server_gpu_count default


class SliceError(ValueError):
    """A plan that cannot be made (a count of slices the fleet cannot fill)."""


@dataclass(frozen=True)
class ServerHost:
    name: str
    group: str | None  # sglang_server_group: the multi-node server the host is a node of
    gpus: int          # sglang_server_gpu_count


@dataclass(frozen=True)
class Unit:
    """What a slice takes whole: a multi-node group's nodes, or one single-node host."""
    group: str | None
    hosts: tuple[str, ...]
    gpus: int


@dataclass
class Slice:
    index: int
    units: list[Unit] = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return [h for u in self.units for h in u.hosts]

    @property
    def gpus(self) -> int:
        return sum(u.gpus for u in self.units)

    @property
    def groups(self) -> list[str]:
        return [u.group for u in self.units if u.group]


def units_of(hosts: list[ServerHost]) -> list[Unit]:
    """The fleet as units: each group with two or more nodes, and every other host alone."""
    members: dict[str, list[ServerHost]] = {}
    for h in hosts:
        if h.group:
            members.setdefault(h.group, []).append(h)
    units, placed = [], set()
    for h in hosts:
        if h.name in placed:
            continue
        nodes = members.get(h.group or "", [h])
        if len(nodes) < 2:
            nodes = [h]
        placed.update(n.name for n in nodes)
        units.append(Unit(h.group if len(nodes) > 1 else None,
                          tuple(sorted(n.name for n in nodes)), sum(n.gpus for n in nodes)))
    return units


def plan_slices(hosts: list[ServerHost], count: int) -> list[Slice]:
    """`count` slices, every multi-node group whole in one, GPUs balanced (largest unit first
    to the lightest slice; ties to the lower slice, so the plan is the same on every run)."""
    units = units_of(hosts)
    if count < 1:
        raise SliceError(f"--slices {count}: a plan needs at least one slice. Fix: --slices 1 "
                         f"or more")
    if count > len(units):
        raise SliceError(f"--slices {count}: the fleet's {len(hosts)} hosts make "
                         f"{len(units)} unit{'s' if len(units) != 1 else ''} to share "
                         f"(multi-node groups, single-node hosts), so some slices would be "
                         f"empty. Fix: --slices {max(len(units), 1)} or fewer")
    slices = [Slice(i + 1) for i in range(count)]
    for unit in sorted(units, key=lambda u: (-u.gpus, u.hosts)):
        lightest = min(slices, key=lambda s: (s.gpus, s.index))
        lightest.units.append(unit)
    return slices


# ---- reading the inventory --------------------------------------------------------------

def _int_or(value: Any, default: int, host: str, name: str) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise SliceError(f"{host}: {name}={value!r} is not a whole number. Fix: set it to "
                         f"the node's GPU count") from None
    return number


def read_server_hosts(inventory: str | None) -> tuple[list[ServerHost], list[str]]:
    """The hosts of the sglang_servers group (their group and GPUs, as the inventory sets
    them) and the routers, read with Ansible's own inventory code."""
    read = read_servers(inventory, ("sglang_server_group", "sglang_server_gpu_count"))
    servers = [ServerHost(name, str(v["sglang_server_group"]) if v["sglang_server_group"]
                          else None,
                          _int_or(v["sglang_server_gpu_count"], DEFAULT_GPUS, name,
                                  "sglang_server_gpu_count"))
               for name, v in read.values.items()]
    return servers, read.routers


# ---- saying and writing the plan --------------------------------------------------------

def plan_lines(slices: list[Slice], routers: list[str], out: Path | None) -> list[str]:
    lines = []
    if routers:
        lines.append(f"routers first, in one run: --limit {ROUTERS_GROUP} "
                     f"({', '.join(routers)})")
    for s in slices:
        groups = f", groups {', '.join(s.groups)}" if s.groups else ""
        where = f"--limit @{out / slice_file(s)}" if out else f"--limit {','.join(s.hosts)}"
        count = f"{len(s.hosts)} host{'s' if len(s.hosts) != 1 else ''}"
        lines.append(f"slice {s.index}: {count}, {s.gpus} GPUs{groups}: {where}")
    return lines


def slice_file(s: Slice) -> str:
    return f"slice-{s.index}.limit"


def write_limit_files(slices: list[Slice], out: Path) -> list[Path]:
    """One file per slice, a host per line: the form `--limit @FILE` reads. Each is written
    whole (to a temporary name, then renamed), so a run never reads half a slice."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for s in slices:
        path = out / slice_file(s)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text("".join(f"{h}\n" for h in s.hosts))
        partial.replace(path)
        written.append(path)
    return written
