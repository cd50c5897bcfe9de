"""The router's host as the router node module sees it: the pinned release read from the
virtualenv without pip, the files and digest it is given, the refusal of a command the installed
router rejects, and the parser's fingerprint read by the router's own Python."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fleet.node.deploy.argcheck import args_record
from sglang_fleet.node.process.service import content_digest
from sglang_fleet.node.router import host as rn
from sglang_fleet.router.spec import build_router_spec, router_secrets
from sglang_fleet.router.views import router_node
from sglang_fleet.testfleet.local import loopback_http_server

API_KEY = "rk-4f1c9e2d7a6b5c3e8f90a1b2"
ADMIN_KEY = "cp-9a8b7c6d5e4f3a2b1c0d9e8f"
KEYS = [{"id": "fleet", "name": "sglang fleet", "role": "admin", "key": ADMIN_KEY}]
SECRET_VALUES = {"sglang_router_api_key": API_KEY, "sglang_router_control_plane_api_keys": KEYS}


def view(tmp_path: Path, **settings) -> dict:
    settings = {"sglang_router_root": str(tmp_path / "router"),
                "sglang_router_host": "127.0.0.1",
                "sglang_router_service_manager": "supervisor", **settings}
    built = build_router_spec(settings, "r1", "10.0.0.5")
    assert built["ok"], built["errors"]
    return router_node(built["spec"], router_secrets(SECRET_VALUES))


def fake_venv(root: Path, *dists: str) -> Path:
    site = root / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "bin" / "python").write_text("")
    for dist in dists:
        (site / f"{dist}.dist-info").mkdir()
    return root


def test_the_pinned_release_is_read_from_the_virtualenv(tmp_path):
    venv = fake_venv(tmp_path / "venv", "sglang_router-0.3.2", "requests-2.32.3")
    assert rn.pinned_installed(str(venv), ["sglang-router==0.3.2"])
    assert rn.pinned_installed(str(venv), ["SGLang.Router == 0.3.2", "requests==2.32.3"])
    assert not rn.pinned_installed(str(venv), ["sglang-router==0.3.3"]), "another release"
    assert not rn.pinned_installed(str(venv), ["sglang-router>=0.3"]), "not a pin: pip decides"
    assert not rn.pinned_installed(str(tmp_path / "none"), ["sglang-router==0.3.2"])
    (venv / "bin" / "python").unlink()
    assert not rn.pinned_installed(str(venv), ["sglang-router==0.3.2"]), "no interpreter"


def test_the_host_is_given_its_files_with_the_keys_only_in_the_env_file(tmp_path):
    r = view(tmp_path, sglang_router_api_key=API_KEY,
             sglang_router_control_plane_api_keys=KEYS)
    env = r["secret_files"][0]
    assert env["mode"] == "0600" and env["path"].endswith(".env")
    assert API_KEY in env["content"] and ADMIN_KEY in env["content"]
    public = repr({k: v for k, v in r.items() if k != "secret_files"})
    assert API_KEY not in public and ADMIN_KEY not in public
    assert "********" in r["args"] and r["args"][0] == "--host"
    assert [f["mode"] for f in r["folders"]] == ["0755", "0750", "0755", "0755"]
    assert r["liveness_url"] == "http://127.0.0.1:30000/liveness"
    assert r["argcheck_record"].endswith("/run/sglang-router-30000.argcheck.json")
    # The digest the service records: script, env file, then the unit, in that order.
    script = r["files"][0]
    assert rn.digest_of(r) == content_digest([(script["path"], script["content"].encode()),
                                              (env["path"], env["content"].encode())])
    unit = view(tmp_path, sglang_router_service_manager="systemd")
    assert [f["mode"] for f in unit["files"]] == ["0755", "0644"]
    assert rn.config_files(unit)[1:] == [unit["secret_files"][0]["path"],
                                         unit["files"][1]["path"]]


def test_a_refused_command_names_the_variable_behind_the_option(tmp_path):
    r = view(tmp_path)
    message = rn.refusal(r, "SGLang rejected the rendered arguments: argument --policy: "
                            "invalid choice: 'x' (choose from 'random', 'round_robin')")
    python_dir = str(tmp_path / "router" / "venv" / "bin")
    assert message == (
        "sglang_router_policy: sglang-router 0.3.2 on this host refused the rendered command: "
        "argument --policy: invalid choice: 'x' (choose from 'random', 'round_robin'). Fix: "
        f"correct sglang_router_policy (`{python_dir}/sglang-router launch --help` lists what "
        "this release takes), or pin the release whose options you use with "
        "sglang_router_version")
    assert rn.flag_variable("unrecognized arguments: --foo", r["flag_variables"]) == \
        "sglang_router_extra_args"


def test_an_existing_environment_without_its_python_is_refused(tmp_path):
    r = view(tmp_path, sglang_router_install_mode="existing",
             sglang_router_python=str(tmp_path / "nowhere" / "python3"))
    try:
        rn.refuse_missing_python(r["install"], r["version"])
    except rn.RouterRefused as exc:
        assert str(exc).startswith(f"sglang_router_python={tmp_path}/nowhere/python3 does not "
                                   "exist on the router host. Fix:")
    else:
        raise AssertionError("a missing Python was not refused")
    assert not rn.install_needed(r["install"]), "an existing environment is never installed"


def test_the_parsers_fingerprint_is_read_by_the_routers_own_python(tmp_path):
    """A virtualenv's python resolves to the interpreter it was made from, but sees its own
    packages: a change of the router installed there changes the record, so the installed
    router parses the command again."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "fakerouter").mkdir()
    (site / "fakerouter" / "__init__.py").write_text("")
    launch = site / "fakerouter" / "launch.py"
    launch.write_text("def parse(args):\n    return args\n")
    first = args_record(python, "fakerouter.launch:parse", ["--port", "1"])
    assert first == args_record(python, "fakerouter.launch:parse", ["--port", "1"])
    launch.write_text("def parse(args):\n    return list(args)  # a new release\n")
    assert args_record(python, "fakerouter.launch:parse", ["--port", "1"]) != first


