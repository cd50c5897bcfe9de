"""The RouterSpec: one table of sglang_router_* settings, validated on the controller against the
pinned sglang-router's own options, rendered without ever writing a secret."""

from __future__ import annotations

import json

import pytest
import yaml

from sglang_fleet.node.router.host import flag_variable
from sglang_fleet.router.catalogue import router_catalogue
from sglang_fleet.router.render import render_router_files
from sglang_fleet.router.spec import (
    admin_key,
    build_router_spec,
    router_secrets,
    worker_url,
)
from sglang_fleet.settings import router as router_settings

API_KEY = "rk-4f1c9e2d7a6b5c3e8f90a1b2"
ADMIN_KEY = "cp-9a8b7c6d5e4f3a2b1c0d9e8f"
KEYS = [{"id": "fleet", "name": "sglang fleet", "role": "admin", "key": ADMIN_KEY},
        {"id": "grafana", "name": "dashboards", "role": "user", "key": "cp-user-0123456789abcdef"}]
SECRET_VALUES = {"sglang_router_api_key": API_KEY, "sglang_router_control_plane_api_keys": KEYS}


def build(**settings):
    """A router on the network (the role's default 0.0.0.0), open on purpose unless the test
    gives keys: its exposure has its own test."""
    settings.setdefault("allow_unauthenticated", True)
    return build_router_spec({f"sglang_router_{k}": v for k, v in settings.items()}, "r1",
                             "10.0.0.5")


def test_role_files_are_generated_from_the_table():
    for path, text in router_settings.ROLE_FILES.generated_files().items():
        assert path.read_text() == text, (
            f"{path} drifted: python -m sglang_fleet.settings --write")
    assert yaml.safe_load(router_settings.ROLE_FILES.defaults_yaml()) == router_settings.defaults()


def test_defaults_are_the_pinned_routers_own():
    cat = router_catalogue(router_settings.BY_NAME["version"].default)
    for s in router_settings.SETTINGS:
        if s.flag and s.render in ("value", "switch"):
            option = cat.by_flag[s.flag]
            expected = False if s.render == "switch" else option.default
            assert s.default == expected, f"{s.variable}: {s.default!r} vs {option.default!r}"


def test_a_default_router_renders_every_owned_option_with_its_value():
    result = build()
    assert result["ok"], result["errors"]
    spec = result["spec"]
    args = spec["router_args"]
    assert args[:3] == ["launch", "--host", "0.0.0.0"]
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert args[args.index("--health-check-interval-secs") + 1] == "60"
    assert "--disable-retries" not in args and "--worker-urls" not in args
    assert spec["url"] == "http://10.0.0.5:30000"  # listens everywhere: the host's address
    assert spec["admin_url"] == "http://127.0.0.1:30000"
    assert spec["metrics_url"] == "http://127.0.0.1:29000/metrics"


def test_a_router_open_to_the_network_without_keys_is_refused():
    refused = build(allow_unauthenticated=False)
    assert not refused["ok"]
    text = "\n".join(refused["errors"])
    assert ("sglang_router_api_key=<empty>: is empty while the router listens on 0.0.0.0 "
            "(sglang_router_host): any client that reaches it is served. Fix: set "
            "sglang_router_api_key") in text
    assert ("sglang_router_control_plane_api_keys=<empty>: is empty while the router listens "
            "on 0.0.0.0 (sglang_router_host): anyone who reaches it can add and remove "
            "workers") in text
    assert "sglang_router_allow_unauthenticated: true" in text
    # Keys, loopback, or saying it is meant: accepted.
    assert build(allow_unauthenticated=False, api_key=API_KEY, control_plane_api_keys=KEYS)["ok"]
    assert build(allow_unauthenticated=False, host="127.0.0.1")["ok"]
    assert build()["ok"]
    # A key alone still leaves the worker API open.
    only = build(allow_unauthenticated=False, api_key=API_KEY)
    assert [e.split(":")[1].strip() for e in only["errors"]] == [
        "sglang_router_control_plane_api_keys=<empty>"]


