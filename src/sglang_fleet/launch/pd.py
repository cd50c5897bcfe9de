"""Prefill/decode disaggregation on the controller: what one server's settings must hold for its
side, and what the servers of one PD deployment must agree on.

SGLang 0.5.23 finds most PD mistakes only at the first request, after both sides have loaded
their weights: the decode asks the prefill's bootstrap server for its parallel info and raises
"Page size mismatch" or "KV cache dtype mismatch" (disaggregation/common/conn.py,
CommonKVReceiver), or fails every request with "Disaggregation decode allocation policy
mismatch". Here they are refused before any node is touched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

# server_args.py: disaggregation_bootstrap_port and disaggregation_transfer_backend defaults,
# for the checks on the settings (the LaunchSpec's view reads the parsed command line).
DEFAULT_BOOTSTRAP_PORT = 8998
DEFAULT_TRANSFER_BACKEND = "mooncake"
# What a decode holds the prefill to (disaggregation/common/conn.py): the flag that sets each,
# read from the command line as SGLang's parser resolves it (defaults included).
KV_AGREEMENT: tuple[tuple[str, str], ...] = (
    ("--page-size", "page_size"),
    ("--kv-cache-dtype", "kv_cache_dtype"),
    ("--disaggregation-decode-allocation-policy", "disaggregation_decode_allocation_policy"),
    ("--dsv4-attn-backend", "dsv4_attn_backend"),
)
# ... and the environment variable that sets the DSv4 KV layout beside them.
KV_LAYOUT_ENV = "SGLANG_DSV4_KV_LAYOUT"
# The inventory variables that make a server one side of a PD deployment.
PD_SIDE_VARS = ("sglang_server_pd_deployment", "sglang_server_disaggregation_mode")
_DEVICE = re.compile(r"^[A-Za-z0-9_.:-]+$")


class SideProblems(Protocol):
    def error(self, variable: str, value: Any, problem: str, fix: str) -> None: ...
    def warn(self, text: str) -> None: ...


def _ib_device_problem(devices: str) -> str | None:
    """SGLang's validate_ib_devices takes a comma-separated list, a JSON map of GPU to
    devices, or a path to a JSON file of that map (the node's own file)."""
    text = devices.strip()
    if text.startswith("/"):
        return None
    if text.startswith("{"):
        try:
            mapping = json.loads(text)
        except ValueError as exc:
            return f"is not valid JSON ({exc.msg} at character {exc.pos})"
        bad = [k for k, val in mapping.items() if not isinstance(val, str) or not val.strip()]
        return f"maps GPUs {bad} to no device list" if bad else None
    names = [d.strip() for d in text.split(",")]
    wrong = [d for d in names if not _DEVICE.match(d)]
    if wrong or not text:
        return f"names no device as SGLang reads them ({wrong or 'empty'})"
    return None


def side_checks(values: dict[str, Any], p: SideProblems) -> None:
    """One server's PD settings: a side needs its deployment and the deployment its sides;
    what SGLang refuses for a side; the prefill's bootstrap port against the server's own."""
    mode, deployment = values["disaggregation_mode"], values["pd_deployment"]
    backend = values["disaggregation_transfer_backend"] or DEFAULT_TRANSFER_BACKEND
    if deployment and not mode:
        p.error("pd_deployment", deployment, "the servers of a PD deployment are each a "
                "prefill or a decode server", "set sglang_server_disaggregation_mode to "
                "prefill or decode (in the group_vars of each side)")
    if mode and not deployment:
        p.error("disaggregation_mode", mode, "a prefill or decode server serves only beside "
                "the other side, in a PD deployment", "set sglang_server_pd_deployment to "
                "the inventory group that holds both sides")
    if not mode:
        _unused_pd_settings(values, p)
        return
    bootstrap = values["disaggregation_bootstrap_port"] or DEFAULT_BOOTSTRAP_PORT
    if mode == "prefill":
        taken = {"port": values["port"]}
        if values["group"]:
            taken["dist_init_port"] = values["dist_init_port"]
        for name, port in taken.items():
            if port == bootstrap:
                p.error("disaggregation_bootstrap_port", bootstrap, f"the prefill's KV "
                        f"bootstrap server would listen on sglang_server_{name}'s port "
                        f"{port}", "give the bootstrap server a port of its own (SGLang's "
                        "default is 8998)")
    devices = values["disaggregation_ib_device"]
    if devices:
        problem = _ib_device_problem(devices)
        if problem:
            p.error("disaggregation_ib_device", devices, problem, "name the RDMA devices "
                    "as ibv_devices lists them, comma-separated (mlx5_0,mlx5_1), or a JSON "
                    'map of GPU index to devices ({"0": "mlx5_0"})')
    elif backend == DEFAULT_TRANSFER_BACKEND:
        p.warn("mooncake will discover the RDMA devices itself (sglang_server_disaggregation_"
               "ib_device is null): on a node with several NICs, name those beside the GPUs")


def _unused_pd_settings(values: dict[str, Any], p: SideProblems) -> None:
    unused = [f"sglang_server_{n}" for n in ("disaggregation_transfer_backend",
                                             "disaggregation_bootstrap_port",
                                             "disaggregation_ib_device") if values[n]]
    if unused:
        p.warn(f"{', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect on a "
               f"server that is neither prefill nor decode (sglang_server_disaggregation_mode "
               f"is null)")


def pd_view(values: dict[str, Any], parsed: dict[str, Any], env: dict[str, str],
            served: str) -> dict[str, Any] | None:
    """The LaunchSpec's PD part: the side, where the prefill's bootstrap server listens, and
    what the deployment's servers must agree on. `parsed` is the rendered command line as the
    pinned release's parser reads it (extra_args and SGLang's defaults included)."""
    if not values["disaggregation_mode"]:
        return None
    agree: dict[str, Any] = {"served model name": served,
                             "transfer backend": parsed.get("disaggregation_transfer_backend")}
    for flag, dest in KV_AGREEMENT:
        agree[flag] = parsed.get(dest)
    agree[KV_LAYOUT_ENV] = env.get(KV_LAYOUT_ENV)
    return {"deployment": values["pd_deployment"], "mode": values["disaggregation_mode"],
            "bootstrap_port": parsed.get("disaggregation_bootstrap_port"),
            "attention_backend": parsed.get("attention_backend"),
            "agree": agree}


def deployment_errors(deployment: str, host: str, members: Sequence[str],
                      modes: dict[str, Any], specs: dict[str, Any],
                      routers: dict[str, tuple[bool, Sequence[str]]]) -> list[str]:
    """Why one PD deployment cannot run: `members` are its inventory group's hosts, `modes`
    each member's disaggregation_mode as the inventory sets it, `specs` the LaunchSpecs of
    the members this run built (None when not built), `routers` the routers in front of
    `host`, each with whether it runs in PD mode and its workers group's hosts. For a host
    outside any PD deployment (`deployment` empty), only the routers are checked."""
    if not deployment:
        return [f"host {host}: router {name} runs in PD mode (sglang_router_pd_disaggregation: "
                f"true) and would take this regular server for neither side. Fix: give the "
                f"PD router a workers group of PD servers only (sglang_router_workers_group)"
                for name, (pd_mode, _) in sorted(routers.items()) if pd_mode]
    if host not in members:
        return [f"host {host}: sglang_server_pd_deployment={deployment}: the host is not in "
                f"inventory group {deployment!r}. Fix: add it to that group, or correct the "
                f"name"]
    errors = _side_counts(deployment, members, modes)
    errors += _disagreements(deployment, {h: s for h, s in specs.items() if s})
    return errors + _router_errors(deployment, host, members, routers)


def _router_errors(deployment: str, host: str, members: Sequence[str],
                   routers: dict[str, tuple[bool, Sequence[str]]]) -> list[str]:
    """A PD server's routers: in PD mode, each in front of this one deployment alone (a
    decode fetches KV only from a prefill it agrees with)."""
    errors = []
    for name, (pd_mode, workers) in sorted(routers.items()):
        if not pd_mode:
            errors.append(f"host {host}: router {name} fronts PD deployment {deployment} "
                          f"without PD mode and would send whole requests to a prefill "
                          f"server. Fix: set sglang_router_pd_disaggregation: true for "
                          f"{name}")
        outside = sorted(set(workers) - set(members))
        if outside:
            errors.append(f"host {host}: router {name} fronts PD deployment {deployment} "
                          f"and also {', '.join(outside)}, outside it; a decode can fetch KV "
                          f"only from a prefill of its own deployment. Fix: give {name} the "
                          f"deployment's group as sglang_router_workers_group "
                          f"({deployment}), one PD router per deployment")
    return errors


def _side_counts(deployment: str, members: Sequence[str], modes: dict[str, Any]) -> list[str]:
    sides = {side: sorted(h for h in members if modes.get(h) == side)
             for side in ("prefill", "decode")}
    neither = sorted(h for h in members if modes.get(h) not in sides)
    errors = []
    for side, hosts in sides.items():
        if not hosts:
            errors.append(f"PD deployment {deployment} has no {side} server (its hosts: "
                          f"{', '.join(sorted(members))}): every request needs one of each. "
                          f"Fix: set sglang_server_disaggregation_mode: {side} on the hosts "
                          f"of that side")
    if neither:
        errors.append(f"PD deployment {deployment}: {', '.join(neither)} "
                      f"{'is' if len(neither) == 1 else 'are'} neither prefill nor decode. "
                      f"Fix: set sglang_server_disaggregation_mode on "
                      f"{'it' if len(neither) == 1 else 'them'}, or take "
                      f"{'it' if len(neither) == 1 else 'them'} out of group {deployment}")
    return errors


def _disagreements(deployment: str, specs: dict[str, Any]) -> list[str]:
    """What a decode would find different in a prefill only at its first request."""
    views = {host: spec.get("pd") for host, spec in specs.items() if spec.get("pd")}
    errors = []
    names = sorted({name for view in views.values() for name in view["agree"]})
    for name in names:
        seen: dict[str, list[str]] = {}
        for host, view in sorted(views.items()):
            seen.setdefault(str(view["agree"].get(name)), []).append(host)
        if len(seen) > 1:
            values = "; ".join(f"{value} on {', '.join(hosts)}" for value, hosts in seen.items())
            errors.append(f"PD deployment {deployment}: its servers disagree on {name} "
                          f"({values}); SGLang fails every request between such a prefill and "
                          f"decode. Fix: set it once, in group_vars/{deployment}")
    backends = {v["attention_backend"] or "SGLang's default" for v in views.values()}
    page_sizes = {v["agree"]["--page-size"] for v in views.values()}
    if len(backends) > 1 and page_sizes == {None}:
        errors.append(f"PD deployment {deployment}: its servers use different attention "
                      f"backends ({', '.join(sorted(backends))}) without --page-size, and "
                      f"each backend picks its own page size. Fix: set --page-size in "
                      f"sglang_server_extra_args of group_vars/{deployment}")
    return errors


def prefill_wait(deployment: str, prefills: dict[str, str | None]) -> str:
    """Why a ready decode of `deployment` stays out of its routers: no prefill of it is ready.
    `prefills` maps each prefill (its HTTP-serving hosts) to the verdict this run gave it, None
    where this run did not judge it (a --limit, an earlier batch): a prefill not judged may be
    serving, so the decode joins. '' when the decode may join."""
    if not prefills or any(v in (None, "ready") for v in prefills.values()):
        return ""
    judged = ", ".join(f"{host} {verdict}" for host, verdict in sorted(prefills.items()))
    return (f"no prefill of PD deployment {deployment} is ready ({judged}): every request "
            f"through the router would fail, so the decode stays out until one is back")


SIDE_GROUP_PREFIX = "sglang_fleet__pd_side__"


def held_side(host: str, members: dict[str, dict[str, Any]], run_hosts: Sequence[str]) -> str:
    """The in-memory group (SIDE_GROUP_PREFIX + deployment + side) that names `host` as one
    server of a PD side a deploy must not take out whole; '' when it is none. `members` maps
    each host of its deployment's group to its `mode`, `unit` (its multi-node group, or the
    host) and `keep` (sglang_server_pd_keep_side_serving); `run_hosts` are the play's hosts in
    order. A side qualifies when it has two servers or more, all of them in this run (one
    outside it keeps serving), and none of its hosts lets it go whole; a multi-node server
    counts once, by its first host of the run, so that a cut never splits its nodes."""
    me = members.get(host) or {}
    if me.get("mode") not in ("prefill", "decode"):
        return ""
    side = {h: m for h, m in members.items() if m.get("mode") == me["mode"]}
    units = {m["unit"] for m in side.values()}
    in_run = [h for h in run_hosts if h in side]
    if (len(units) < 2 or len(in_run) < len(side)
            or not all(m.get("keep", True) for m in side.values())):
        return ""
    first = next(h for h in in_run if side[h]["unit"] == me["unit"])
    return f"{SIDE_GROUP_PREFIX}{me['deployment']}__{me['mode']}" if first == host else ""


def keep_sides_serving(batches: Sequence[Sequence[str]],
                       sides: Sequence[set[str]]) -> list[list[str]]:
    """`batches` cut so that none holds every server of a side: a batch ends before the
    server that would complete one (`sides`: the first host of each server of a side, as
    held_side groups them); the nodes after it, its own included, start the next batch."""
    out: list[list[str]] = []
    for batch in batches:
        current: list[str] = []
        for host in batch:
            if current and any(host in side and side <= {*current, host} for side in sides):
                out.append(current)
                current = []
            current.append(host)
        out.append(current)
    return [b for b in out if b]


def decodes_beside(selected: Sequence[str], sides: dict[str, tuple[Any, Any]],
                   groups: dict[str, list[str]]) -> list[str]:
    """The decodes a recovery of `selected` holds beside them: each selected prefill's
    deployment's decodes that it did not select. A decode leaves the routers while no prefill
    of its deployment is ready, so the run that brings a prefill back must put them back too.
    `sides` maps each server to its (pd_deployment, disaggregation_mode)."""
    chosen = set(selected)
    out: list[str] = []
    for host in selected:
        deployment, mode = sides.get(host, (None, None))
        if mode != "prefill" or not deployment:
            continue
        out += [h for h in groups.get(str(deployment), []) if h not in chosen
                and h not in out and sides.get(h, (None, None))[1] == "decode"]
    return out


def router_side_gap(host: str, router: str, deployment: str,
                    workers: Sequence[dict[str, Any]], outside: Sequence[str]) -> str:
    """Why a PD server's recovery did not bring its deployment back through `router`: the
    sides its worker list (GET /workers) holds no healthy worker of; '' when it holds both.
    `outside`: the deployment's hosts this run did not hold."""
    healthy = {w.get("worker_type") for w in workers if w.get("is_healthy")}
    missing = [side for side in ("prefill", "decode") if side not in healthy]
    if not missing:
        return ""
    held = (f"; {', '.join(outside)} {'was' if len(outside) == 1 else 'were'} outside this "
            f"run" if outside else "")
    return (f"{host}: recovered, but router {router} lists no healthy {' and no '.join(missing)} "
            f"server of PD deployment {deployment}: every request through it fails{held}. "
            f"Fix: recover the deployment as a unit: sglang-fleet recover --limit {deployment}")


def _transfer_text(host: str, kv: dict[str, Any]) -> str:
    counts = [(kv.get("requests_failed", 0), "request aborted", "requests aborted"),
              (kv.get("lookups_failed", 0), "failed look-up", "failed look-ups"),
              (kv.get("prefills_lost", 0), "lost connection", "lost connections")]
    said = ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in counts if n)
    return f"{host}: {said or 'KV transfers failed'}; the latest: {kv.get('last_message')}"


