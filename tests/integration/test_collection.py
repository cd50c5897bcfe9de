"""The collection as a user installs it: built with ansible-galaxy, installed into a clean
collections path, then used from a project outside the repository by full names only
(import_playbook: sglang.fleet.deploy, ansible-doc sglang.fleet.<module>, the sglang-fleet CLI
on top of it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env, make_fleet

pytestmark = pytest.mark.integration

MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
PLAYBOOKS = ("deploy", "stop", "health", "recover", "benchmark")


def galaxy(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """ansible-galaxy as outside the checkout: no ansible.cfg of the repository's."""
    env = {k: v for k, v in ansible_env().items() if k != "ANSIBLE_CONFIG"}
    return subprocess.run([str(BIN / "ansible-galaxy"), "collection", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A user's project: its own ansible.cfg naming a collections path that holds only the
    collection installed from the built tarball."""
    tmp = tmp_path_factory.mktemp("collection")
    built = galaxy("build", str(REPO), "--output-path", str(tmp), cwd=tmp)
    assert built.returncode == 0, built.stderr
    tarball = next(tmp.glob("sglang-fleet-*.tar.gz"))
    installed = galaxy("install", str(tarball), "-p", str(tmp / "collections"), cwd=tmp)
    assert installed.returncode == 0, installed.stderr
    project = tmp / "project"
    project.mkdir()
    (project / "ansible.cfg").write_text(
        "[defaults]\n"
        f"collections_path = {tmp / 'collections'}\n"
        "stdout_callback = sglang.fleet.sglang_fleet\n"
        "callback_result_format = yaml\n")
    for name in PLAYBOOKS:
        (project / f"{name}.yml").write_text(
            f"---\n- name: The collection's {name}\n"
            f"  ansible.builtin.import_playbook: sglang.fleet.{name}\n")
    (project / "own-roles.yml").write_text(
        "---\n- name: The collection's roles from a play of the user's own\n"
        "  hosts: sglang_servers\n  gather_facts: false\n  roles:\n"
        "    - sglang.fleet.sglang_server\n")
    return project


def project_env(project: Path) -> dict[str, str]:
    env = ansible_env()
    env["ANSIBLE_CONFIG"] = str(project / "ansible.cfg")
    env["SGLANG_FLEET_PROJECT"] = str(project)
    return env


def run_in(project: Path, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=project, env=project_env(project), capture_output=True,
                          text=True, timeout=600)


def test_the_installed_collection_holds_the_plugins_and_no_repository_files(installed):
    root = installed.parent / "collections" / "ansible_collections" / "sglang" / "fleet"
    assert sorted(p.stem for p in (root / "plugins" / "modules").glob("*.py")) == MODULES
    for part in ("meta/runtime.yml", "requirements.txt", "bindep.txt",
                 "roles/sglang_server/meta/argument_specs.yml", "plugins/callback/sglang_fleet.py",
                 "tests/sanity/ignore-2.19.txt"):
        assert (root / part).is_file(), part
    for kept_out in ("src", "tests/unit", ".venv", ".collections", "ansible.cfg", "bench"):
        assert not (root / kept_out).exists(), kept_out


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders_each_module_by_its_full_name(installed, module):
    proc = run_in(installed, str(BIN / "ansible-doc"), f"sglang.fleet.{module}")
    assert proc.returncode == 0, proc.stderr
    assert str(installed.parent / "collections") in proc.stdout
    assert "EXAMPLES" in proc.stdout and "RETURN VALUES" in proc.stdout


def test_every_playbook_and_role_resolves_by_its_full_name(installed):
    fleet = make_fleet(installed.parent / "syntax", hosts=1)
    for name in [*PLAYBOOKS, "own-roles"]:
        proc = run_in(installed, str(BIN / "ansible-playbook"), "-i", str(fleet.inventory),
                      f"{name}.yml", "--syntax-check")
        assert proc.returncode == 0, (name, proc.stdout[-2000:] + proc.stderr[-2000:])


def test_a_project_outside_the_repository_deploys_reruns_and_stops(installed):
    fleet = make_fleet(installed.parent / "fleet", hosts=2)
    extra = ["-e", json.dumps(fleet.extra)]
    try:
        first = run_in(installed, str(BIN / "ansible-playbook"), "-i", str(fleet.inventory),
                       "deploy.yml", *extra)
        out = first.stdout + first.stderr
        assert first.returncode == 0, out[-3000:]
        for host in fleet.hosts:
            # The collection's callback by its full name: the same NODE/GATE lines.
            assert f"NODE [{host}]: " in out and f"GATE [{host}]: " in out, out[-3000:]
            assert f"{host}: ready at {fleet.url(host)}" in out
        again = run_in(installed, str(BIN / "ansible-playbook"), "-i", str(fleet.inventory),
                       "deploy.yml", *extra)
        assert again.returncode == 0, again.stdout[-3000:]
        assert "changed=0" in again.stdout and "changed=1" not in again.stdout, again.stdout
        # The sglang-fleet CLI on top of the installed collection (no checkout named).
        runs = installed.parent / "runs"
        check = run_in(installed, str(BIN / "sglang-fleet"), "health", "-i",
                       str(fleet.inventory), "--run-dir", str(runs), *extra)
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
        assert all(host in check.stdout for host in fleet.hosts), check.stdout
        ran = [json.loads(p.read_text()) for p in runs.rglob("artifacts/*/command")]
        assert ran and all(str(installed.parent / "collections") in " ".join(r["command"])
                           for r in ran), ran
        stopped = run_in(installed, str(BIN / "ansible-playbook"), "-i", str(fleet.inventory),
                         "stop.yml", *extra)
        assert stopped.returncode == 0, stopped.stdout[-3000:]
        assert all(not fleet.server_processes(host) for host in fleet.hosts)
    finally:
        fleet.kill_leftovers()


# ansible-test's sanity tests that run from the controller's own Python. The others (import,
# pep8, pylint, runtime-metadata, validate-modules, yamllint, ansible-doc) each build a
# virtualenv and fetch pip's bootstrap script from ci-files.testing.ansible.com, which these
# machines cannot reach: ansible-doc is run above for every module, ruff and ansible-lint
# (production profile) cover the Python and YAML in tests/integration/test_quality_gates.py.
OFFLINE_SANITY = ("action-plugin-docs", "changelog", "compile", "empty-init", "ignores",
                  "line-endings", "no-assert", "no-get-exception", "no-illegal-filenames",
                  "no-smart-quotes", "replace-urlopen", "shebang", "symlinks",
                  "use-argspec-type-path", "use-compat-six")


def test_ansible_test_sanity_passes_where_it_runs_offline(installed):
    root = installed.parent / "collections" / "ansible_collections" / "sglang" / "fleet"
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    tests = [arg for name in OFFLINE_SANITY for arg in ("--test", name)]
    proc = subprocess.run([str(BIN / "ansible-test"), "sanity", "--local", "--python", python,
                           "--color", "no", *tests], cwd=root, env=project_env(installed),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = set(re.findall(r'Running sanity test "([^"]+)"', proc.stdout + proc.stderr))
    assert ran == set(OFFLINE_SANITY), ran
