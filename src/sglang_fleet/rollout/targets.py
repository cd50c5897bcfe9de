"""Whom a canary is judged against: the other servers behind its routers (or, without a
router, the other servers of the same model), each by the URL its routers know it by, and the
routers' metrics endpoints. Read from the inventory's groups and the LaunchSpecs and
RouterSpecs that validation published as host variables."""

from __future__ import annotations

from typing import Any

from sglang_fleet.router.spec import worker_url


def _spec(hostvars: dict[str, Any], host: str) -> dict[str, Any]:
    return dict(hostvars[host].get("sglang_server_launch_spec") or {})


def _target(hostvars: dict[str, Any], host: str) -> dict[str, Any]:
    """A server as the judge reaches it, with the SGLang release its LaunchSpec pins."""
    hv, spec = hostvars[host], _spec(hostvars, host)
    url = worker_url(spec, str(hv.get("ansible_host", host)), hv.get("sglang_router_worker_url"))
    return {"host": host, "url": url, "worker_url": url,
            "release": spec.get("sglang_version") or None}


def _serving(hostvars: dict[str, Any], host: str) -> bool:
    spec = _spec(hostvars, host)
    return bool(spec) and bool((spec.get("group") or {}).get("serves_http"))


def canary_problem(host: str, hostvars: dict[str, Any], canary: bool = True) -> str | None:
    """Why this server cannot be judged by client signals in a canary rollout (as the canary,
    or as a later batch's server, judged alone like it), or None."""
    pd = (_spec(hostvars, host).get("pd") or {}).get("mode")
    if not pd:
        return None
    if canary:
        return (f"sglang_fleet_canary={host} is a {pd} server of a PD deployment: its "
                "requests need the other side, so it cannot be judged alone against a "
                "baseline. Fix: roll PD deployments out in batches (sglang_fleet_serial) "
                "without a canary")
    return (f"{host} is a {pd} server of a PD deployment, and with sglang_fleet_canary set "
            "each later batch's servers are judged alone like the canary: its requests need "
            "the other side. Fix: leave the PD deployment out of this run (--limit) and roll "
            "it out in batches (sglang_fleet_serial) without a canary")


def canary_targets(canary: str, groups: dict[str, list[str]], hostvars: dict[str, Any],
                   exclude: list[str] | None = None) -> dict[str, Any]:
    """{canary, baselines, router_metrics}: the canary's target, its peers' (rank 0 of each
    multi-node server only, none of `exclude`: servers already on the new configuration) and
    its routers' Prometheus URLs."""
    routers = [r for r in groups.get("sglang_routers", [])
               if canary in groups.get(hostvars[r].get("sglang_router_workers_group",
                                                       "sglang_servers"), [])]
    if routers:
        peers = {h for r in routers
                 for h in groups.get(hostvars[r].get("sglang_router_workers_group",
                                                     "sglang_servers"), [])}
    else:
        model = (_spec(hostvars, canary).get("settings") or {}).get("sglang_server_model_path")
        peers = {h for h in groups.get("sglang_servers", [])
                 if (_spec(hostvars, h).get("settings") or {}).get(
                     "sglang_server_model_path") == model}
    metrics = [(hostvars[r].get("sglang_router__spec") or {}).get("metrics_url")
               for r in routers]
    return {"canary": _target(hostvars, canary),
            "baselines": [_target(hostvars, h) for h in sorted(peers - {canary, *(exclude or [])})
                          if _serving(hostvars, h)],
            "router_metrics": [m for m in metrics if m]}