@pytest.mark.parametrize("settings, variable, value, fix", [
    ({"policy": "cache_awre"}, "sglang_router_policy", "'cache_awre'",
     "did you mean 'cache_aware'?"),
    ({"polcy": "random"}, "sglang_router_polcy", "'random'", "did you mean sglang_router_policy?"),
    ({"log_level": "verbose"}, "sglang_router_log_level", "'verbose'", "valid: debug, error"),
    ({"retry_max_retries": "many"}, "sglang_router_retry_max_retries", "'many'",
     "set an integer in 1..100"),
    ({"retry_jitter_factor": 2}, "sglang_router_retry_jitter_factor", "2",
     "set a value in 0..1"),
    ({"port": 29000}, "sglang_router_prometheus_port", "29000",
     "give the Prometheus endpoint a port of its own"),
    ({"stop_timeout": 60}, "sglang_router_stop_timeout", "60",
     "set sglang_router_stop_timeout to at least 190"),
    ({"extra_args": ["--worker-urls", "http://10.0.0.11:30000"]}, "sglang_router_extra_args",
     None, "ready servers join the router through the gate"),
    ({"extra_args": ["--policy", "random"]}, "sglang_router_extra_args", None,
     "set sglang_router_policy instead"),
    ({"extra_args": ["--max-concurrent", "8"]}, "sglang_router_extra_args", None,
     "write the full flag name --max-concurrent-requests"),
    ({"extra_args": ["--queue-size", "lots"]}, "sglang_router_extra_args", None,
     "give --queue-size an integer"),
    ({"extra_args": ["--no-such-option"]}, "sglang_router_extra_args", None,
     "`sglang-router launch --help` of sglang-router 0.3.2"),
    ({"version": "0.1.9"}, "sglang_router_version", "'0.1.9'",
     "or any release from 0.2.0 on"),
    ({"health_check_endpoint": "health"}, "sglang_router_health_check_endpoint", "'health'",
     "e.g. /health"),
])
def test_bad_settings_are_refused_with_variable_value_and_fix(settings, variable, value, fix):
    result = build(**settings)
    assert not result["ok"] and result["spec"] is None
    line = next((e for e in result["errors"] if f"{variable}=" in e), None)
    assert line, result["errors"]
    assert line.startswith(f"host r1: {variable}=")
    if value is not None:
        assert f"{variable}={value}:" in line
    assert fix in line.split("Fix: ", 1)[1]


@pytest.mark.parametrize("keys, problem", [
    ([{"id": "a:b", "name": "n", "role": "admin", "key": ADMIN_KEY}], "without ':'"),
    ([{"id": "a", "name": "n", "role": "root", "key": ADMIN_KEY}], "is not admin or user"),
    ([{"id": "a", "name": "n", "role": "admin", "key": "k3y-0a1b"}], "too short"),
    ([{"id": "a", "name": "n", "role": "admin", "key": "has spaces in it 12345"}],
     "cannot carry"),
    (["fleet:n:admin:" + ADMIN_KEY], "must be a mapping"),
])
def test_bad_control_plane_keys_are_refused_without_showing_them(keys, problem):
    result = build(control_plane_api_keys=keys)
    assert not result["ok"]
    text = "\n".join(result["errors"])
    assert problem in text and "sglang_router_control_plane_api_keys=<secret>" in text
    for key in keys:
        secret = key["key"] if isinstance(key, dict) else key
        assert secret not in text


def test_secrets_are_referenced_never_written():
    result = build(api_key=API_KEY, control_plane_api_keys=KEYS, host="127.0.0.1")
    assert result["ok"], result["errors"]
    spec = result["spec"]
    blob = json.dumps(spec)
    assert API_KEY not in blob and ADMIN_KEY not in blob
    assert spec["secret_env_names"] == ["SGLANG_ROUTER_API_KEY",
                                        "SGLANG_ROUTER_CONTROL_PLANE_KEY_0",
                                        "SGLANG_ROUTER_CONTROL_PLANE_KEY_1"]
    # id, name and role reach the router's own parser for its format check; the key does not.
    assert "fleet:sglang fleet:admin:********" in spec["router_args"]
    masked = render_router_files(spec, masked=True)
    assert API_KEY not in json.dumps(masked)
    script = masked["script"]
    assert "--api-key @env:SGLANG_ROUTER_API_KEY" in script
    assert "@env:SGLANG_ROUTER_CONTROL_PLANE_KEY_0 @env:SGLANG_ROUTER_CONTROL_PLANE_KEY_1" in \
        script
    assert ': "${SGLANG_ROUTER_API_KEY:?is empty' in script
    real = render_router_files(spec, router_secrets(SECRET_VALUES))
    assert f"SGLANG_ROUTER_API_KEY={API_KEY}" in real["env"]
    assert f"SGLANG_ROUTER_CONTROL_PLANE_KEY_0='fleet:sglang fleet:admin:{ADMIN_KEY}'" in \
        real["env"]
    assert API_KEY not in real["script"]
    with pytest.raises(ValueError, match="resolve empty"):
        render_router_files(spec, {})
    assert admin_key(KEYS) == ADMIN_KEY and admin_key(KEYS[1:]) == ""


