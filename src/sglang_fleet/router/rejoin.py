"""The servers a router re-adds by itself: those behind it that a run did not deploy or observe
(a deploy limited to the router, `--limit sim-router`, restarts it with no workers while its
servers, outside the limit, keep serving). The router's play observes each of them on its own
node, as health.yml does, and re-adds the ready ones before it reports ok."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sglang_fleet.launch.seed import seed_host_of
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.router.spec import worker_url
from sglang_fleet.settings.server import TABLE

_SERVER_VARIABLE = re.compile(r"^sglang_server_[a-z]")
# A decode joins only beside a ready prefill of its PD deployment: prefills are added first.
_JOIN_ORDER = {"prefill": 0, "regular": 1, "decode": 2}


def _launch_spec(server: str, groups: Mapping[str, list[str]],
                 hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The server's LaunchSpec as its own deploy builds it from the inventory (the server
    role's spec.yml): {ok, errors, warnings, spec}."""
    host_vars = hostvars[server]
    # The role's defaults (generated from the same table) are not in another host's hostvars.
    settings = {**TABLE.defaults(),
                **{k: host_vars[k] for k in list(host_vars) if _SERVER_VARIABLE.match(str(k))}}
    group = settings.get("sglang_server_group") or ""
    members = sorted(groups.get(group, [])) if group else []
    dist = settings.get("sglang_server_dist_init_host") or (
        str(hostvars[members[0]].get("ansible_host", members[0])) if members else "")
    seed_of = seed_host_of(settings.get("sglang_server_weights_from_instance"), server,
                           hostvars, groups)
    return build_launch_spec(settings, server, members or None, dist or None, seed_of)


def unseen_servers(router: str, groups: Mapping[str, list[str]],
                   hostvars: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The HTTP servers of the router's workers group that this run neither deployed nor
    observed (no verdict and no LaunchSpec of theirs in this run), each as {name, spec, url,
    worker_type, bootstrap_port}, prefills first and decodes last. One whose LaunchSpec the
    inventory no longer builds comes with spec None and its first refusal: it is not added
    (its own deploy says every refusal)."""
    group = hostvars[router].get("sglang_router_workers_group") or "sglang_servers"
    out = []
    for server in sorted(groups.get(group, [])):
        hv = hostvars[server]
        if "sglang_server_verdict" in hv or "sglang_server_launch_spec" in hv:
            continue  # this run deployed or observed it: its own membership step decided
        built = _launch_spec(server, groups, hostvars)
        spec = built["spec"] if built["ok"] else None
        if spec is None:
            out.append({"name": server, "spec": None, "refused": built["errors"][0]})
            continue
        if not spec["group"]["serves_http"]:
            continue  # a non-zero rank of a multi-node server: its rank 0 joins
        pd = spec.get("pd") or None
        out.append({
            "name": server, "spec": spec, "pd_deployment": pd["deployment"] if pd else None,
            "url": worker_url(spec, str(hv.get("ansible_host", server)),
                              hv.get("sglang_router_worker_url")),
            "worker_type": pd["mode"] if pd else "regular",
            "bootstrap_port": pd["bootstrap_port"] if pd and pd["mode"] == "prefill" else None,
        })
    return sorted(out, key=lambda s: _JOIN_ORDER.get(s.get("worker_type", ""), 1))


def ready_to_add(observed: list[dict[str, Any]],
                 hostvars: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Of the observations of unseen_servers' servers (the loop's results: `item` and
    `verdict`), those to add back: the ready ones, a decode only beside a ready prefill of its
    PD deployment (judged ready by this run, or observed ready here), as a server's own
    membership step decides (sglang_fleet.launch.pd.prefill_wait)."""
    ready = [r for r in observed if isinstance(r, dict) and r.get("verdict") == "ready"]
    prefills = {r["item"].get("pd_deployment") for r in ready
                if r["item"].get("worker_type") == "prefill"}
    for hv in hostvars.values():
        verdict, spec = hv.get("sglang_server_verdict"), hv.get("sglang_server_launch_spec")
        pd = (spec or {}).get("pd") if isinstance(spec, Mapping) else None
        if pd and pd.get("mode") == "prefill" and isinstance(verdict, Mapping) \
                and verdict.get("verdict") == "ready":
            prefills.add(pd.get("deployment"))
    return [r for r in ready if r["item"].get("worker_type") != "decode"
            or r["item"].get("pd_deployment") in prefills]
