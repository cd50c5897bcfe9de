# -*- coding: utf-8 -*-
# Controller-side glue for the router: Ansible templates call the sglang_fleet package, which
# builds and renders the RouterSpec in one place (sglang_fleet.router.spec).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from urllib.parse import urlsplit

from ansible.errors import AnsibleFilterError

try:  # the collection and the package must be one release
    from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import version_error
except ImportError:  # loaded as a plain file (a unit test), not by Ansible: nothing to compare
    version_error = None
_VERSION_ERROR = version_error() if version_error else None
try:
    from sglang_fleet.launch.pd import named_by_decodes, prefill_wait, router_side_gap
    from sglang_fleet.router.rejoin import ready_to_add, unseen_servers
    from sglang_fleet.router.spec import (
        admin_key,
        build_router_identity,
        build_router_spec,
        worker_url,
    )
    from sglang_fleet.router.views import node_view, secret_values_of
    from sglang_fleet.router.workers_group import VARIABLE as WORKERS_GROUP
    from sglang_fleet.router.workers_group import workers_group_errors
    from sglang_fleet.settings.router import PREFIX
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


def _need_package():
    if _VERSION_ERROR is not None:
        raise AnsibleFilterError(_VERSION_ERROR)
    if _IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            "the sglang_fleet Python package is not importable by ansible-playbook (%s); "
            "run the README's set-up command" % _IMPORT_ERROR)


def _router_vars(host_vars):
    # hostvars[router] templates each value as it is read; only the role's own are read.
    return dict((k, host_vars[k]) for k in list(host_vars) if str(k).startswith(PREFIX))


def router_spec(host_vars, host, address=None, groups=None):
    """hostvars[router] | sglang_fleet_router_spec(router, hostvars[router].ansible_host[,
    groups]): with `groups`, a workers group that fronts no server is refused too."""
    _need_package()
    settings = _router_vars(host_vars)
    built = build_router_spec(settings, str(host), str(address) if address else None)
    errors = workers_group_errors(str(host), settings.get(WORKERS_GROUP), groups) \
        if groups is not None else []
    if errors:
        built = dict(built, ok=False, errors=built["errors"] + errors, spec=None)
    return built


def router_identity(host_vars, host, address=None):
    """hostvars[router] | sglang_fleet_router_identity(router, address): the RouterSpec a stop
    needs, built without the secrets when only they are refused (its `refused` says why)."""
    _need_package()
    return build_router_identity(_router_vars(host_vars), str(host),
                                 str(address) if address else None)


def routers_of(server, groups, hostvars, identity=False):
    """The routers that front `server`: [{name, spec, refused}] for each host of the
    sglang_routers group whose sglang_router_workers_group holds it. A router whose settings
    are refused fails here with every refusal, as the router's own deploy does; with
    identity=True (a stop) one whose secrets alone are refused is given by its identity, and
    `refused` lists the refusals."""
    _need_package()
    out = []
    for name in sorted(groups.get("sglang_routers", [])):
        hv = hostvars[name]
        workers_group = hv.get("sglang_router_workers_group", "sglang_servers")
        if server not in groups.get(workers_group, []):
            continue
        # Published by the router's own spec step (deploy.yml's validation) when it ran.
        spec, refused = hv.get("sglang_router__spec"), []
        if not spec:
            build = build_router_identity if identity else build_router_spec
            built = build(_router_vars(hv), name,
                          str(hv["ansible_host"]) if "ansible_host" in hv else name)
            if not built["ok"]:
                raise AnsibleFilterError("\n".join(built["errors"]))
            spec, refused = built["spec"], built.get("refused") or []
        out.append({"name": name, "spec": spec, "refused": refused})
    return out


def router_secret_values(host, hostvars):
    """inventory_hostname | sglang_fleet_router_secret_values(hostvars): the values of the
    secret settings of the RouterSpec the host built, by variable, for sglang_router_node's
    `secret_values`; read where a task needs them, never kept as a fact."""
    _need_package()
    hv = hostvars[host]
    return secret_values_of(hv["sglang_router__spec"], hv)


def router_host_view(host, hostvars):
    """inventory_hostname | sglang_fleet_router_host_view(hostvars): the router as its host is
    given it (sglang_router_node's `router` option, as sglang_node's `router` takes it), from
    the RouterSpec the host built and the values of its secret settings."""
    return node_view(hostvars[host]["sglang_router__spec"],
                     router_secret_values(host, hostvars))["router"]


def called_routers(membership):
    """The routers a server's membership task (its registered result) called in this run."""
    return set((r.get("item") or {}).get("name") for r in (membership or {}).get("results") or []
               if isinstance(r, dict) and not r.get("skipped"))


