"""The collection and the sglang_fleet package its controller-side plugins import are one
release: the package's version has one source (pyproject.toml, as installed), and a plugin
meeting another release's package refuses to run, naming both versions and the fix."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleError

import sglang_fleet

REPO = Path(__file__).resolve().parents[2]


def _plugin_utils():
    path = REPO / "plugins" / "plugin_utils" / "package_version.py"
    spec = importlib.util.spec_from_file_location("package_version", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _plugin_utils()


def _collection(root: Path, galaxy: str | None = None, manifest: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if galaxy is not None:
        (root / "galaxy.yml").write_text(yaml.safe_dump({"namespace": "sglang", "name": "fleet",
                                                         "version": galaxy}))
    if manifest is not None:
        (root / "MANIFEST.json").write_text(json.dumps({"collection_info": {
            "namespace": "sglang", "name": "fleet", "version": manifest}}))
    return root


def test_the_package_collection_and_pyproject_are_one_version():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert sglang_fleet.__version__ == pyproject
    assert check.collection_version(str(REPO)) == pyproject
    assert check.package_mismatch(str(REPO)) is None
    check.require_matching_package(str(REPO))  # no error


def test_an_installed_collection_is_read_from_its_manifest(tmp_path):
    root = _collection(tmp_path / "fleet", galaxy="1.0.0", manifest="2.3.4")
    assert check.collection_version(str(root)) == "2.3.4"
    assert check.collection_version(str(_collection(tmp_path / "clone", galaxy="1.2.0"))) == \
        "1.2.0"


def test_another_release_of_the_package_is_refused_with_both_versions_and_the_fix(tmp_path):
    root = _collection(tmp_path / "fleet", manifest="9.8.7")
    message = check.package_mismatch(str(root))
    assert "collection sglang.fleet is version 9.8.7" in message
    assert f"sglang-fleet that its plugins import is version {sglang_fleet.__version__}" in message
    assert "Fix: pip install 'sglang-fleet==9.8.7'" in message
    with pytest.raises(AnsibleError, match="9.8.7"):
        check.require_matching_package(str(root))


@pytest.mark.parametrize("plugin", sorted(
    str(path.relative_to(REPO / "plugins")) for kind in ("action", "filter", "callback")
    for path in (REPO / "plugins" / kind).glob("*.py") if "from sglang_fleet." in path.read_text()))
def test_every_plugin_that_imports_the_package_checks_its_version_first(plugin):
    text = (REPO / "plugins" / plugin).read_text()
    assert "plugin_utils.package_version import" in text
    check_at = min(text.index(call) for call in ("require_matching_package()",
                                                 "version_error()") if call in text)
    assert check_at < text.index("from sglang_fleet."), plugin
