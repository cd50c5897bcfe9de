"""ansible-lint's production profile, ansible-doc for every module and role, ruff's limits."""

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


def _function_of_complexity(n: int) -> str:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(n - 1))
    return f"def f(x):\n{branches}    return -1\n"


@pytest.mark.parametrize(("complexity", "flagged"), [(15, False), (16, True)])
def test_a_plain_ruff_run_enforces_complexity_15(complexity, flagged):
    """pyproject.toml's own selection carries the limit: no extra flags, as an editor runs it."""
    proc = subprocess.run([str(BIN / "ruff"), "check", "--stdin-filename", "src/sglang_fleet/x.py",
                           "-"], cwd=REPO, input=_function_of_complexity(complexity),
                          capture_output=True, text=True, timeout=60)
    assert ("C901" in proc.stdout) is flagged, proc.stdout + proc.stderr
    assert proc.returncode == (1 if flagged else 0), proc.stdout + proc.stderr
