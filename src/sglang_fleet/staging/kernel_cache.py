"""Which nodes take part in moving the kernel caches (docs/weights.md, "Kernel caches"), from the
hosts' LaunchSpecs (their kernel_cache key) and what each node's live folder holds against the
controller's newest snapshot of its key (sglang_kernel_cache state=compared)."""

from __future__ import annotations

from typing import Any


def cache_key(spec: Any) -> str | None:
    """The host's kernel cache key, None when sglang_server_kernel_cache is off."""
    view = (spec or {}).get("kernel_cache") if isinstance(spec, dict) else None
    return view["key"] if view else None


def keys(hosts: list[str], specs: dict[str, Any]) -> list[str]:
    """The keys of the hosts whose server keeps its kernel caches, sorted."""
    return sorted({k for h in hosts if (k := cache_key(specs.get(h)))})


def _compared(found: Any) -> dict[str, Any] | None:
    return found if isinstance(found, dict) and "missing_files" in found else None


def stage_chains(hosts: list[str], specs: dict[str, Any], compared: dict[str, Any]
                 ) -> dict[str, list[str]]:
    """Per key, the hosts (in play order) whose node lacks the controller's newest snapshot
    and does not hold it published yet: they fetch it, in a chain behind the controller."""
    chains: dict[str, list[str]] = {}
    for host in hosts:
        key, found = cache_key(specs.get(host)), _compared(compared.get(host))
        if key and found and found["missing_files"] and not found.get("published"):
            chains.setdefault(key, []).append(host)
    return chains


def harvest_sources(hosts: list[str], specs: dict[str, Any], compared: dict[str, Any]
                    ) -> dict[str, str]:
    """Per key, the ready host whose live folder holds the most files the controller's newest
    snapshot lacks (none when no host compiled anything new): its folder is harvested."""
    candidates: dict[str, list[tuple[int, int, str]]] = {}
    for order, host in enumerate(hosts):
        key, found = cache_key(specs.get(host)), _compared(compared.get(host))
        if key and found and found["new_files"] > 0:
            candidates.setdefault(key, []).append((-found["new_files"], order, host))
    return {key: min(found)[2] for key, found in candidates.items()}
