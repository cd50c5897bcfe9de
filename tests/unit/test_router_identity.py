"""A stop needs only the router's identity: refused secrets do not keep it from being built, and
the admin key the router was started with is read back from its env file."""

from __future__ import annotations

from sglang_fleet.node.router.api import recorded_admin_key
from sglang_fleet.router.render import render_router_files
from sglang_fleet.router.spec import build_router_identity, build_router_spec, router_secrets

GOOD = {"sglang_router_api_key": "rk-0123456789abcdef",
        "sglang_router_control_plane_api_keys": [
            {"id": "ops", "name": "o", "role": "user", "key": "us-0123456789abcdef"},
            {"id": "fleet", "name": "f", "role": "admin", "key": "ad-0123456789abcdef"}]}


def test_refused_secrets_leave_the_identity_whole():
    whole = build_router_spec(GOOD, "r1")["spec"]
    broken = {"sglang_router_api_key": "short", "sglang_router_control_plane_api_keys": [
        {"id": "fleet", "name": "f", "role": "admin", "key": "x"}]}
    assert not build_router_spec(broken, "r1")["ok"]
    built = build_router_identity(broken, "r1")
    assert built["ok"] and any("too short" in e for e in built["refused"])
    for field in ("name", "marker", "paths", "service", "admin_url", "metrics_url"):
        assert built["spec"][field] == whole[field], field
    assert build_router_identity(GOOD, "r1")["refused"] == []
    # A broken identity is still refused.
    assert not build_router_identity({**broken, "sglang_router_port": "x"}, "r1")["ok"]


def test_the_recorded_admin_key_is_read_from_the_routers_env_file(tmp_path):
    spec = build_router_spec(GOOD, "r1")["spec"]
    env = render_router_files(spec, router_secrets(GOOD))["env"]
    path = tmp_path / "router.env"
    path.write_text(env)
    assert recorded_admin_key(str(path)) == "ad-0123456789abcdef"
    assert recorded_admin_key(str(tmp_path / "missing.env")) == ""
    path.write_text("SGLANG_ROUTER_CONTROL_PLANE_KEY_0=ops:o:user:us-0123456789abcdef\n")
    assert recorded_admin_key(str(path)) == ""
