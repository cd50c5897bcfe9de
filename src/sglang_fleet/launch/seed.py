"""Weights from a running instance: a server that loads its weights GPU to GPU from a seed
server of the same deployment (SGLang's --load-format remote_instance), checked on the
controller and rendered as the pinned release's flags.

The release itself refuses almost nothing here: an incomplete setting makes its load-format
hook (arg_groups/model_path_hook.py in 0.5.23, server_args.py _handle_load_format in
0.5.4.post3) fall back to loading from disk with a warning, and a port list of the wrong length
trips an assertion in the SEED's scheduler (weight_exporter.py "Expected N ports, but got M
ports."), which takes the serving seed down. So every mistake that can be seen before a node is
touched is refused here, each naming the variable, its value and the fix.

The seed is an inventory host (`SeedHost`, gathered from its own variables by the filter
plugin): its address is where its server listens (its ansible_host when it listens on every
interface), its HTTP port and layout are its own settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from sglang_fleet.launch.clashes import machine_of
from sglang_fleet.settings.server import OUTPUT_FACTS, PREFIX

LOAD_FORMAT_FLAG = "--load-format"
LOAD_FORMAT = "remote_instance"
IP_FLAG = "--remote-instance-weight-loader-seed-instance-ip"
PORT_FLAG = "--remote-instance-weight-loader-seed-instance-service-port"
PORTS_FLAG = "--remote-instance-weight-loader-send-weights-group-ports"
BACKEND_FLAG = "--remote-instance-weight-loader-backend"
# 0.5.23: the seed of a transfer_engine load publishes its weights' memory through Mooncake only
# when started with this switch (arg_groups/overrides.py remote_instance_transfer_engine_of).
SEED_TRANSFER_ENGINE_FLAG = "--remote-instance-weight-loader-start-seed-via-transfer-engine"
WILDCARDS = ("0.0.0.0", "::", "[::]", "")
LOOPBACK_PREFIXES = ("127.", "localhost", "::1", "[::1]")
VAR = "sglang_server_weights_from_instance"
PORTS_VAR = "sglang_server_weights_from_instance_ports"
BACKEND_VAR = "sglang_server_weights_from_instance_backend"


def seed_host_of(name: Any, host: str, hostvars: Any, groups: Any) -> dict[str, Any] | None:
    """What the inventory says of the seed that `host` names (`name`), as SeedHost's fields,
    read from the seed's own variables (the role's defaults are not among another host's
    variables: the builder adds them); None when no seed is named."""
    if not name:
        return None
    name = str(name)
    if name not in (groups.get("all") or []):
        return {"name": name, "in_inventory": False}
    hv = hostvars[name]
    settings = {k: hv[k] for k in list(hv) if str(k).startswith(PREFIX)
                and not str(k).startswith(PREFIX + "_") and k not in OUTPUT_FACTS}
    group = settings.get(PREFIX + "group")
    return {"name": name, "in_inventory": True, "settings": settings,
            "ansible_host": hv.get("ansible_host"), "machine": machine_of(hostvars, name),
            "group_members": sorted(groups.get(group, [])) if group else [],
            "own_machine": machine_of(hostvars, str(host))}


class SeedProblems(Protocol):
    def error(self, variable: str, value: Any, problem: str, fix: str,
              described: str | None = None) -> None: ...


@dataclass(frozen=True)
class SeedHost:
    """What the inventory says of the seed host: whether it is there at all, its own
    sglang_server_* variables, its address and machine, and its multi-node group's members."""

    name: str
    in_inventory: bool
    settings: dict[str, Any] = field(default_factory=dict)
    ansible_host: str | None = None
    machine: str | None = None
    group_members: list[str] = field(default_factory=list)
    # This server's own machine, to tell a seed only loopback reaches from one it cannot.
    own_machine: str | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> SeedHost | None:
        if not data:
            return None
        return cls(str(data["name"]), bool(data.get("in_inventory")),
                   dict(data.get("settings") or {}), data.get("ansible_host"),
                   data.get("machine"), list(data.get("group_members") or []),
                   data.get("own_machine"))


@dataclass(frozen=True)
class SeedServer:
    """The seed's server as its own settings build it (short names, overrides applied)."""

    version: str
    served: str
    tp: int
    pp: int
    ep: int
    listen: str | None
    port: int
    extra_args: tuple[str, ...]
    group: str | None
    keyed: bool = False  # an API or admin API key guards its weight-send endpoints


def _address(seed: SeedHost, server: SeedServer) -> str:
    """Where this server reaches the seed: its listen address, or its ansible_host (else its
    name) when it listens on every interface."""
    if server.listen is None or server.listen in WILDCARDS:
        return seed.ansible_host or seed.name
    return server.listen


def _is_loopback(address: str) -> bool:
    return address.startswith(LOOPBACK_PREFIXES)


def release_problem(cat: Any, backend: str) -> str | None:
    """Why the pinned release (its flag catalogue) cannot load from an instance this way."""
    option = cat.by_flag.get(LOAD_FORMAT_FLAG)
    if option is None or LOAD_FORMAT not in (option.choices or ()):
        return f"has no --load-format {LOAD_FORMAT}"
    missing = [f for f in (IP_FLAG, PORT_FLAG, PORTS_FLAG) if f not in cat.by_flag]
    if missing:
        return f"has no {', '.join(missing)}"
    if backend != "nccl" and BACKEND_FLAG not in cat.by_flag:
        return f"loads from an instance over NCCL only (it has no {BACKEND_FLAG})"
    return None


