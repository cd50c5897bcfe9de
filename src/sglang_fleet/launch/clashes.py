"""Whether two servers of one inventory would take the same port or the same GPUs of one
machine.

Each server's LaunchSpec says what it takes on its machine (`binds`): the ports it listens on,
each with the variable that sets it (its HTTP port; a prefill's KV bootstrap port; a
multi-node group's rendezvous store on rank 0's --dist-init-addr port; --nccl-port when
given), the address it listens on, and the GPUs it uses. Two servers whose inventory puts them
on one machine (the same `ansible_host`, or both on the controller with
ansible_connection=local) and whose ports or GPUs overlap would load their weights and then
fail, one of them on `[Errno 98] Address already in use` or out of GPU memory: the deploy's
validation refuses the pair before any node is touched, naming both hosts.
"""

from __future__ import annotations

from typing import Any

# Addresses that listen on every interface of their family: such a listener takes the port
# from any other address of the machine.
WILDCARDS = ("0.0.0.0", "::", "")
LOCAL_MACHINE = "this controller (ansible_connection=local)"


def server_binds(listen: str, ports: dict[str, int | None], gpus: list[Any],
                 gpu_scope: str | None = None) -> dict[str, Any]:
    """What a server takes on its machine: `ports` maps each variable to the port it sets
    (None: not bound), `gpus` the physical GPUs it uses (indices, or CUDA_VISIBLE_DEVICES
    entries), `gpu_scope` the simulated GPUs' folder (a simulated node's own GPUs)."""
    return {"listen": listen or "", "ports": {k: int(v) for k, v in ports.items() if v},
            "gpus": list(gpus), "gpu_scope": gpu_scope}


def gpu_ids(base: int, step: int, count: int, visible: str | None) -> list[Any]:
    """The GPUs a server uses: SGLang takes `count` of them from --base-gpu-id, every
    --gpu-id-step; CUDA_VISIBLE_DEVICES maps those indices to the machine's GPUs."""
    ids: list[Any] = [base + i * step for i in range(max(0, count))]
    if not visible:
        return ids
    seen = [d.strip() for d in str(visible).split(",") if d.strip()]
    return [(int(seen[i]) if seen[i].isdigit() else seen[i]) if i < len(seen) else f"?{i}"
            for i in ids]


def machine_of(hostvars: dict[str, Any], host: str) -> str:
    """The machine an inventory host is: its ansible_host (else its name), or the controller
    for a host Ansible reaches with ansible_connection=local."""
    hv = hostvars.get(host) or {}
    if str(hv.get("ansible_connection") or "") == "local":
        return LOCAL_MACHINE
    return str(hv.get("ansible_host") or host)


def _addresses_meet(a: str, b: str) -> bool:
    return a == b or a in WILDCARDS or b in WILDCARDS


def _ids_text(ids: list[Any]) -> str:
    return ",".join(str(i) for i in ids)


def _port_clashes(host: str, mine: dict[str, Any], other: str, theirs: dict[str, Any],
                  machine: str) -> list[str]:
    if not _addresses_meet(mine["listen"], theirs["listen"]):
        return []
    out = []
    for variable, port in sorted(mine["ports"].items()):
        for their_variable, their_port in sorted(theirs["ports"].items()):
            if port != their_port:
                continue
            out.append(
                f"{host} and {other} would both listen on port {port} of one machine "
                f"({machine}): {variable}={port} on {host} (at {mine['listen'] or '*'}), "
                f"{their_variable}={their_port} on {other} (at {theirs['listen'] or '*'}). "
                f"The later one would load its weights and then fail with [Errno 98] Address "
                f"already in use. Fix: give each server on one machine its own port "
                f"({variable} on {host} or {their_variable} on {other}), or put them on "
                f"different machines (ansible_host)")
    return out


def _gpu_clashes(host: str, mine: dict[str, Any], other: str, theirs: dict[str, Any],
                 machine: str) -> list[str]:
    if mine.get("gpu_scope") != theirs.get("gpu_scope"):
        return []  # simulated nodes, each with its own simulated GPUs
    shared = [g for g in mine["gpus"] if g in theirs["gpus"]]
    if not shared:
        return []
    return [f"{host} and {other} would both use GPU {_ids_text(shared)} of one machine "
            f"({machine}): {host} uses GPUs {_ids_text(mine['gpus'])}, {other} uses GPUs "
            f"{_ids_text(theirs['gpus'])}. The later one would run out of GPU memory, or "
            f"both would run slowly. Fix: give each server its own GPUs (--base-gpu-id in "
            f"sglang_server_extra_args, or CUDA_VISIBLE_DEVICES in sglang_server_extra_env), "
            f"or put them on different machines (ansible_host)"]


def clash_errors(host: str, machines: dict[str, str],
                 binds: dict[str, dict[str, Any] | None]) -> list[str]:
    """Why `host`'s server cannot share its machine with the other servers of the run:
    `machines` maps each host to its machine (machine_of), `binds` each host to its
    LaunchSpec's binds (None: not built, or refused on its own and saying why)."""
    mine = binds.get(host)
    if not mine:
        return []
    errors = []
    for other, theirs in binds.items():
        if other == host or not theirs or machines.get(other) != machines.get(host):
            continue
        machine = machines[host]
        errors += _port_clashes(host, mine, other, theirs, machine)
        errors += _gpu_clashes(host, mine, other, theirs, machine)
    return errors
