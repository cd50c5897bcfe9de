"""Every role's meta/argument_specs.yml mirrors its defaults, option for option; what the
roles' tasks share is said in one place."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sglang_fleet.testfleet.local import REPO

ROLES = sorted(p for p in (REPO / "roles").iterdir() if (p / "defaults" / "main.yml").exists())


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_mirror_defaults(role: Path):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    for name, value in defaults.items():
        assert options[name].get("default") == value, name
        assert name.startswith(role.name + "_"), f"{name} lacks the role prefix"
        assert options[name].get("description"), name


def test_the_servers_secret_values_are_fetched_in_one_place():
    """The env file's values: one role variable, used by every task that renders the file."""
    fetching = sorted(str(p.relative_to(REPO)) for p in (REPO / "roles").rglob("*.yml")
                      if "secret_variables" in p.read_text())
    assert fetching == ["roles/sglang_server/vars/main.yml"]
    users = sorted(p.name for p in (REPO / "roles" / "sglang_server" / "tasks").glob("*.yml")
                   if "sglang_server__secret_values" in p.read_text())
    assert users == ["configure.yml", "preflight.yml"]
