"""Every module that acts on a deployment takes its LaunchSpec (or a router's, its RouterSpec)
view through `from_spec`: its action plugin turns a LaunchSpec (or an identity, or a
RouterSpec) into exactly the options the playbooks used to map by hand, and the module's own
argument spec accepts them."""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from sglang_fleet.launch import views as spec_views
from sglang_fleet.launch.render import deployment_files
from sglang_fleet.launch.spec import build_identity, build_launch_spec
from sglang_fleet.router import views as router_views
from sglang_fleet.router.spec import admin_key, build_router_spec, router_secrets
from sglang_fleet.router.views import router_node
from sglang_fleet.testfleet.local import REPO, role_defaults

sys.path.insert(0, str(REPO / ".collections"))  # ansible_collections.sglang.fleet: the repo

SECRETS = {"SGLANG_FLEET_API_KEY": "sk-test-0123456789abcdef"}


@pytest.fixture(scope="module")
def spec():
    settings = dict(role_defaults(), sglang_server_attention_backend="triton",
                    sglang_server_host="10.0.0.5",
                    sglang_server_api_key=SECRETS["SGLANG_FLEET_API_KEY"])
    built = build_launch_spec(settings, "node1")
    assert built["ok"], built["errors"]
    return built["spec"]


@pytest.fixture(scope="module")
def identity():
    built = build_identity(role_defaults(), "node1")
    assert built["ok"], built["errors"]
    return built["spec"]


def action_plugin(name):
    """The module's action plugin."""
    return importlib.import_module(f"ansible_collections.sglang.fleet.plugins.action.{name}")


def action(name, task_args, check_mode=False, batch=3, forks=2):
    """The module's action plugin, as Ansible holds it for one task."""
    plugin = action_plugin(name)
    act = plugin.ActionModule.__new__(plugin.ActionModule)
    act._task = SimpleNamespace(args=dict(task_args), check_mode=check_mode,
                                action=f"sglang.fleet.{name}")
    act._play_context = SimpleNamespace(check_mode=check_mode)
    act._task_vars = {}
    vars_ = {"ansible_play_batch": ["h"] * batch, "ansible_forks": forks,
             "inventory_hostname": "node1", "groups": {}}
    return act, vars_


def options_sent(name, task_args, **kw):
    act, task_vars = action(name, task_args, **kw)
    return act.spec_args(task_vars)


def argument_spec(name, monkeypatch):
    """The argument spec the module's main() hands AnsibleModule."""
    module = importlib.import_module(f"ansible_collections.sglang.fleet.plugins.modules.{name}")
    seen = {}

    class Seen(Exception):
        pass

    def capture(**kwargs):
        seen.update(kwargs)
        raise Seen

    monkeypatch.setattr(module, "AnsibleModule", capture)
    if hasattr(module, "_load_params"):  # sglang_node reads its options before AnsibleModule
        monkeypatch.setattr(module, "_load_params", dict)
    with pytest.raises(Seen):
        module.main()
    return seen


def accepted(name, options, monkeypatch):
    given = argument_spec(name, monkeypatch)
    validator = ArgumentSpecValidator(
        given["argument_spec"], **{k: given[k] for k in (
            "mutually_exclusive", "required_together", "required_one_of", "required_if",
            "required_by") if k in given})
    errors = validator.validate(options).error_messages
    assert not errors, f"{name}: {errors}"


# What each task gives beside `from_spec` (its own logic), and the options the playbooks
# used to map from the LaunchSpec by hand, field by field, before the views.
def _by_hand(s):
    paths, service, gpu = s["paths"], s["service"], s["gpu"]
    return {
        "sglang_argcheck": ({}, {
            "python": s["install"]["server_python"], "parser": s["install"]["args_parser"],
            "args": s["server_args"],
            "record_file": f"{paths['run_dir']}/{s['deployment']}.argcheck.json"}),
        "sglang_evidence": ({"verdict": {"verdict": "stalled"}}, {
            "marker": s["marker"], "state_file": paths["pid_file"],
            "manager": service["manager"], "unit_name": service["unit_name"],
            "log_file": paths["log_file"], "evidence_dir": paths["evidence_dir"],
            "launch_spec": s, "running_spec_file": paths["running_spec"],
            "gpu_backend": gpu["backend"], "sim_dir": gpu["sim_dir"],
            "kernel_log": s["gate"]["kernel_log"],
            "server_python": s["install"]["server_python"]}),
        "sglang_stop": ({"hung": True, "term_timeout": 30, "aggressive": False,
                         "verify_timeout": 60, "gpu_reset": False}, {
            "marker": s["marker"], "state_file": paths["pid_file"],
            "manager": service["manager"], "unit_name": service["unit_name"],
            "service_user": service["user"], "node_rank": s["group"]["node_rank"],
            "log_file": paths["log_file"], "gpu_backend": gpu["backend"],
            "sim_dir": gpu["sim_dir"], "baseline_file": paths["baseline_file"],
            "reboot_mark": paths["reboot_mark"]}),
        "sglang_shm_cleanup": ({}, {
            "shm_dir": paths["shm_dir"], "state_file": paths["pid_file"],
            "marker": s["marker"], "service_user": service["user"]}),
        "sglang_port_owner": ({}, {
            "port": s["http"]["port"], "host": s["settings"]["sglang_server_host"],
            "marker": s["marker"]}),
        "sglang_bench": ({"input_len": 8, "output_len": 4}, {
            "host": s["gate"]["host"], "port": s["http"]["port"],
            "env_file": paths["env_file"]}),
    }