def _failed_requests_since(verdict: Any, since: Any) -> bool:
    """Whether a decode's new KV transfer lines failed requests, the latest of them after
    `since` (when the prefill began serving): a prefill's restart makes its decodes lose it
    ("Lost connection ..., 0 requests affected"), which says nothing of the prefill now."""
    kv = verdict.get("kv_transfer") if isinstance(verdict, dict) else None
    if not kv or not kv.get("requests_failed"):
        return False
    return since is None or kv.get("last_at") is None or kv["last_at"] >= since


def _naming(address: str, decodes: dict[str, Any], only_prefill: bool,
            since: Any = None) -> dict[str, Any]:
    """The decodes whose new KV transfer failures lie with the prefill at `address`: those
    naming it; or, for the only prefill of its deployment, every ready decode when each has
    failures that name no prefill (a waiting timeout names only its request): a decode fetches
    KV only from its own deployment's prefills, and one that all its decodes fail with is
    the common factor. Only failures of requests since the prefill began serving count."""
    news = {h: v["kv_transfer"] for h, v in sorted(decodes.items())
            if _failed_requests_since(v, since)}
    named = {h: kv for h, kv in news.items() if address in kv.get("prefills", ())}
    ready = [h for h, v in decodes.items() if isinstance(v, dict) and v.get("verdict") == "ready"]
    if named or not only_prefill or not ready or set(ready) - set(news):
        return named
    return {h: kv for h, kv in news.items() if not kv.get("prefills")}