def test_the_launch_script_hands_secrets_to_the_routers_own_entry_point():
    spec = build(api_key=API_KEY, service_manager="supervisor")["spec"]
    script = render_router_files(spec, masked=True)["script"]
    assert "from sglang_router.cli import main" in script
    assert "    launch \\\n    --host 0.0.0.0 \\\n    --port 30000 \\" in script
    assert "===== sglang-fleet: start" in script
    assert render_router_files(spec, masked=True)["unit"] is None
    unit = render_router_files(build()["spec"], masked=True)["unit"]
    assert "KillMode=control-group" in unit and "TimeoutStopSec=200" in unit


def test_a_changed_setting_changes_the_config_hash_and_nothing_else_does():
    one, two = build()["spec"], build()["spec"]
    assert one["config_hash"] == two["config_hash"]
    assert build(policy="round_robin")["spec"]["config_hash"] != one["config_hash"]
    # Membership timing is the fleet's business, not the router's command: no restart for it.
    assert build(drain_timeout=5)["spec"]["config_hash"] == one["config_hash"]


def test_worker_urls_as_the_router_reaches_each_server():
    spec = {"settings": {"sglang_server_host": "0.0.0.0"}, "http": {"port": 30000}}
    assert worker_url(spec, "10.0.0.11") == "http://10.0.0.11:30000"
    spec["settings"]["sglang_server_host"] = "127.0.0.1"
    assert worker_url(spec, "10.0.0.11") == "http://127.0.0.1:30000"
    spec["settings"]["sglang_server_host"] = "fd00::11"
    assert worker_url(spec, "x") == "http://[fd00::11]:30000"
    assert worker_url(spec, "x", "http://gw:8000/") == "http://gw:8000"


def test_a_refusal_from_the_installed_router_names_the_variable():
    variables = router_settings.OWNED_FLAGS
    assert flag_variable("argument --policy: invalid choice: 'x'", variables) == \
        "sglang_router_policy"
    assert flag_variable("unrecognized arguments: --foo", variables) == "sglang_router_extra_args"


def test_the_cli_refuses_a_router_secret_on_its_command_line():
    from sglang_fleet.runs.inputs import InputError, parse_extra_vars

    with pytest.raises(InputError, match="sglang_router_api_key: a secret on the command line"):
        parse_extra_vars([f"sglang_router_api_key={API_KEY}"])
    assert parse_extra_vars(["sglang_router_policy=round_robin"]) == {
        "sglang_router_policy": "round_robin"}


def test_a_pd_router_with_its_circuit_breaker_on_is_warned_and_still_built():
    """Router 0.3.2 charges a PD request's failure to its prefill and its decode alike: one
    dead decode opened both prefills' circuits (bench/zero_drop.py --pd --api chat)."""
    warned = build(pd_disaggregation=True)
    assert warned["ok"], warned["errors"]
    assert any("sglang_router_pd_disaggregation with the circuit breaker on" in w and
               "sglang_router_disable_circuit_breaker: true" in w for w in warned["warnings"]), \
        warned["warnings"]
    for quiet in (build(pd_disaggregation=True, disable_circuit_breaker=True,
                        extra_args=["--decode-policy", "round_robin"]), build()):
        assert not any("circuit breaker" in w for w in quiet["warnings"]), quiet["warnings"]


def test_a_pd_router_without_its_breaker_is_warned_while_its_decodes_keep_cache_aware():
    """Without the breaker a retry is what moves a request off a dead decode, and cache_aware
    sends every retry to the decode it chose first (router 0.3.2, measured)."""
    def warned(**settings):
        built = build(pd_disaggregation=True, disable_circuit_breaker=True, **settings)
        assert built["ok"], built["errors"]
        return [w for w in built["warnings"] if "decodes on the cache_aware policy" in w]

    assert warned() and "['--decode-policy', 'round_robin']" in warned()[0]
    assert warned(extra_args=["--decode-policy=cache_aware"])
    assert warned(policy="round_robin", extra_args=["--decode-policy", "cache_aware"])
    # Another decode policy, or a main policy the decodes then take, is not warned.
    assert not warned(extra_args=["--decode-policy", "round_robin"])
    assert not warned(extra_args=["--decode-policy=power_of_two"])
    assert not warned(policy="round_robin")


def test_a_stop_names_the_router_by_its_spec_as_a_server_is_named():
    from sglang_fleet.launch.views import service_module_args

    spec = build(user="sglang", service_manager="systemd", stop_timeout=200)["spec"]
    options = service_module_args(spec)
    assert options == {
        "marker": spec["marker"], "state_file": spec["paths"]["pid_file"],
        "manager": "systemd", "unit_name": f"{spec['name']}.service",
        # The user its unit runs as: members of another user would never be signalled.
        "service_user": "sglang", "node_rank": 0, "script": spec["paths"]["script"],
        "log_file": spec["paths"]["log_file"], "workdir": spec["paths"]["root"],
        "stop_timeout": 200}