@pytest.mark.parametrize("name", ["sglang_argcheck", "sglang_evidence", "sglang_stop",
                                  "sglang_shm_cleanup", "sglang_port_owner", "sglang_bench"])
def test_a_modules_from_spec_gives_what_the_playbooks_mapped_by_hand(name, spec, monkeypatch):
    given, by_hand = _by_hand(spec)[name]
    sent = options_sent(name, {"from_spec": spec, **given})
    assert sent == {**by_hand, **given}
    accepted(name, sent, monkeypatch)


def test_deployment_files_are_rendered_on_the_controller_and_the_values_never_sent(
        spec, monkeypatch):
    sent = options_sent("sglang_deployment_files",
                        {"from_spec": spec, "secret_values": SECRETS})
    files = deployment_files(spec, SECRETS)
    assert sent == {"folders": files["folders"], "files": files["files"],
                    "secret_files": files["secret_files"]}
    assert "secret_values" not in sent
    assert any(SECRETS["SGLANG_FLEET_API_KEY"] in f["content"] for f in sent["secret_files"])
    accepted("sglang_deployment_files", sent, monkeypatch)


def test_the_lock_of_a_launchspec_declares_the_gates_lease_and_a_stop_or_release_none(
        spec, identity, monkeypatch):
    act, task_vars = action("sglang_lock", {})
    act._task_vars = task_vars
    lock = {"path": spec["paths"]["recover_lock"], "name": spec["marker"]}
    taken = act.view(spec, {"purpose": "recover"})
    # The lease the playbooks computed with the former filter, from the batch and the forks.
    assert taken == {**lock, "lease": spec_views.lock_lease(spec, 3, 2)}
    assert taken["lease"] > spec_views.lock_lease(spec, 1, 1)  # two waves of hosts
    assert act.view(spec, {"state": "updated"}) == lock
    assert act.view(spec, {"state": "released"}) == lock
    assert act.view(identity, {"purpose": "stop"}) == {
        "path": identity["paths"]["recover_lock"], "name": identity["marker"]}
    accepted("sglang_lock", {**taken, "purpose": "recover", "run": {"pid": 1}}, monkeypatch)


def test_the_drain_step_asks_with_the_files_the_start_digests(spec, monkeypatch):
    paths, service = spec["paths"], spec["service"]
    sent = options_sent("sglang_service", {"from_spec": spec, "pending": True,
                                           "state": "started"})
    assert sent == {
        "marker": spec["marker"], "manager": service["manager"],
        "unit_name": service["unit_name"], "service_user": service["user"],
        "node_rank": spec["group"]["node_rank"], "script": paths["script"],
        "log_file": paths["log_file"], "state_file": paths["pid_file"],
        "config_files": [paths["script"], paths["env_file"], paths["config_file"]]
        + ([paths["unit_file"]] if paths["unit_file"] else []), "state": "started"}
    accepted("sglang_service", sent, monkeypatch)


@pytest.mark.parametrize("name", ["sglang_health", "sglang_service", "sglang_node"])
def test_the_first_views_are_accepted_by_their_modules(name, spec, monkeypatch):
    sent = options_sent(name, {"from_spec": spec})
    assert sent["marker" if name != "sglang_node" else "host_name"] in (spec["marker"],
                                                                         spec["host"])
    accepted(name, sent, monkeypatch)


def test_options_given_beside_from_spec_win(spec):
    sent = options_sent("sglang_stop", {"from_spec": spec, "marker": "other:dep"})
    assert sent["marker"] == "other:dep" and sent["state_file"] == spec["paths"]["pid_file"]


def test_a_launchspec_carries_its_schema_and_its_typed_shape(spec, identity):
    assert spec["schema"] == identity["schema"] == spec_views.SCHEMA
    assert set(spec) == set(spec_views.LaunchSpec.__annotations__)
    assert set(identity) == set(spec_views.Identity.__annotations__)


