"""The settings table is the one source: the role's files are generated from it, and every flag
it names exists in the releases it can pin."""

from __future__ import annotations

from dataclasses import replace

import yaml

from sglang_fleet.known.catalogue import catalogue, shipped_versions
from sglang_fleet.known.reviewed import releases
from sglang_fleet.launch.spec import build_launch_spec
from sglang_fleet.settings import server as settings
from sglang_fleet.settings.kinds import SettingsTable
from sglang_fleet.testfleet.local import role_defaults


def test_role_files_are_generated_from_the_table():
    for path, text in settings.ROLE_FILES.generated_files().items():
        assert path.read_text() == text, (
            f"{path} drifted from the settings table: "
            "python -m sglang_fleet.settings --write")
    defaults = yaml.safe_load(settings.ROLE_FILES.defaults_yaml())
    assert defaults == {s.variable: s.default for s in settings.SETTINGS}


def test_every_rendered_flag_exists_in_every_release():
    for version in shipped_versions():
        cat = catalogue(version)
        for s in settings.SETTINGS:
            # A secret option rendered only when set may be newer than a release: the
            # LaunchSpec refuses it there (test_spec).
            if s.flag and not (s.render == "secret" and s.default == ""):
                assert s.flag in cat.by_flag, f"{s.variable}: {s.flag} not in SGLang {version}"
        release = releases()[version]
        for flag in [*release.cuda_graph_disable, release.cuda_graph_max_bs_flag]:
            assert flag in cat.by_flag, f"{flag} not in SGLang {version}"
        for flag in ("--nnodes", "--node-rank", "--dist-init-addr"):
            assert flag in cat.by_flag


def test_catalogue_choices_come_from_the_flag():
    for s in settings.SETTINGS:
        if s.catalogue_choices:
            assert catalogue("0.5.23").by_flag[s.flag].choices, s.variable


def test_owned_options_cover_every_alias():
    owners = settings.owners_by_dest(catalogue("0.5.23"))
    assert owners["tp_size"].name == "tp"
    assert owners["nnodes"].name == "group"
    assert owners["cuda_graph_backend_prefill"].name == "cuda_graph"
    assert owners["admin_api_key"].name == "admin_api_key"
    assert owners["ssl_keyfile_password"].name == "ssl_keyfile_password"
    old = settings.owners_by_dest(catalogue("0.5.4.post3"))
    assert old["tensor_parallel_size"].name == "tp"


def test_facts_and_secrets_are_declared_once():
    assert settings.FACT_OF_SETTING["sglang_server_attention_backend"] == "attention_backend"
    # The rows marked secret, in the table's order (a new secret row joins with no edit here).
    assert tuple(s.variable for s in settings.TABLE if s.secret) == settings.SECRET_SETTINGS
    assert {"sglang_server_api_key", "sglang_server_hf_token"} <= set(settings.SECRET_SETTINGS)
    assert settings.SECRET_ENV["sglang_server_hf_token"] == "HF_TOKEN"


def test_how_tp_renders_is_its_rows_columns_not_its_name(monkeypatch):
    """Behaviour is a column: tp renders as every value setting does, so its row's `omit`
    leaves the flag out exactly as it would for dp or pp."""
    values = dict(role_defaults(), sglang_server_attention_backend="triton")
    argv = build_launch_spec(values, "n1")["spec"]["argv"]
    assert argv[argv.index("--tp-size") + 1] == str(values["sglang_server_tp"])
    rows = tuple(replace(s, omit=values["sglang_server_tp"]) if s.name == "tp" else s
                 for s in settings.TABLE)
    monkeypatch.setattr(settings, "TABLE", SettingsTable(settings.PREFIX, rows))
    built = build_launch_spec(values, "n1")
    assert built["ok"], built["errors"]
    assert "--tp-size" not in built["spec"]["argv"]
