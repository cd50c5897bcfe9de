# -*- coding: utf-8 -*-
# Staging's filters: the node path a model source stages to, and each node's sources in the
# chain (the nodes before it, nearest first, the origin last).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

try:  # the collection and the package must be one release
    from ansible_collections.sglang.fleet.plugins.plugin_utils.package_version import version_error
except ImportError:  # loaded as a plain file (a unit test), not by Ansible: nothing to compare
    version_error = None
_VERSION_ERROR = version_error() if version_error else None
try:
    from sglang_fleet.staging import kernel_cache
    from sglang_fleet.staging.chain import peer_url, sources_by_node
    from sglang_fleet.staging.sources import SourceError, names, staged_path
except ImportError as exc:  # pragma: no cover - depends on the controller environment
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


def _ready():
    if _VERSION_ERROR is not None:
        raise AnsibleFilterError(_VERSION_ERROR)
    if _IMPORT_ERROR is not None:
        raise AnsibleFilterError("the sglang_fleet package is not importable: %s" % _IMPORT_ERROR)


def staged_path_filter(source, server_root):
    """sglang_stage_source | sglang_fleet_staged_path(sglang_server_root)"""
    _ready()
    try:
        return staged_path(source, server_root)
    except SourceError as exc:
        raise AnsibleFilterError(str(exc)) from None


def stage_names(source):
    """sglang_stage_source | sglang_fleet_stage_names: [model folder, revision folder]"""
    _ready()
    try:
        return list(names(source))
    except SourceError as exc:
        raise AnsibleFilterError(str(exc)) from None


def stage_sources(host, peers, hosts, origin):
    """The host's sources: the hosts before it in `hosts` (peers: host -> its
    sglang_stage_address and sglang_stage_port), nearest first, then the origin."""
    _ready()
    nodes = [(h, peer_url(peers[h]["sglang_stage_address"], peers[h]["sglang_stage_port"]))
             for h in hosts]
    return sources_by_node(nodes, origin)[host]


def _facts(hosts, hostvars, name):
    return dict((h, hostvars[h].get(name)) for h in hosts)


def kernel_cache_keys(hosts, hostvars):
    """ansible_play_hosts | sglang_fleet_kernel_cache_keys(hostvars): the hosts' kernel cache
    keys (sglang_server_launch_spec.kernel_cache), sorted."""
    _ready()
    return kernel_cache.keys(list(hosts), _facts(hosts, hostvars, "sglang_server_launch_spec"))


def kernel_cache_chains(hosts, hostvars, compared):
    """Per key, the hosts that fetch the controller's newest snapshot (`compared` names each
    host's registered sglang_kernel_cache state=compared result)."""
    _ready()
    return kernel_cache.stage_chains(list(hosts), _facts(hosts, hostvars,
                                                         "sglang_server_launch_spec"),
                                     _facts(hosts, hostvars, compared))


def kernel_cache_harvests(hosts, hostvars, compared):
    """Per key, the host whose live folder is harvested to the controller."""
    _ready()
    return kernel_cache.harvest_sources(list(hosts), _facts(hosts, hostvars,
                                                            "sglang_server_launch_spec"),
                                        _facts(hosts, hostvars, compared))


class FilterModule(object):
    def filters(self):
        return {
            "sglang_fleet_staged_path": staged_path_filter,
            "sglang_fleet_stage_sources": stage_sources,
            "sglang_fleet_stage_names": stage_names,
            "sglang_fleet_kernel_cache_keys": kernel_cache_keys,
            "sglang_fleet_kernel_cache_chains": kernel_cache_chains,
            "sglang_fleet_kernel_cache_harvests": kernel_cache_harvests,
        }