def test_a_newer_schema_is_refused_naming_both_and_an_unversioned_record_is_read(spec):
    newer = dict(spec, schema=spec_views.SCHEMA + 1)
    with pytest.raises(AnsibleActionFail, match=rf"schema {spec_views.SCHEMA + 1}, newer than "
                       rf"this release of sglang-fleet reads \(schema {spec_views.SCHEMA}\)"):
        options_sent("sglang_stop", {"from_spec": newer})
    # A LaunchSpec a node recorded before the field existed (recovery's fallback).
    old = {k: v for k, v in spec.items() if k != "schema"}
    old["paths"] = {k: v for k, v in spec["paths"].items() if k != "running_spec"}
    sent = options_sent("sglang_evidence", {"from_spec": old})
    assert sent["running_spec_file"] == spec["paths"]["running_spec"]
    with pytest.raises(AnsibleActionFail, match="must be a LaunchSpec \\(a mapping\\), got str"):
        options_sent("sglang_stop", {"from_spec": "node1"})
    with pytest.raises(AnsibleActionFail, match="not a LaunchSpec of this release.*'paths'"):
        options_sent("sglang_stop", {"from_spec": {"schema": 1, "marker": "x"}})


def test_the_kernel_cache_view_names_the_keys_folders_and_refuses_a_server_without(
        spec, monkeypatch):
    settings = dict(role_defaults(), sglang_server_attention_backend="triton",
                    sglang_server_kernel_cache=True)
    cached = build_launch_spec(settings, "node1")["spec"]
    view = cached["kernel_cache"]
    sent = options_sent("sglang_kernel_cache", {"from_spec": cached, "state": "compared"})
    assert sent == {"root": cached["paths"]["root"], "key": view["key"], "live": view["live"],
                    "snapshots": view["snapshots"], "user": cached["service"]["user"],
                    "state": "compared"}
    accepted("sglang_kernel_cache", sent, monkeypatch)
    with pytest.raises(AnsibleActionFail, match="sglang_server_kernel_cache is off"):
        options_sent("sglang_kernel_cache", {"from_spec": spec, "state": "compared"})


def test_the_env_view_names_the_pip_environment_and_refuses_a_server_without(
        spec, monkeypatch):
    env = spec["install"]["env"]
    sent = options_sent("sglang_env", {"from_spec": spec, "state": "check"})
    assert sent == {"envs_dir": spec["paths"]["envs_dir"], "env_id": env["id"],
                    "requirements": env["requirements"], "keep": 2, "state": "check"}
    accepted("sglang_env", sent, monkeypatch)
    existing = build_launch_spec(dict(role_defaults(), sglang_server_attention_backend="triton",
                                      sglang_server_install_mode="existing"), "node1")["spec"]
    with pytest.raises(AnsibleActionFail, match="install mode existing has no release environment"):
        options_sent("sglang_env", {"from_spec": existing, "state": "check"})


# ---- a router's modules: its RouterSpec through sglang_fleet.router.views ------------------

ROUTER_SECRETS = {"sglang_router_api_key": "rk-4f1c9e2d7a6b5c3e8f90a1b2",
                  "sglang_router_control_plane_api_keys": [
                      {"id": "fleet", "name": "sglang fleet", "role": "admin",
                       "key": "cp-9a8b7c6d5e4f3a2b1c0d9e8f"}]}


@pytest.fixture(scope="module")
def router_spec():
    built = build_router_spec({"sglang_router_host": "0.0.0.0", "sglang_router_port": 44010,
                               "sglang_router_root": "/opt/r", **ROUTER_SECRETS},
                              "router1", "10.0.0.9")
    assert built["ok"], built["errors"]
    return built["spec"]


def test_the_router_node_is_given_its_host_view_its_keys_rendered_on_the_controller(
        router_spec, monkeypatch):
    sent = options_sent("sglang_router_node",
                        {"from_spec": router_spec, "secret_values": ROUTER_SECRETS})
    # What the role's tasks passed before: the host's name and the filter's view.
    assert sent == {"host_name": "router1", "router": router_node(
        router_spec, router_secrets(ROUTER_SECRETS),
        admin_key(ROUTER_SECRETS["sglang_router_control_plane_api_keys"]),
        ROUTER_SECRETS["sglang_router_api_key"])}
    assert "secret_values" not in sent
    env = sent["router"]["secret_files"][0]
    assert env["path"] == router_spec["paths"]["env_file"] and env["mode"] == "0600"
    assert ROUTER_SECRETS["sglang_router_api_key"] in env["content"]
    assert sent["router"]["admin_key"] == "cp-9a8b7c6d5e4f3a2b1c0d9e8f"
    accepted("sglang_router_node", {**sent, "after_install": True}, monkeypatch)
    # Its keys unset: the view refuses, as the render does, naming the variables.
    with pytest.raises(AnsibleActionFail, match="sglang_router_api_key"):
        options_sent("sglang_router_node", {"from_spec": router_spec, "secret_values": {}})


