# -*- coding: utf-8 -*-
# Controller-side glue: Ansible templates call the sglang_fleet package, which builds and
# renders the LaunchSpec in one place for the playbooks, the CLI and the simulator.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

try:  # the collection and the package must be one release
    from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import version_error
except ImportError:  # loaded as a plain file (a unit test), not by Ansible: nothing to compare
    version_error = None
_VERSION_ERROR = version_error() if version_error else None
try:
    from sglang_fleet.bench.results import result_entry
    from sglang_fleet.known.release_check import batch_problems
    from sglang_fleet.launch.clashes import clash_errors, machine_of
    from sglang_fleet.launch.pd import SIDE_GROUP_PREFIX, deployment_errors, held_side
    from sglang_fleet.launch.render import render_files
    from sglang_fleet.launch.seed import seed_host_of
    from sglang_fleet.launch.spec import (
        IDENTITY_SETTINGS,
        PREFIX,
        build_identity,
        build_launch_spec,
        inventory_binds,
        launch_refusals,
        warm_caches,
    )
    from sglang_fleet.recovery.decisions import (
        choose_next,
        choose_rollback,
        kept_envs,
        previous_roots,
        recent_recoveries,
    )
    from sglang_fleet.rollout.judge import describe_signal
    from sglang_fleet.rollout.plan import plan_from_vars
    from sglang_fleet.rollout.targets import canary_problem, canary_targets
    from sglang_fleet.runs.advice import failure_block, operator_stopped
    from sglang_fleet.runs.store import read_jsonl, state_path
    from sglang_fleet.runs.whole_groups import (
        CanaryError,
        canary_hosts,
        serial_with_routers,
        split_group_errors,
    )
    from sglang_fleet.settings.server import TABLE as SERVER_TABLE
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None
if _IMPORT_ERROR is None and _VERSION_ERROR is None:
    # ansible-playbook imports this plugin before it forks a worker for each task and host:
    # built here, the catalogue, the parser and the rules are built once per run, not once
    # per host by every task that builds a LaunchSpec (0.06-0.09 s of CPU each).
    warm_caches()


def _need_package():
    if _VERSION_ERROR is not None:
        raise AnsibleFilterError(_VERSION_ERROR)
    if _IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            "the sglang_fleet Python package is not importable by ansible-playbook (%s); "
            "run the README's set-up command, or `pip install -e .` in the controller "
            "environment" % _IMPORT_ERROR)


def state_path_filter(name, config_file):
    """'ledger.jsonl' | sglang_fleet_state_path(ansible_config_file): the stores
    sit beside the ansible.cfg in use; a run without one keeps them in its working folder."""
    _need_package()
    project = os.path.dirname(str(config_file)) if config_file else os.getcwd()
    return state_path(str(name), project)


def launch_spec(settings, host, group_members=None, dist_init_host=None, seed_of=None):
    _need_package()
    return build_launch_spec(dict(settings), str(host),
                             list(group_members) if group_members else None,
                             str(dist_init_host) if dist_init_host else None,
                             dict(seed_of) if seed_of else None)


def seed_host(name, host, hostvars, groups):
    """sglang_server_weights_from_instance | sglang_fleet_seed_host(inventory_hostname,
    hostvars, groups): what the inventory says of the seed a server loads its weights from
    (launch.seed.SeedHost's fields), read from the seed's own variables; None when unset."""
    _need_package()
    return seed_host_of(name, str(host), hostvars, groups)


def host_refusals(host, hostvars, groups, batch, run_hosts, serial=None, canary=None,
                  partial_group_ok=False):
    """inventory_hostname | sglang_fleet_host_refusals(hostvars, groups, ansible_play_batch,
    ansible_play_hosts_all, serial, canary, partial_group_ok): every refusal of the host's
    LaunchSpec: its own (spec.launch_refusals, with the members of its multi-node group in
    this batch), whether the run holds that group whole (whole_groups), and its PD
    deployment's (pd). One call rather than a template, which each forked worker would
    compile anew."""
    _need_package()
    hv = hostvars[host]
    launch = dict(hv["sglang_server__launch"])
    spec = (hv.get("sglang_server_launch_spec") or {}) if launch["ok"] else {}
    group = (spec.get("group") or {}).get("name") or ""
    members = [h for h in batch if h in groups.get(group, [])] if group else []
    errors = launch_refusals(
        launch, {m: hostvars[m].get("sglang_server__launch") for m in members},
        {m: hostvars[m].get("sglang_server_launch_spec") for m in members})
    if not boolean(partial_group_ok, strict=False):
        routers = routers_only(groups)
        errors += split_group_errors(group, list(groups.get(group, [])) if group else [],
                                     [h for h in run_hosts if h not in routers], serial,
                                     canary_hosts_filter(canary, groups, run_hosts))
    # Two servers of one machine on one port or GPU set (machine_clashes, once per batch).
    errors += list((hv.get("sglang_server__clashes") or {}).get(host) or [])
    # The pinned release's own refusal of the command line (release_verdicts, once per batch).
    errors += list(((hv.get("sglang_server__release") or {}).get(host) or {}).get("errors")
                   or [])
    # A server outside any PD deployment is checked too: it cannot sit behind a PD router.
    deployment = (spec.get("pd") or {}).get("deployment") or ""
    pd_hosts = list(groups.get(deployment, [])) if deployment else []
    modes = {h: hostvars[h].get("sglang_server_disaggregation_mode") for h in pd_hosts}
    specs = {h: hostvars[h].get("sglang_server_launch_spec") for h in batch if h in pd_hosts}
    return errors + pd_refusals_filter(deployment, host, pd_hosts, modes, specs, groups,
                                       hostvars)


def release_verdicts(batch, hostvars):
    """ansible_play_batch | sglang_fleet_release_verdicts(hostvars), once per batch (run_once):
    each pinned release's own verdict on its servers' command lines, all of one release's
    hosts in one run of its environment (release_check): {host: {"errors", "notes"}}."""
    _need_package()
    cases = {}
    for host in batch:
        launch = hostvars[host].get("sglang_server__launch") or {}
        if launch.get("ok") and launch.get("release_case"):
            cases[host] = dict(launch["release_case"])
    return batch_problems(cases)


def machine_clashes(batch, hostvars, groups):
    """ansible_play_batch | sglang_fleet_machine_clashes(hostvars, groups), once per batch
    (run_once): for each server of the batch, why it cannot share its machine with the
    inventory's other servers there: the same port, or the same GPUs (see clashes). The
    batch's servers are compared by their LaunchSpecs, the others (outside the run, or in a
    later batch) by what their inventory variables build. Each host's variables are read
    once: reading every host's from every host would grow with the square of the fleet."""
    _need_package()
    on = {}
    for name in groups.get("sglang_servers", []):
        on.setdefault(machine_of(hostvars, name), []).append(name)
    out = {}
    for machine, names in on.items():
        if len(names) < 2 or not any(n in batch for n in names):
            continue
        binds = dict((n, _binds_of(hostvars, groups, batch, n)) for n in names)
        machines = dict((n, machine) for n in names)
        for name in names:
            errors = clash_errors(name, machines, binds) if name in batch else []
            if errors:
                out[name] = errors
    return out


def _binds_of(hostvars, groups, batch, name):
    if name not in batch:
        return _inventory_binds(hostvars, groups, name)
    launch = hostvars[name].get("sglang_server__launch") or {}
    if not launch.get("ok"):
        return None  # refused on its own, and saying why
    return (hostvars[name].get("sglang_server_launch_spec") or {}).get("binds")


def _inventory_binds(hostvars, groups, name):
    """A server's binds from its inventory variables, or None where they do not resolve (an
    unset key variable, say): that server is checked when a run holds it."""
    hv = hostvars[name]
    try:
        settings = dict((k, hv[k]) for k in hv
                        if k.startswith("sglang_server_") and not k.startswith("sglang_server__"))
    except Exception:  # noqa: BLE001 - any templating error leaves the host unchecked here
        return None
    group = settings.get("sglang_server_group")
    members = sorted(groups.get(group, [])) if group else None
    seed_of = seed_host_of(settings.get("sglang_server_weights_from_instance"), str(name),
                           hostvars, groups)
    return inventory_binds(settings, str(name), members, seed_of)


def identity(settings, host, group_members=None):
    _need_package()
    return build_identity(dict(settings), str(host),
                          list(group_members) if group_members else None)


def identity_variables(names):
    """Of the given variable names, those build_identity reads."""
    _need_package()
    wanted = set(PREFIX + n for n in IDENTITY_SETTINGS) | set([PREFIX + "overrides"])
    return [n for n in names if n in wanted]


