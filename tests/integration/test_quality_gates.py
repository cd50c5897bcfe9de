"""ansible-lint's production profile and ansible-doc for every module and role."""

from __future__ import annotations

import re
import subprocess

import pytest

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env

MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta").is_dir())


def run(*cmd):
    return subprocess.run(cmd, cwd=REPO, env=ansible_env(), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders_module(module):
    proc = run(str(BIN / "ansible-doc"), f"sglang.fleet.{module}")
    assert proc.returncode == 0, proc.stderr
    for section in ("OPTIONS", "EXAMPLES", "RETURN VALUES"):
        assert section in proc.stdout, f"{module} lacks {section}"
    assert "check_mode" in proc.stdout


@pytest.mark.parametrize("role", ROLES)
def test_ansible_doc_renders_role_spec(role):
    proc = run(str(BIN / "ansible-doc"), "-t", "role", f"sglang.fleet.{role}")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"ENTRY POINT: \W*main", proc.stdout), proc.stdout[:500]


def test_ansible_lint_production_profile_is_clean():
    proc = run(str(BIN / "ansible-lint"), "--nocolor")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr
