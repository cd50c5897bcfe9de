"""One registry of secrets, derived from the server's and the router's settings tables: the
node-side copy is generated from it, and every secret setting is masked wherever records go."""

from __future__ import annotations

from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.node.common import secrets as node
from sglang_fleet.settings import router as router_settings
from sglang_fleet.settings import secrets
from sglang_fleet.settings import server as settings
from sglang_fleet.testfleet.local import role_defaults


def test_the_node_copy_and_the_docs_table_are_generated_from_the_settings_tables():
    assert secrets.main([]) == 0, "python -m sglang_fleet.settings --write"


def test_one_command_checks_every_generated_file():
    from sglang_fleet.settings.__main__ import main
    assert main([]) == 0, "python -m sglang_fleet.settings --write"


def test_every_secret_setting_of_both_tables_is_a_secret_name_everywhere(check_registry):
    check_registry((settings.TABLE, router_settings.TABLE), node)


def test_the_controller_refuses_in_extra_env_what_the_node_masks():
    """One rule on both sides: a name the node would mask as a secret is refused in
    sglang_server_extra_env (it is written into facts, ledgers and reports), and a name it
    shows is taken, SGLang's own switches included."""
    for name, secret in (("SGLANG_DB_CREDENTIAL", True), ("MY_SERVICE_TOKEN", True),
                         ("SGLANG_ROUTER_API_KEY", True), ("SGLANG_LOG_DECODE_GRAPH_KEY", False),
                         ("SGLANG_INIT_NEW_TOKEN_RATIO", False), ("SGLANG_ENABLE_JIT_DEEPGEMM",
                                                                  False)):
        values = dict(role_defaults(), sglang_server_attention_backend="triton",
                      sglang_server_extra_env={name: "1"})
        built = build_launch_spec(values, "n1")
        assert node.is_secret_name(name) is secret, name
        assert built["ok"] is not secret, (name, built["errors"])
        if secret:
            assert f"{name} looks like a secret" in "\n".join(built["errors"])
        else:
            assert built["spec"]["env"][name] == "1"


def test_the_routers_control_plane_keys_are_masked_nested_and_whole():
    record = {"extra_vars": {"sglang_router_control_plane_api_keys": [
        {"id": "fleet", "name": "n", "role": "admin", "key": "cp-0123456789abcdef"}]}}
    assert "cp-0123456789abcdef" not in repr(node.mask_secrets(record))


def test_a_secret_option_is_masked_on_any_command_line():
    argv = ["python", "--ssl-keyfile-password", "hunter2hunter2", "--watermark-config={}",
            "--admin-api-key=adm1n-0123456789", "--port", "1"]
    assert node.mask_argv(argv) == ["python", "--ssl-keyfile-password", "********",
                                    "--watermark-config=********",
                                    "--admin-api-key=********", "--port", "1"]


def test_a_secret_option_reaches_the_server_only_from_its_config_file():
    values = dict(role_defaults(), sglang_server_attention_backend="triton",
                  sglang_server_ssl_keyfile_password="pw-0123456789abcdef")
    spec = build_launch_spec(values, "n1")["spec"]
    argv = spec["argv"]
    assert "--ssl-keyfile-password" not in argv
    assert argv[-2:] == ["--config", spec["paths"]["config_file"]]
    assert spec["config_options"] == [["--ssl-keyfile-password",
                                       "SGLANG_FLEET_SSL_KEYFILE_PASSWORD"]]
    assert "pw-0123456789abcdef" not in repr(spec)
    assert spec["secret_env_names"] == ["SGLANG_FLEET_SSL_KEYFILE_PASSWORD"]
    assert spec["secret_fingerprints"]["SGLANG_FLEET_SSL_KEYFILE_PASSWORD"].startswith(
        "sha256:")
    # Given through extra_args instead, it is refused: a secret has one way in.
    refused = build_launch_spec(dict(values, sglang_server_ssl_keyfile_password="",
                                     sglang_server_extra_args=["--ssl-keyfile-password", "pw"]),
                                "n1")
    text = "\n".join(refused["errors"])
    assert "set sglang_server_ssl_keyfile_password instead" in text and "'pw'" not in text


def test_a_secret_option_a_release_lacks_is_refused_there():
    values = dict(role_defaults(), sglang_server_attention_backend="triton",
                  sglang_server_version="0.5.4.post3",
                  sglang_server_admin_api_key="adm1n-0123456789abcdef")
    text = "\n".join(build_launch_spec(values, "n1")["errors"])
    assert "sglang_server_admin_api_key=<secret>: SGLang 0.5.4.post3 has no --admin-api-key" \
        in text


def test_a_config_file_of_ones_own_beside_a_secret_option_is_refused():
    """SGLang 0.5.23 takes one --config: the toolkit's carries the secrets."""
    values = dict(role_defaults(), sglang_server_attention_backend="triton",
                  sglang_server_extra_args=["--config", "/etc/mine.yaml"])
    assert build_launch_spec(values, "n1")["ok"], "alone it is the operator's"
    refused = build_launch_spec(dict(values, sglang_server_api_key="sk-0123456789abcdef"), "n1")
    text = "\n".join(refused["errors"])
    assert "--config names a config file" in text and "SGLang takes only one" in text