def render(spec, secrets=None, masked=False):
    _need_package()
    return render_files(spec, dict(secrets or {}), masked=bool(masked))


def next_spec(settings, facts, ledger_path, host, fallback_chain=None, verdict=None,
              running=None, window_s=3600, rollback=False):
    """The next configuration for a failed server: `verdict` is the gate's, `running` what
    ran as the node recorded it (sglang_evidence's `running`); see recovery.choose_next.
    `rollback`: back to the configuration ready before the running one
    (recovery.choose_rollback), whatever the verdict."""
    _need_package()
    if rollback:
        return choose_rollback(dict(settings), read_jsonl(ledger_path), str(host),
                               dict(running or {}))
    return choose_next(dict(settings), dict(facts), read_jsonl(ledger_path), str(host),
                       list(fallback_chain or []), dict(verdict or {}), dict(running or {}),
                       float(window_s))


def recoveries_in_window(ledger_path, host, window_s):
    _need_package()
    return recent_recoveries(read_jsonl(ledger_path), str(host), float(window_s))


def bench_result_entry(spec, benchmark, label="", run_id=""):
    _need_package()
    return result_entry(dict(spec), dict(benchmark), str(label or ""), str(run_id or ""))


def kept_envs_filter(ledger_path, host, config_hash):
    """ledger | sglang_fleet_kept_envs(inventory_hostname, config_hash): the pip release
    environments of the host's previous ready and last known good configurations, which a
    prune keeps (see recovery.kept_envs)."""
    _need_package()
    defaults = {s.variable: s.default for s in SERVER_TABLE}
    return kept_envs(read_jsonl(ledger_path), str(host), str(config_hash), defaults)


def previous_roots_filter(ledger_path, host, root):
    """ledger | sglang_fleet_previous_roots(inventory_hostname, root): the roots the host's
    servers became ready from before, other than `root` (see recovery.previous_roots)."""
    _need_package()
    return previous_roots(read_jsonl(ledger_path), str(host), str(root))


def failure_block_filter(verdict, host, facts=None, evidence=None):
    """verdict | sglang_fleet_failure_block(inventory_hostname, facts): the verdict in words
    with its cause, next step, a matching Rule, the fix and the evidence path."""
    _need_package()
    return failure_block(dict(verdict or {}), str(host), dict(facts or {}),
                         str(evidence) if evidence else None)


def operator_stopped_test(verdict):
    """Whether the verdict is a stop that stop.yml recorded (health passes the host)."""
    _need_package()
    return operator_stopped(dict(verdict or {}))


def split_group_filter(group, members, run_hosts, serial=None):
    """group | sglang_fleet_split_group(groups[group], ansible_play_hosts_all, serial): why
    this run does not hold a multi-node server whole (see whole_groups)."""
    _need_package()
    return split_group_errors(str(group or ""), list(members or []), list(run_hosts or []),
                              serial)


def canary_hosts_filter(canary, groups, run_hosts):
    """sglang_fleet_canary | sglang_fleet_canary_hosts(groups, run_hosts): the canary servers
    it names among the run's servers (a host, hosts, or a percentage; whole_groups)."""
    _need_package()
    run = set(run_hosts or [])
    try:
        return canary_hosts(canary, [h for h in groups.get("sglang_servers", []) if h in run])
    except CanaryError as exc:
        raise AnsibleFilterError(str(exc)) from None


def routers_only(groups):
    """The hosts that route and serve nothing: deploy.yml's servers' play runs them too, in its
    first batch, ahead of the servers."""
    return set(groups.get("sglang_routers", [])) - set(groups.get("sglang_servers", []))


def serial_with_routers_filter(serial, groups, run_hosts, canary=None):
    """sglang_fleet_serial | sglang_fleet_serial_with_routers(groups, run_hosts, canary): the
    servers' play's `serial` with the routers of this run (not beside a canary, whose play
    checks them) in its first batch; `run_hosts` the hosts --limit leaves."""
    _need_package()
    run = set(run_hosts or [])
    canaries = canary_hosts_filter(canary, groups, run_hosts)
    servers = [h for h in groups.get("sglang_servers", []) if h in run and h not in canaries]
    routers = [] if canaries else [h for h in routers_only(groups) if h in run]
    # The PD sides validate.yml grouped (pd_held_side): no batch may hold one whole.
    sides = [set(hosts) & run for name, hosts in groups.items()
             if name.startswith(SIDE_GROUP_PREFIX)]
    return serial_with_routers(serial, servers, len(routers), sides)