def test_a_command_the_installed_router_refuses_writes_nothing(tmp_path):
    """The installed router's own parser reads the command before any file is written; its
    refusal names the variable behind the option."""
    venv = tmp_path / "router-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    package = next(venv.glob("lib/python*/site-packages")) / "sglang_router"
    package.mkdir()
    (package / "__init__.py").write_text("")
    # A stand-in release whose parser knows fewer policies than the catalogue.
    (package / "launch_router.py").write_text(
        "import argparse\n"
        "def parse_router_args(args):\n"
        "    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--policy', choices=['random'])\n"
        "    return p.parse_known_args(args)[0]\n")
    r = view(tmp_path, sglang_router_install_mode="existing",
             sglang_router_python=str(venv / "bin" / "python"))
    try:
        rn.converge({"router": r, "after_install": False, "wait_timeout": 1}, False, print)
    except rn.RouterRefused as exc:
        assert str(exc).startswith(
            "sglang_router_policy: sglang-router 0.3.2 on this host refused the rendered "
            "command: -c: error: argument --policy: invalid choice: 'cache_aware' (choose "
            "from 'random'). Fix: correct sglang_router_policy"), str(exc)
    else:
        raise AssertionError("the refused command was not refused")
    assert not (tmp_path / "router").exists(), "nothing is written before the parse"


def keyed_view(tmp_path: Path, api_key: str, keys: list, **settings) -> dict:
    """The router as its host is given it with these keys (what the inventory resolved)."""
    settings = {"sglang_router_root": str(tmp_path / "router"),
                "sglang_router_host": "127.0.0.1", "sglang_router_service_manager": "supervisor",
                "sglang_router_api_key": api_key,
                "sglang_router_control_plane_api_keys": keys, **settings}
    built = build_router_spec(settings, "r1", "10.0.0.5")
    assert built["ok"], built["errors"]
    values = {"sglang_router_api_key": api_key, "sglang_router_control_plane_api_keys": keys}
    return router_node(built["spec"], router_secrets(values))


