"""The evidence bundle's archive, as the controller unpacks it (plugins/action/
sglang_evidence_fetch.py): only plain files and folders under the bundle's own folder, and
the host's evidence private once unpacked. test_recover.py fetches real bundles end to end."""

from __future__ import annotations

import importlib.util
import io
import tarfile
from pathlib import Path

import pytest
from ansible.errors import AnsibleActionFail

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "sglang_evidence_fetch_action", REPO / "plugins" / "action" / "sglang_evidence_fetch.py")
plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin)

BUNDLE = "20261207T014728-Kimi-K2.5-17752"


def archive(tmp_path: Path, add) -> Path:
    path = tmp_path / f"{BUNDLE}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        add(tar)
    return path


def add_file(tar: tarfile.TarFile, name: str, text: str = "{}") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(text)
    tar.addfile(info, io.BytesIO(text.encode()))


def members_of(path: Path) -> list[str]:
    with tarfile.open(path, "r:gz") as tar:
        return [m.name for m in plugin.safe_members(tar, BUNDLE)]


def test_a_bundle_of_files_under_its_folder_is_unpacked(tmp_path):
    def add(tar):
        tar.addfile(_dir(BUNDLE))
        add_file(tar, f"{BUNDLE}/verdict.json")
        add_file(tar, f"{BUNDLE}/py-spy-22147.txt", "Thread 1")
    assert members_of(archive(tmp_path, add)) == [
        BUNDLE, f"{BUNDLE}/verdict.json", f"{BUNDLE}/py-spy-22147.txt"]


def _dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


@pytest.mark.parametrize("name, kind", [
    (f"{BUNDLE}/../../etc/cron.d/x", "file"),
    ("/etc/passwd", "file"),
    ("another-bundle/verdict.json", "file"),
    (f"{BUNDLE}/log_tail.txt", "symlink"),
    (f"{BUNDLE}/gpu", "device"),
])
def test_anything_else_refuses_the_whole_archive_naming_it(tmp_path, name, kind):
    def add(tar):
        add_file(tar, f"{BUNDLE}/verdict.json")
        if kind == "file":
            add_file(tar, name)
        else:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.CHRTYPE
            info.linkname = "/etc/shadow" if kind == "symlink" else ""
            tar.addfile(info)
    with pytest.raises(AnsibleActionFail, match="nothing unpacked") as err:
        members_of(archive(tmp_path, add))
    assert repr(name) in str(err.value)


def test_the_hosts_evidence_is_private_once_unpacked(tmp_path):
    bundle = tmp_path / "sim-node-1" / BUNDLE
    bundle.mkdir(parents=True)
    (bundle / "verdict.json").write_text("{}")
    (bundle / "verdict.json").chmod(0o644)
    bundle.chmod(0o755)
    plugin.make_private(tmp_path / "sim-node-1")
    modes = {p.name: oct(p.stat().st_mode & 0o777)
             for p in (tmp_path / "sim-node-1", bundle, bundle / "verdict.json")}
    assert modes == {"sim-node-1": "0o700", BUNDLE: "0o700", "verdict.json": "0o600"}
