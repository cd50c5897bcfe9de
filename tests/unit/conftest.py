"""Helpers the unit tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def check_registry():
    """Every check that reads the list of secrets (tests/unit/test_secrets.py runs it on the
    shipped tables, test_setting_rows.py on tables with a new secret row)."""
    return _check_registry


def _check_registry(tables, registry) -> None:
    """Every check that reads the list of secrets, for `tables` and the node copy generated
    from them (`registry`): each secret setting's variable, short name, env file variable and
    option is a secret everywhere, and the records naming the list are not."""
    for table in tables:
        for s in table:
            if s.secret:
                assert registry.is_secret_name(s.variable) and registry.is_secret_name(s.name)
                if s.flag:
                    assert s.flag in registry.SECRET_FLAGS
                    assert registry.mask_argv([s.flag, "v4lue"]) == [s.flag, registry.MASK]
                numbered = s.env.replace("*", "0")
                assert registry.is_secret_name(numbered), numbered
                assert registry.mask_secrets({s.variable: "v4lue", numbered: "v4lue"}) == {
                    s.variable: registry.MASK, numbered: registry.MASK}
    assert not registry.is_secret_name("secret_env_names")
    assert not registry.is_secret_name("tokenizer_path")