def named_by_decodes(verdict: dict[str, Any], address: str, decodes: dict[str, Any],
                     only_prefill: bool = False) -> dict[str, Any]:
    """A prefill's verdict once its deployment's decodes have been judged in the same run.
    A decode's verdict names the prefills (bootstrap `host:port`) its KV transfers failed
    with since its previous look and since the prefill began serving (see _naming for the
    only prefill); a prefill they lie with
    is `unhealthy` even though its own checks pass: its HTTP and bootstrap servers answer, but
    what decodes fetch from it does not arrive (its transfer engine, its RDMA devices, the
    network between them). `decodes` maps each decode to its verdict; the verdict is
    returned unchanged when no failure lies with it."""
    if verdict.get("verdict") != "ready":
        return verdict
    named = _naming(address, decodes, only_prefill, verdict.get("since"))
    if not named:
        return verdict
    reason = (f"/health and its KV bootstrap server answer, but its decodes' KV transfers from "
              f"it fail (bootstrap {address}; "
              f"{'; '.join(_transfer_text(h, kv) for h, kv in named.items())})")
    advice = ("the decodes named cannot fetch KV caches from this prefill: check its transfer "
              "engine's log, its RDMA devices (sglang_server_disaggregation_ib_device) and the "
              "network to the decodes; the fleet takes it out of its routers meanwhile, and a "
              "recovery restarts it on the same configuration")
    evidence = dict(verdict.get("evidence") or {}, decodes_kv_transfer=named)
    return dict(verdict, verdict="unhealthy", cause=None, reason=reason, advice=advice,
                headline=f"unhealthy while serving: {reason}", evidence=evidence)