def _ports_problem(ports: Any, tp: int) -> str | None:
    if not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 65535
               for x in ports):
        return "must be port numbers (1-65535)"
    if len(set(ports)) != len(ports):
        return "names a port twice: each TP rank's group needs its own"
    if len(ports) != tp:
        return (f"has {len(ports)} ports for tp {tp}: the seed pairs TP rank i with TP rank i "
                f"and opens one group per rank")
    return None


def seed_args(values: dict[str, Any], host: str, seed: SeedHost | None, server: SeedServer |
              None, version: str, cat: Any, p: SeedProblems) -> list[str]:
    """The release's flags for loading from the seed, or [] (with the errors said) when the
    settings cannot be used. `server` is the seed's server as its settings build it (None when
    they do not build: `seed_server` said why)."""
    name = values["weights_from_instance"]
    if not name:
        if values["weights_from_instance_ports"]:
            p.error("weights_from_instance_ports", values["weights_from_instance_ports"],
                    "group ports without a seed", f"set {VAR} to the seed host, or unset them")
        return []
    backend = values["weights_from_instance_backend"]
    problem = release_problem(cat, backend)
    if problem:
        p.error("weights_from_instance", name, f"SGLang {version} {problem}",
                "pin a release that has it (0.5.23 has every backend; 0.5.4.post3 has nccl), "
                f"or unset {VAR} to load from sglang_server_model_path")
        return []
    if name == host:
        p.error("weights_from_instance", name, "names this server itself: a server cannot "
                "load from its own weights before it has any", "name another server of the "
                "deployment that serves, or unset it")
        return []
    if seed is None or not seed.in_inventory:
        p.error("weights_from_instance", name, "is not a host of this inventory", "name the "
                "inventory host whose server serves the same model (its address and port are "
                "read from its own variables), or unset it")
        return []
    if server is None:
        return []
    if not _agrees(values, name, server, version, seed, p):
        return []
    ports = list(values["weights_from_instance_ports"] or [])
    problem = _ports_problem(ports, values["tp"]) if ports or backend == "nccl" else None
    if problem:
        p.error("weights_from_instance_ports", ports, problem,
                f"list {values['tp']} free ports of the seed's node, one per TP rank, e.g. "
                f"[{', '.join(str(30100 + i) for i in range(min(values['tp'], 4)))}"
                f"{', ...' if values['tp'] > 4 else ''}]")
        return []
    if server.port in ports:
        p.error("weights_from_instance_ports", ports, f"holds the seed's HTTP port "
                f"{server.port}", "choose ports the seed's node has free")
        return []
    address = _address(seed, server)
    if _is_loopback(address) and seed.machine != seed.own_machine:
        p.error("weights_from_instance", name, f"its server listens on {address} only, which "
                f"this node ({seed.own_machine}) cannot reach on another machine "
                f"({seed.machine})", f"set sglang_server_host of {name} to an address this node "
                "reaches (and an API key), or name a seed on this machine")
        return []
    args = [LOAD_FORMAT_FLAG, LOAD_FORMAT, IP_FLAG, address, PORT_FLAG, str(server.port)]
    if ports:
        args += [PORTS_FLAG, json.dumps(ports, separators=(",", ":"))]
    if BACKEND_FLAG in cat.by_flag:
        args += [BACKEND_FLAG, backend]
    return args


def _agrees(values: dict[str, Any], name: str, server: SeedServer, version: str,
            seed: SeedHost, p: SeedProblems) -> bool:
    """The seed serves the same model, at the same layout and release: it sends each TP
    rank's parameters as its own model holds them."""
    served = values["served_model_name"] or str(values["model_path"] or "").rstrip(
        "/").rsplit("/", 1)[-1]
    mismatches = []
    if server.served != served:
        mismatches.append(f"it serves {server.served!r}, this server {served!r} (another "
                          "deployment)")
    if server.version != version:
        mismatches.append(f"it runs SGLang {server.version}, this server {version}")
    for key in ("tp", "pp", "ep"):
        if getattr(server, key) != values[key]:
            mismatches.append(f"its {key} is {getattr(server, key)}, this server's "
                              f"{values[key]}")
    if seed.group_members and seed.group_members[0] != name:
        mismatches.append(f"it is not rank 0 of its multi-node group {server.group} "
                          f"({seed.group_members[0]} serves its HTTP)")
    if mismatches:
        p.error("weights_from_instance", name, "the seed must be a server of this deployment, "
                "at its release and layout: " + "; ".join(mismatches),
                "name a server that serves the same model with the same sglang_server_version, "
                "tp, pp and ep, or unset it")
        return False
    if server.keyed:
        p.error("weights_from_instance", name, "its server requires an API key on "
                "/init_weights_send_group_for_remote_instance and /send_weights_to_remote_instance "
                "(auth level ADMIN_OPTIONAL), and SGLang's remote-instance loader sends none: "
                "the seed would refuse it and this server wait for the group",
                "seed from a server without sglang_server_api_key and "
                "sglang_server_admin_api_key (on a private network: "
                "sglang_server_allow_unauthenticated), or unset it")
        return False
    if values["weights_from_instance_backend"] == "transfer_engine" \
            and SEED_TRANSFER_ENGINE_FLAG not in server.extra_args:
        p.error("weights_from_instance_backend", "transfer_engine", f"the seed {name} does "
                f"not run with {SEED_TRANSFER_ENGINE_FLAG}, so it publishes no weights to the "
                "transfer engine", f"add {SEED_TRANSFER_ENGINE_FLAG} to the seed's "
                "sglang_server_extra_args, or use the nccl backend")
        return False
    return True
