"""Adding a setting is adding one row to its role's table: the new variable is then validated,
coerced, refused with its variable, value and fix, caught when misspelled, rendered, owned
against extra_args, and (a secret) kept out of every record and masked by the secret registry
generated from the tables. Both roles' tables are rows of one Setting type, coerced by one set
of coercers."""

from __future__ import annotations

import types
from functools import partial

import pytest

from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.node.common import secrets as shipped_registry
from sglang_fleet.recovery import decisions as recovery
from sglang_fleet.router.spec import build_router_spec, router_secrets
from sglang_fleet.settings import router as router_settings
from sglang_fleet.settings import secrets
from sglang_fleet.settings import server as settings
from sglang_fleet.settings.kinds import Setting
from sglang_fleet.testfleet.local import role_defaults

S = partial(Setting, prefix=settings.PREFIX)
R = partial(Setting, prefix=router_settings.PREFIX)

MAX_RUNNING = S("max_running_requests", "int", None, "--max-running-requests.",
                "Server options", low=1, high=100_000, nullable=True,
                flag="--max-running-requests", render="value")
SIGNING_SEED = S("signing_seed", "str", "", "A secret of the server's (kept in the 0600 env "
                 "file only).", "Server options", secret=True, env="SGLANG_FLEET_SIGNING_SEED")
MAX_CONCURRENT = R("max_concurrent_requests", "int", -1, "Requests in flight at once.",
                   "Routing", low=-1, high=1_000_000, flag="--max-concurrent-requests",
                   render="value")
ORACLE_PASSWORD = R("oracle_password", "str", "", "Password of the router's history store.",
                    "Secrets", flag="--oracle-password", secret=True, render="secret",
                    env="SGLANG_ROUTER_ORACLE_PASSWORD")
SEED = "s33d-0123456789abcdef"


@pytest.fixture
def server_rows(monkeypatch):
    monkeypatch.setattr(settings, "TABLE", settings.TABLE.with_rows(MAX_RUNNING, SIGNING_SEED))


@pytest.fixture
def router_rows(monkeypatch):
    monkeypatch.setattr(router_settings, "TABLE",
                        router_settings.TABLE.with_rows(MAX_CONCURRENT, ORACLE_PASSWORD))


def server(**given):
    values = dict(role_defaults(), sglang_server_attention_backend="triton")
    values.update({settings.PREFIX + k: v for k, v in given.items()})
    return build_launch_spec(values, "n1")


def router(**given):
    values = {"sglang_router_allow_unauthenticated": True}
    values.update({router_settings.PREFIX + k: v for k, v in given.items()})
    return build_router_spec(values, "r1", "10.0.0.5")


def errors(result):
    assert not result["ok"], "expected a refusal"
    return "\n".join(result["errors"])


def test_a_server_row_is_validated_coerced_rendered_and_owned(server_rows):
    built = server(max_running_requests="64")  # `-e name=64` arrives as text
    assert built["ok"], built["errors"]
    argv = built["spec"]["argv"]
    assert argv[argv.index("--max-running-requests") + 1] == "64"
    assert "--max-running-requests" not in server()["spec"]["argv"]  # null: SGLang's default
    assert "host n1: sglang_server_max_running_requests='lots': must be an integer. Fix: set " \
        "an integer in 1..100000; or null for the default" in errors(
            server(max_running_requests="lots"))
    assert "sglang_server_max_running_requests=0: is out of range 1..100000" in errors(
        server(max_running_requests=0))
    assert "sglang_server_max_runing_requests=64: is not a setting of the sglang_server role. " \
        "Fix: did you mean sglang_server_max_running_requests?" in errors(
            server(max_runing_requests=64))
    assert "set sglang_server_max_running_requests instead" in errors(
        server(extra_args=["--max-running-requests", "8"]))


def test_without_its_row_the_variable_is_unknown():
    assert "sglang_server_max_running_requests=64: is not a setting of the sglang_server role" \
        in errors(server(max_running_requests=64))
    assert "sglang_router_max_concurrent_requests=64: is not a setting of the sglang_router " \
        "role" in errors(router(max_concurrent_requests=64))


def test_a_server_secret_row_is_kept_out_of_every_record(server_rows):
    spec = server(signing_seed=SEED)["spec"]
    assert SEED not in repr(spec)
    assert "SGLANG_FLEET_SIGNING_SEED" in spec["secret_env_names"]
    assert ["SGLANG_FLEET_SIGNING_SEED", "sglang_server_signing_seed"] in spec["secret_variables"]
    assert spec["secret_fingerprints"]["SGLANG_FLEET_SIGNING_SEED"].startswith("sha256:")
    assert "sglang_server_signing_seed" not in spec["settings"]
    assert server(drop_secrets=["sglang_server_signing_seed"])["ok"]
    # Refused without the value; misspelled, the value is hidden too.
    text = errors(server(signing_seed=["not", "text"]))
    assert "sglang_server_signing_seed=<secret>: must be a string, got list" in text
    assert "'not'" not in text
    text = errors(server(signing_sed=SEED))
    assert "sglang_server_signing_sed=<hidden>: is not a setting of the sglang_server role. " \
        "Fix: did you mean sglang_server_signing_seed?" in text and SEED not in text
    # Never a way in through the overrides.
    assert "carries the secret sglang_server_signing_seed" in errors(
        server(overrides={"sglang_server_signing_seed": SEED}))