def routers_to_call(routers, hostvars, worker_url, state, earlier=None):
    """The routers a server's membership task calls. A server to be present is left out of a
    router that listed it healthy when this run deployed that router (its node module reads
    the workers once it answers), unless this run called that router for the server already
    (it left it, or asked it): nothing of the membership changed since, and the call would be
    one more module run per server and router on every re-run."""
    if state != "present":
        return list(routers)
    called = called_routers(earlier)
    wanted = str(worker_url).rstrip("/")
    out = []
    for router in routers:
        node = hostvars[router["name"]].get("sglang_router__node") or {}
        listed = node.get("workers") if isinstance(node, dict) else None
        if router["name"] in called or not any(
                w.get("url") == wanted and w.get("healthy") for w in listed or []):
            out.append(router)
    return out


def membership_due(server, groups, hostvars, server_spec, address, override=None):
    """Whether a ready server running unchanged is missing from a router in front of it: one
    of them did not list it healthy when this run deployed that router (membership.yml then
    joins it), or it is a decode that must leave them (pd_wait). Asked before including
    membership.yml, so that a re-run of a fleet already in its routers runs one task per
    server for membership, not four."""
    _need_package()
    if not server_spec["group"]["serves_http"]:
        return False
    routers = routers_of(server, groups, hostvars)
    url = worker_url(dict(server_spec), str(address), override)
    # A decode listed while no prefill of its deployment is ready must leave.
    return bool(routers) and bool(routers_to_call(routers, hostvars, url, "present")
                                  or pd_wait(server, groups, hostvars))


def report_current(router, groups, hostvars):
    """router | sglang_fleet_router_report_current(groups, hostvars): whether the report its
    check made (sglang_router_node's `report`: the router ran unchanged, listed its workers and
    answered one request) still holds at the end of the run. It does while nothing in front
    of the router changed since: no server of this run changed, none left a verdict other
    than ready, and no membership call of this run reached this router."""
    node = hostvars[router].get("sglang_router__node") or {}
    if not isinstance(node, dict) or not node.get("report"):
        return False
    for server in groups.get("sglang_servers", []):
        hv = hostvars[server]
        if hv.get("sglang_server__changing"):
            return False
        verdict = hv.get("sglang_server_verdict")
        if isinstance(verdict, dict) and verdict.get("verdict", "ready") != "ready":
            return False
        if router in called_routers(hv.get("sglang_router__membership")):
            return False
    return True


def unseen_servers_filter(router, groups, hostvars):
    """router | sglang_fleet_router_unseen_servers(groups, hostvars): the servers behind the
    router that this run neither deployed nor observed (sglang_fleet.router.rejoin)."""
    _need_package()
    return unseen_servers(str(router), groups, hostvars)


def ready_to_add_filter(observed, hostvars):
    """results | sglang_fleet_router_ready_to_add(hostvars): of those servers' observations,
    the ones to add back (sglang_fleet.router.rejoin: a decode only beside a ready prefill)."""
    _need_package()
    return ready_to_add(list(observed or []), hostvars)


def admin_key_filter(control_plane_keys):
    _need_package()
    return admin_key(list(control_plane_keys or []))


def worker_url_filter(server_spec, address, override=None):
    _need_package()
    return worker_url(dict(server_spec), str(address), override)


def pd_wait(server, groups, hostvars):
    """inventory_hostname | sglang_fleet_pd_wait(groups, hostvars): why a decode server stays
    out of its routers ('' when it may join): no prefill of its PD deployment that this run
    judged is ready (sglang_fleet.launch.pd.prefill_wait)."""
    _need_package()
    pd = (hostvars[server].get("sglang_server_launch_spec") or {}).get("pd") or {}
    if pd.get("mode") != "decode":
        return ""
    prefills = {}
    for host in groups.get(pd["deployment"], []):
        spec = hostvars[host].get("sglang_server_launch_spec") or {}
        if (spec.get("pd") or {}).get("mode") != "prefill" or not spec["group"]["serves_http"]:
            continue
        verdict = hostvars[host].get("sglang_server_verdict") or {}
        prefills[host] = verdict.get("verdict") if isinstance(verdict, dict) else None
    return prefill_wait(pd["deployment"], prefills)