def test_the_router_probe_reports_the_router_its_spec_names(router_spec, monkeypatch):
    given = {"admin_key": "cp-9a8b7c6d5e4f3a2b1c0d9e8f", "api_key": "k", "judge": True}
    sent = options_sent("sglang_router_probe", {"from_spec": router_spec, **given})
    # probe.yml's options before the view, field by field.
    assert sent == {"url": router_spec["admin_url"], **given, "report": {
        "name": "router1", "url": router_spec["url"], "version": router_spec["version"],
        "policy": router_spec["policy"]}}
    assert sent["url"] == "http://127.0.0.1:44010" and \
        sent["report"]["url"] == "http://10.0.0.9:44010"
    accepted("sglang_router_probe", sent, monkeypatch)
    # recover.yml reads only the workers: no report, so no line, no verdict, no failure.
    read = options_sent("sglang_router_probe", {"from_spec": router_spec, "report": None})
    assert read == {"url": router_spec["admin_url"], "report": None}
    accepted("sglang_router_probe", read, monkeypatch)


def test_a_routers_membership_takes_its_api_metrics_and_timeouts_from_the_spec(
        router_spec, monkeypatch):
    given = {"router_name": "router1", "worker_url": "http://10.0.0.11:30000",
             "state": "absent", "drain": True}
    sent = options_sent("sglang_router_member", {"from_spec": router_spec, **given})
    membership = router_spec["membership"]
    # membership.yml's options before the view, field by field.
    assert sent == {**given, "router_url": router_spec["admin_url"],
                    "router_metrics_url": router_spec["metrics_url"],
                    "join_timeout": membership["join_timeout"],
                    "drain_timeout": membership["drain_timeout"],
                    "drain_poll_interval": membership["drain_poll_interval"]}
    accepted("sglang_router_member", sent, monkeypatch)
    # A stop reads the key the router was started with from its env file; the flag itself
    # stays on the controller, and a templated "False" is no.
    stop = options_sent("sglang_router_member", {"from_spec": router_spec, **given,
                                                 "key_from_host": True})
    assert stop == {**sent, "admin_key_file": router_spec["paths"]["env_file"]}
    assert options_sent("sglang_router_member", {"from_spec": router_spec, **given,
                                                 "key_from_host": "False"}) == sent
    accepted("sglang_router_member", stop, monkeypatch)


def test_a_router_module_refuses_what_is_not_a_routerspec_naming_it(router_spec):
    with pytest.raises(AnsibleActionFail, match="sglang_router_probe: from_spec must be a "
                                                "RouterSpec \\(a mapping\\), got str"):
        options_sent("sglang_router_probe", {"from_spec": "router1"})
    with pytest.raises(AnsibleActionFail, match="not a RouterSpec of this release.*'membership'"):
        options_sent("sglang_router_member", {"from_spec": {"admin_url": "http://x",
                                                            "metrics_url": "http://y"}})
    # Without from_spec the module takes its options as given (and never the flag).
    assert options_sent("sglang_router_member", {"router_url": "http://x", "worker_url": "w",
                                                 "key_from_host": True}) == {
        "router_url": "http://x", "worker_url": "w"}


TESTED = {"sglang_argcheck", "sglang_evidence", "sglang_stop", "sglang_shm_cleanup",
          "sglang_port_owner", "sglang_bench", "sglang_deployment_files", "sglang_lock",
          "sglang_service", "sglang_health", "sglang_node", "sglang_kernel_cache",
          "sglang_env", "sglang_router_node", "sglang_router_probe", "sglang_router_member"}


def test_every_module_that_takes_from_spec_has_its_view_plugin_and_a_test_here():
    modules = {p.stem for p in (REPO / "plugins" / "modules").glob("sglang_*.py")}
    documented = {m for m in modules
                  if "from_spec" in (REPO / "plugins" / "modules" / f"{m}.py").read_text()}
    viewing = set()
    for name in modules:
        try:
            plugin = action_plugin(name)
        except ModuleNotFoundError:
            continue  # a module without an action plugin
        if hasattr(plugin.ActionModule, "spec_args"):
            viewing.add(name)
    assert documented == viewing == TESTED
    assert set(spec_views.VIEWS) | set(router_views.VIEWS) <= TESTED