def pd_held_side(host, deployment, groups, hostvars, run_hosts):
    """inventory_hostname | sglang_fleet_pd_held_side(sglang_server_pd_deployment, groups,
    hostvars, ansible_play_hosts_all): the group validate.yml puts a server in when a deploy
    must not take its whole PD side out at once ('' when none; see pd.held_side)."""
    _need_package()
    if not deployment:
        return ""
    default = SERVER_TABLE.by_name["pd_keep_side_serving"].default
    members = {}
    for h in groups.get(str(deployment), []):
        hv = hostvars[h]
        members[h] = {"deployment": str(deployment),
                      "mode": hv.get("sglang_server_disaggregation_mode"),
                      "unit": hv.get("sglang_server_group") or h,
                      "keep": boolean(hv.get("sglang_server_pd_keep_side_serving", default),
                                      strict=False)}
    return held_side(str(host), members, list(run_hosts or []))


def pd_refusals_filter(deployment, host, members, modes, specs, groups, hostvars):
    """Why a PD deployment cannot run, or why a server outside one cannot sit behind a router
    in PD mode (see pd); host_refusals calls it."""
    _need_package()
    routers = {}
    for name in groups.get("sglang_routers", []):
        hv = hostvars[name]
        workers = list(groups.get(hv.get("sglang_router_workers_group", "sglang_servers"), []))
        if host in workers:
            routers[name] = (boolean(hv.get("sglang_router_pd_disaggregation", False),
                                     strict=False), workers)
    return deployment_errors(str(deployment or ""), str(host), list(members or []),
                             dict(modes or {}), dict(specs or {}), routers)


def canary_targets_filter(canary, groups, hostvars, exclude=None):
    """sglang_fleet_canary | sglang_fleet_canary_targets(groups, hostvars, exclude): the
    canary, the servers it is judged against (none of `exclude`) and its routers' metrics URLs
    (rollout.targets)."""
    _need_package()
    return canary_targets(str(canary), dict(groups), hostvars, list(exclude or []))


def canary_problems(host, hostvars, canaries=None):
    """host | sglang_fleet_canary_problems(hostvars, canaries): why the server's canary plan
    (its sglang_bench_canary_* variables: a canary, or a later batch's server judged like it)
    is refused, and why it cannot be judged alone (as one of `canaries`, all when None, or as
    a later batch's server); [] when fine."""
    _need_package()
    hv = hostvars[str(host)]
    given = {k: hv[k] for k in hv if str(k).startswith("sglang_bench_canary_")}
    problems = plan_from_vars(given)[1]
    problem = canary_problem(str(host), hostvars,
                             canaries is None or str(host) in list(canaries))
    return problems + ([problem] if problem else [])

def canary_signal(signal):
    """signal | sglang_fleet_canary_signal: one signal of a canary's judgement in words."""
    _need_package()
    return describe_signal(dict(signal))


class FilterModule(object):
    def filters(self):
        return {
            "sglang_fleet_launch_spec": launch_spec,
            "sglang_fleet_seed_host": seed_host,
            "sglang_fleet_identity": identity,
            "sglang_fleet_identity_variables": identity_variables,
            "sglang_fleet_render": render,
            "sglang_fleet_host_refusals": host_refusals,
            "sglang_fleet_next_spec": next_spec,
            "sglang_fleet_failure_block": failure_block_filter,
            "sglang_fleet_operator_stopped": operator_stopped_test,
            "sglang_fleet_recent_recoveries": recoveries_in_window,
            "sglang_fleet_bench_result_entry": bench_result_entry,
            "sglang_fleet_previous_roots": previous_roots_filter,
            "sglang_fleet_canary_hosts": canary_hosts_filter,
            "sglang_fleet_canary_targets": canary_targets_filter,
            "sglang_fleet_canary_problems": canary_problems,
            "sglang_fleet_canary_signal": canary_signal,
            "sglang_fleet_kept_envs": kept_envs_filter,
            "sglang_fleet_state_path": state_path_filter,
            "sglang_fleet_split_group": split_group_filter,
            "sglang_fleet_machine_clashes": machine_clashes,
            "sglang_fleet_release_verdicts": release_verdicts,
            "sglang_fleet_serial_with_routers": serial_with_routers_filter,
            "sglang_fleet_pd_held_side": pd_held_side,
        }