def test_a_router_row_is_validated_coerced_rendered_and_owned(router_rows):
    built = router(max_concurrent_requests="64")
    assert built["ok"], built["errors"]
    args = built["spec"]["router_args"]
    assert args[args.index("--max-concurrent-requests") + 1] == "64"
    assert "host r1: sglang_router_max_concurrent_requests='lots': must be an integer. Fix: " \
        "set an integer in -1..1000000, e.g. -1" in errors(router(max_concurrent_requests="lots"))
    assert "did you mean sglang_router_max_concurrent_requests?" in errors(
        router(max_concurent_requests=64))
    assert "set sglang_router_max_concurrent_requests instead" in errors(
        router(extra_args=["--max-concurrent-requests", "8"]))


def test_a_router_secret_row_is_rendered_from_the_env_file_only(router_rows):
    spec = router(oracle_password="pw-0123456789abcdef")["spec"]
    assert "pw-0123456789abcdef" not in repr(spec)
    argv = spec["argv"]
    assert argv[argv.index("--oracle-password") + 1] == {"env": "SGLANG_ROUTER_ORACLE_PASSWORD"}
    assert spec["router_args"][spec["router_args"].index("--oracle-password") + 1] == "********"
    assert "SGLANG_ROUTER_ORACLE_PASSWORD" in spec["secret_env_names"]
    assert "SGLANG_ROUTER_ORACLE_PASSWORD" in spec["secret_fingerprints"]
    text = errors(router(oracle_password=12345))
    assert "sglang_router_oracle_password=<secret>: must be a string" in text
    assert "12345" not in text
    # Its value reaches the router's 0600 env file with no other change.
    env = router_secrets({"sglang_router_oracle_password": "pw-0123456789abcdef"})
    assert env == {"SGLANG_ROUTER_ORACLE_PASSWORD": "pw-0123456789abcdef"}


def test_a_secret_row_is_the_row_and_the_generator(server_rows, router_rows, tmp_path,
                                                  check_registry):
    """Adding a secret row to either table, then running the generator (`python -m
    sglang_fleet.settings --write`), in a copy of the files it writes: every check
    that reads the list of secrets passes with no other edit, the node copy masks the new
    names and docs/validation.md's table lists them. No list of secrets is kept anywhere
    else."""
    for part in secrets.GENERATED:
        copy = tmp_path / part.path.relative_to(secrets.REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(part.path.read_text())
    new_names = ("sglang_server_signing_seed", "SGLANG_FLEET_SIGNING_SEED",
                 "sglang_router_oracle_password")
    # The name-based guess alone does not know these: only the rows make them secrets.
    assert not any(shipped_registry.is_secret_name(n) for n in new_names[:2])
    assert secrets.sync(write=False, folder=tmp_path), "the new rows make the copies stale"
    secrets.sync(write=True, folder=tmp_path)
    assert secrets.sync(write=False, folder=tmp_path) == []
    registry = types.ModuleType("registry_with_the_new_rows")
    node_copy = tmp_path / secrets.NODE_COPY.relative_to(secrets.REPO)
    exec(compile(node_copy.read_text(), str(node_copy), "exec"), registry.__dict__)
    check_registry((settings.TABLE, router_settings.TABLE), registry)
    for name in new_names:
        assert registry.is_secret_name(name), name
    record = {"extra_vars": {"sglang_server_signing_seed": SEED},
              "env": {"SGLANG_FLEET_SIGNING_SEED": SEED}}
    assert SEED not in repr(registry.mask_secrets(record))
    assert registry.mask_argv(["--oracle-password", "pw"]) == ["--oracle-password", "********"]
    doc = (tmp_path / secrets.DOC.relative_to(secrets.REPO)).read_text()
    assert "| `sglang_server_signing_seed` | `SGLANG_FLEET_SIGNING_SEED` | - (the environment) |" \
        in doc
    assert "| `sglang_router_oracle_password` | `SGLANG_ROUTER_ORACLE_PASSWORD` | " \
        "`--oracle-password` |" in doc
    # The repository's own files are untouched: they still match the shipped tables.
    assert SEED in repr(shipped_registry.mask_secrets({"sglang_server_signing_seed": SEED}))
    assert "signing_seed" not in secrets.DOC.read_text()


def test_both_tables_are_rows_of_one_setting_type():
    for table in (settings.TABLE, router_settings.TABLE):
        for s in table:
            assert type(s) is Setting and s.variable == table.prefix + s.name
            if s.kind in ("int", "float"):
                assert s.low is not None and s.high is not None, s.variable


def test_what_is_no_configuration_is_a_column():
    marked = tuple(s.variable for s in settings.TABLE if not s.configuration)
    assert marked == recovery.NOT_CONFIGURATION
    assert "sglang_server_port" in recovery.NOT_CONFIGURATION
    assert "sglang_server_attention_backend" not in recovery.NOT_CONFIGURATION
    assert recovery.differing({"sglang_server_port": 1, "sglang_server_tp": 4},
                              {"sglang_server_port": 2, "sglang_server_tp": 8}) == [
        "sglang_server_tp"]


@pytest.mark.parametrize("given, facts", [
    ({"gpu_compute_capability": 12, "disable_custom_all_reduce": True},
     {"compute_capability": "12.0", "custom_all_reduce": False}),
    ({"gpu_compute_capability": "9.0", "attention_backend": "triton"},
     {"compute_capability": "9.0", "attention_backend": "triton", "custom_all_reduce": True}),
])
def test_rule_facts_come_from_the_fact_column(given, facts):
    values = {s.name: s.default for s in settings.TABLE} | given
    derived = settings.rule_facts(values)
    assert set(derived) == {s.fact for s in settings.TABLE if s.fact}
    assert derived.items() >= facts.items()
    assert derived["sglang_version"] == values["version"]
