"""A local wheelhouse for the simulated fleet's pip release environments: tiny wheels, built
here without a network, that stand for a release of SGLang (sglang_server_sim_pip).

`sglang-fleet-sim-release==<version>` holds no code of its own: its one `.pth` file puts this
interpreter's site-packages (sglang_fleet and its dependencies) on the environment's path, so
that the simulator runs from the environment's own Python as SGLang would from a real one.
pip installs it for real (`--no-index --find-links` the wheelhouse): a venv per requirement
set, its marker, the install skipped when it is there.
"""

from __future__ import annotations

import base64
import hashlib
import sysconfig
import zipfile
from pathlib import Path

RELEASE_PACKAGE = "sglang-fleet-sim-release"
EXTRA_PACKAGE = "sglang-fleet-sim-extra"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(folder: Path, project: str, version: str) -> Path:
    """One pure-Python wheel of `project` at `version` whose .pth adds this interpreter's
    site-packages to the environment that installs it."""
    dist = project.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    site = sysconfig.get_paths()["purelib"]
    files = {
        f"{dist}.pth": f"import site; site.addsitedir({site!r})\n".encode(),
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
                             "Summary: simulated SGLang release for sglang-fleet's tests\n"
                             ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sglang-fleet\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
    return path


def sim_wheelhouse(folder: Path, versions: tuple[str, ...] = ("0.5.4.post3", "0.5.23"),
                   extras: tuple[str, ...] = ("1.0",)) -> Path:
    """The wheelhouse: the simulated release at each version, and an extra package at each
    of `extras` (a third requirement set on the same release)."""
    for version in versions:
        build_wheel(folder, RELEASE_PACKAGE, version)
    for version in extras:
        build_wheel(folder, EXTRA_PACKAGE, version)
    return folder


def sim_pip_settings(wheelhouse: Path, version: str, keep: int = 2,
                     extra_packages: list[str] | None = None) -> dict[str, object]:
    """The inventory variables of a simulated server on a pip release environment."""
    return {"sglang_server_sim_pip": True, "sglang_server_version": version,
            "sglang_server_pip_package": RELEASE_PACKAGE,
            "sglang_server_pip_extra_packages": list(extra_packages or []),
            "sglang_server_pip_extra_args": f"--no-index --find-links {wheelhouse}",
            "sglang_server_env_keep": keep}