def test_a_key_the_router_last_started_with_that_resolves_to_nothing_is_refused(tmp_path):
    """The record a start keeps (names and fingerprints, never the keys) is what a later start
    is held to: a key that vanished is refused before anything changes, naming the variable
    and the setting that drops it on purpose; more keys, or a key dropped on purpose, pass."""
    first = keyed_view(tmp_path, API_KEY, KEYS)
    record = rn.started_record(first)
    assert record["secret_env_names"] == ["SGLANG_ROUTER_API_KEY",
                                          "SGLANG_ROUTER_CONTROL_PLANE_KEY_0"]
    assert API_KEY not in repr(record) and ADMIN_KEY not in repr(record)
    Path(first["running_spec_file"]).parent.mkdir(parents=True)
    Path(first["running_spec_file"]).write_text(json.dumps(record))
    rn.refuse_vanished_secret(keyed_view(tmp_path, API_KEY, KEYS))  # the same keys

    no_key = keyed_view(tmp_path, "", KEYS)
    with pytest.raises(rn.RouterRefused) as refused:
        rn.converge({"router": no_key, "after_install": True, "wait_timeout": 1}, False,
                    lambda _line: None)
    text = str(refused.value)
    assert text.startswith("sglang_router_api_key resolves to nothing, but the router last "
                           f"started with it (config {first['config_hash']}, sha256:")
    assert "would restart the router without it" in text
    assert text.endswith("sglang_router_drop_secrets: [sglang_router_api_key]")
    assert API_KEY not in text
    assert not (tmp_path / "router" / "conf").exists(), "refused before anything is written"

    with pytest.raises(rn.RouterRefused, match="^sglang_router_control_plane_api_keys "
                                               "resolves to nothing, but the router"):
        rn.refuse_vanished_secret(keyed_view(tmp_path, API_KEY, []))
    # Another admin key, or more of them, is not a key that vanished.
    more = [*KEYS, {"id": "ops", "name": "ops", "role": "user", "key": "cp-" + "7e" * 12}]
    rn.refuse_vanished_secret(keyed_view(tmp_path, API_KEY, more[1:]))
    rn.refuse_vanished_secret(keyed_view(tmp_path, API_KEY, more))
    # Dropped on purpose.
    rn.refuse_vanished_secret(keyed_view(
        tmp_path, "", [], sglang_router_drop_secrets=["sglang_router_api_key",
                                                      "sglang_router_control_plane_api_keys"]))


def test_only_secret_settings_can_be_dropped():
    built = build_router_spec({"sglang_router_drop_secrets": ["sglang_router_port"]}, "r1")
    assert not built["ok"]
    assert ("sglang_router_drop_secrets='sglang_router_port': is not a secret setting. Fix: name "
            "one of: sglang_router_api_key, sglang_router_control_plane_api_keys"
            in "\n".join(built["errors"]))


class _Router(http.server.BaseHTTPRequestHandler):
    """A router on loopback: its /workers, and /v1/chat/completions counted."""

    workers: list = []
    chats: list = []

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        self._send(200, {"workers": self.workers})

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).chats.append(self.headers.get("Authorization"))
        self._send(200, {"choices": [{"message": {"content": "hi there"}}],
                         "usage": {"completion_tokens": 2}})

    def log_message(self, *args):
        pass


@pytest.fixture
def router_http():
    _Router.chats = []
    with loopback_http_server(_Router) as url:
        yield url


def test_a_router_running_unchanged_answers_the_reports_request_in_its_check(tmp_path,
                                                                              router_http):
    r = dict(view(tmp_path), admin_url=router_http, url="http://10.0.0.5:30080",
             api_key=API_KEY)
    _Router.workers = [{"url": "http://10.0.0.11:30000/", "is_healthy": True},
                       {"url": "http://10.0.0.12:30000", "is_healthy": False}]
    result = {}
    rn._visit("r1", r, result)
    assert result["workers"] == [{"url": "http://10.0.0.11:30000", "healthy": True},
                                 {"url": "http://10.0.0.12:30000", "healthy": False}]
    assert result["report"] == (
        'r1: serving at http://10.0.0.5:30080 (sglang-router 0.3.2, policy cache_aware): 2 '
        'workers registered, 1 healthy; one request answered through it: 2 tokens, "hi there"')
    assert _Router.chats == [f"Bearer {API_KEY}"]


def test_a_router_without_a_healthy_worker_is_not_asked_a_request(tmp_path, router_http):
    r = dict(view(tmp_path), admin_url=router_http, api_key=API_KEY)
    _Router.workers = [{"url": "http://10.0.0.11:30000", "is_healthy": False}]
    result = {}
    rn._visit("r1", r, result)
    assert result["workers"] == [{"url": "http://10.0.0.11:30000", "healthy": False}]
    assert "report" not in result and _Router.chats == []
