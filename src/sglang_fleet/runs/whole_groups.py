"""Whether a run holds each multi-node server whole.

A multi-node server (a TP=16 group across two nodes) starts, restarts and stops as one: its
ranks meet at one rendezvous, and a node left behind waits there until torch's store times out.
A run that holds only part of such a group (a `--limit`, a slice of the inventory for AWX job
slicing or parallel runner jobs, a `serial` batch, a canary) must be refused before it touches
a node. This module says why a run does not hold a host's group whole; the role's LaunchSpec
check (and the stop's identity check) refuse with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ansible.utils.helpers import pct_to_int

from sglang_fleet.launch.pd import keep_sides_serving

PLAN_HINT = "sglang-fleet plan --slices N writes limits that keep every group whole"
CANARY_VARIABLE = "sglang_fleet_canary"


class CanaryError(ValueError):
    """A sglang_fleet_canary that names no canary: the message names the value and the fix."""


def canary_hosts(canary: object, servers: Sequence[str]) -> list[str]:
    """The canary servers `sglang_fleet_canary` names among `servers` (the run's servers, in
    inventory order): one host, hosts separated by commas, or a percentage of the servers
    (rounded up, at least one, the first ones in inventory order). '' or None: none."""
    text = "" if canary is None else str(canary).strip()
    if not text:
        return []
    if not text.endswith("%"):
        return [h.strip() for h in text.split(",") if h.strip()]
    try:
        share = float(text[:-1])
    except ValueError:
        share = -1.0
    if not 0 < share < 100:
        raise CanaryError(f"{CANARY_VARIABLE}={text!r} is not a share of the servers. Fix: a "
                          "percentage above 0 and below 100 (e.g. 10%: the rest of the fleet "
                          "is the canaries' baseline), or a host name")
    count = max(1, -(-len(servers) * share // 100))
    if count >= len(servers):
        raise CanaryError(f"{CANARY_VARIABLE}={text} of {len(servers)} servers is every "
                          "server: no baseline would be left to judge the canaries against. "
                          "Fix: a smaller share, or more servers in the run")
    return list(servers[:int(count)])


def serial_batches(hosts: Sequence[str], serial: object) -> list[list[str]]:
    """The batches a play with `serial` runs `hosts` in, as ansible-playbook cuts them
    (PlaybookExecutor._get_serialized_batches): an int, a percentage, or a list of them whose
    last item repeats; 0 or less (or nothing) is one batch."""
    items = list(serial) if isinstance(serial, list | tuple) else \
        ([] if serial in (None, "") else [serial])
    items = items or [-1]
    left, batches, at = list(hosts), [], 0
    while left:
        size = pct_to_int(items[at], len(hosts))
        if size <= 0:
            batches.append(left)
            break
        batches.append(left[:size])
        left = left[size:]
        at = min(at + 1, len(items) - 1)
    return batches


def serial_with_routers(serial: object, servers: Sequence[str], routers: int,
                        sides: Sequence[set[str]] = ()) -> object:
    """The servers' play's `serial` once its routers run in it, ahead of the servers: the
    routers go in the first batch, each batch keeps the servers `serial` gives it (its
    percentages of the servers, not of the routers too), cut further so that no batch holds
    a whole PD side (`sides`, see pd.keep_sides_serving). Unchanged without either."""
    if not routers and not sides:
        return serial
    sizes = [len(batch) for batch in keep_sides_serving(serial_batches(servers, serial), sides)]
    if len(sizes) <= 1:
        return "100%"
    return [sizes[0] + routers, *sizes[1:]]


def _names(hosts: Sequence[str]) -> str:
    return ", ".join(hosts)


def split_group_errors(group: str, members: Sequence[str], run_hosts: Sequence[str],
                       serial: object = None, canaries: Sequence[str] = ()) -> list[str]:
    """Why this run does not hold `group` whole: `members` are the group's hosts in the
    inventory, `run_hosts` the play's hosts (after --limit, in inventory order), `serial` the
    deploy's sglang_fleet_serial, `canaries` the hosts its sglang_fleet_canary names (see
    canary_hosts). Empty when it does."""
    if not group or len(members) < 2:
        return []
    members = sorted(members)
    inside = [c for c in canaries if c in members]
    if inside:
        return [f"sglang_fleet_canary names {_names(inside)}, a node of the multi-node server "
                f"{group} ({_names(members)}): a canary deploys alone, and the group's other "
                f"nodes would wait for it at the rendezvous. Fix: name single-node servers as "
                f"canaries, or deploy without one"]
    held = [m for m in members if m in run_hosts]
    missing = [m for m in members if m not in run_hosts]
    if missing:
        return [f"this run holds {_names(held)} of the multi-node server {group} but not "
                f"{_names(missing)} (left out by --limit, or by the inventory's slice): the "
                f"nodes of a multi-node server are deployed, recovered and stopped together. "
                f"Fix: include the whole group (--limit {group}, or add {_names(missing)}); "
                f"{PLAN_HINT}"]
    if serial in (None, "", "100%"):
        return []
    batches = serial_batches([h for h in run_hosts if h not in canaries], serial)
    where = {m: i + 1 for i, batch in enumerate(batches) for m in batch if m in members}
    if len(set(where.values())) > 1:
        said = ", ".join(f"{m} in batch {where[m]}" for m in members)
        return [f"sglang_fleet_serial={serial} puts the nodes of the multi-node server {group} "
                f"in different batches ({said}): the first batch's nodes would wait for the "
                f"others at the rendezvous. Fix: a batch size that keeps the group's nodes in "
                f"one batch (they must also be next to each other in the inventory), or no "
                f"sglang_fleet_serial"]
    return []