def pd_named_by_decodes(verdict, server, groups, hostvars):
    """sglang_server_verdict | sglang_fleet_pd_named_by_decodes(inventory_hostname, groups,
    hostvars): a prefill's verdict once its deployment's decodes have been judged in this run:
    unhealthy when their KV transfer failures name its bootstrap address (the router's
    bootstrap host, the host of its worker URL, and its bootstrap port; pd.named_by_decodes)."""
    _need_package()
    hv = hostvars[server]
    spec = dict(hv.get("sglang_server_launch_spec") or {})
    pd = dict(spec.get("pd") or {})
    if pd.get("mode") != "prefill" or not isinstance(verdict, dict):
        return verdict
    url = worker_url(spec, str(hv.get("ansible_host", server)), hv.get("sglang_router_worker_url"))
    decodes, prefills = {}, 0
    for host in groups.get(str(pd["deployment"]), []):
        other = hostvars[host]
        mode = ((other.get("sglang_server_launch_spec") or {}).get("pd") or {}).get("mode")
        prefills += mode == "prefill"
        if mode == "decode":
            decodes[host] = dict(other.get("sglang_server_verdict") or {})
    return named_by_decodes(dict(verdict), "%s:%s" % (urlsplit(url).hostname, pd["bootstrap_port"]),
                            decodes, only_prefill=prefills == 1)


def pd_router_gaps(results, host, deployment, groups, run_hosts):
    """A recovered PD server's routers (sglang_router_probe's results, one per router) that
    still list no healthy server of one side of its deployment, one line each ('' when
    none; see pd.router_side_gap)."""
    _need_package()
    outside = [h for h in groups.get(str(deployment), []) if h not in set(run_hosts or [])]
    lines = [router_side_gap(str(host), r["item"]["name"], str(deployment),
                             r.get("workers") or [], outside)
             for r in results or [] if not r.get("skipped") and not r.get("workers_error")]
    return "\n".join(line for line in lines if line)


def membership_text(results, host, worker_url, pd_wait_reason=""):
    """One line per server for what its membership tasks changed ('' when nothing did); a
    decode kept out for want of a ready prefill (pd_wait) says so whether or not it was in."""
    parts = []
    for r in results or []:
        if r.get("skipped"):
            continue
        if pd_wait_reason and not (r.get("changed") and r.get("action") == "removed"):
            parts.append("stays out of router %s" % r["item"]["name"])
            continue
        if r.get("action") == "kept":
            # The router lists this host's URL, but another deployment serves it.
            parts.append("left %s in router %s: %s" % (worker_url, r["item"]["name"],
                                                       r.get("kept_because")))
            continue
        if not r.get("changed") or r.get("action") not in ("added", "removed"):
            continue
        verb = "joined" if r["action"] == "added" else "left"
        text = "%s router %s (%s)" % (verb, r["item"]["name"], worker_url)
        drained = r.get("drain")
        if drained:
            inflight = drained.get("inflight_at_start")
            text += "; drained in %.1f s, %s in flight at removal" % (
                drained.get("seconds", 0), "unknown" if inflight is None else inflight)
            if drained.get("note"):
                text += "; " + drained["note"]
        parts.append(text)
    if parts and pd_wait_reason:
        parts.append(pd_wait_reason)
    return "%s: %s" % (host, "; ".join(parts)) if parts else ""


def view_text(results, host, verdict, pd_wait_reason=""):
    """The routers' view of one server beside the gate's verdict, findings included; a decode
    kept out for want of a ready prefill (pd_wait) says why."""
    parts = []
    for r in results or []:
        text = "router %s: %s (gate: %s)" % (r["item"]["name"],
                                             r.get("before_text", "unreachable"), verdict)
        if r.get("finding"):
            text += "; FINDING: " + r["finding"]
        if r.get("changed"):
            text += "; added it" if r.get("action") == "added" else "; removed it"
        if pd_wait_reason:
            text += ": " + pd_wait_reason if r.get("changed") else "; " + pd_wait_reason
        parts.append(text)
    return "%s: %s" % (host, " | ".join(parts)) if parts else ""


class FilterModule(object):
    def filters(self):
        return {
            "sglang_fleet_router_spec": router_spec,
            "sglang_fleet_routers_of": routers_of,
            "sglang_fleet_router_identity": router_identity,
            "sglang_fleet_routers_to_call": routers_to_call,
            "sglang_fleet_membership_due": membership_due,
            "sglang_fleet_pd_router_gaps": pd_router_gaps,
            "sglang_fleet_pd_named_by_decodes": pd_named_by_decodes,
            "sglang_fleet_router_report_current": report_current,
            "sglang_fleet_router_host_view": router_host_view,
            "sglang_fleet_router_secret_values": router_secret_values,
            "sglang_fleet_router_admin_key": admin_key_filter,
            "sglang_fleet_worker_url": worker_url_filter,
            "sglang_fleet_membership_text": membership_text,
            "sglang_fleet_pd_wait": pd_wait,
            "sglang_fleet_router_view_text": view_text,
            "sglang_fleet_router_unseen_servers": unseen_servers_filter,
            "sglang_fleet_router_ready_to_add": ready_to_add_filter,
        }
