"""The execution environment as ansible-builder reads it: the build context it writes from
execution-environment.yml holds the collection's tarball and the controller package's wheel,
and its own introspection finds what the collection needs (requirements.txt, bindep.txt).
Building the image needs podman or docker, which these machines lack: the test stops at the
context, which is everything ansible-builder hands to the container build."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from sglang_fleet.testfleet.local import BIN, REPO, ansible_env

pytestmark = pytest.mark.integration


def run(*cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    # Outside the checkout's ansible.cfg, as a build host runs it.
    env = {k: v for k, v in ansible_env().items() if k != "ANSIBLE_CONFIG"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def versions() -> tuple[str, str]:
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    collection = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    return python, collection


def test_the_execution_environment_names_the_versions_the_project_builds():
    python, collection = versions()
    assert python == collection
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert ee["version"] == 3
    deps = ee["dependencies"]
    assert deps["galaxy"]["collections"] == [
        {"name": f"dist/sglang-fleet-{collection}.tar.gz", "type": "file"}]
    assert deps["python"] == [
        f"sglang-fleet @ file:///build/dist/sglang_fleet-{python}-py3-none-any.whl"]


def test_ansible_builder_writes_a_context_that_installs_the_collection_and_its_package(
        tmp_path):
    python, collection = versions()
    dist = tmp_path / "dist"
    wheel = run(str(BIN / "python"), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist),
                str(REPO), cwd=tmp_path)
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    built = run(str(BIN / "ansible-galaxy"), "collection", "build", str(REPO),
                "--output-path", str(dist), cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    shutil.copy(REPO / "execution-environment.yml", tmp_path)
    created = run(str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml",
                  "-c", "context", cwd=tmp_path)
    assert created.returncode == 0, created.stdout + created.stderr
    build = tmp_path / "context" / "_build"
    assert sorted(p.name for p in (build / "dist").iterdir()) == [
        f"sglang-fleet-{collection}.tar.gz", f"sglang_fleet-{python}-py3-none-any.whl"]
    containerfile = (tmp_path / "context" / "Dockerfile").read_text()
    # The wheel reaches the stage that assembles the Python requirements.
    assert containerfile.index("COPY _build/dist /build/dist") < \
        containerfile.index("introspect.py introspect")
    # ansible-builder's own introspection, over the collection installed from the tarball.
    collections = tmp_path / "collections"
    installed = run(str(BIN / "ansible-galaxy"), "collection", "install", "--force",
                    str(dist / f"sglang-fleet-{collection}.tar.gz"), "-p", str(collections),
                    cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    found = run(str(BIN / "python"), str(build / "scripts" / "introspect.py"), "introspect",
                str(collections), cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    needs = yaml.safe_load(found.stdout)
    assert any(line.startswith("sglang-fleet>=") for line in needs["python"]), needs
    assert any(line.startswith("openssh-client ") for line in needs["system"]), needs
