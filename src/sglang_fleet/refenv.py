"""Reference environments: real SGLang releases installed without a GPU, to read their argument
parser. One virtualenv holds a CPU torch and the modules SGLang's parser imports; each release
is installed with `--no-deps` into its own folder and put on PYTHONPATH when probed.

    python -m sglang_fleet.refenv ensure 0.5.23            # build or reuse the environment
    python -m sglang_fleet.refenv catalogue 0.5.23 --write # regenerate the shipped catalogue

The environment lives in `.cache/sglang-ref/` of the project (SGLANG_FLEET_REF_DIR overrides).
The torch requirement defaults to the CPU build pinned below (SGLANG_FLEET_REF_TORCH overrides,
e.g. with a PIP_EXTRA_INDEX_URL pointing at PyTorch's CPU wheels where no local wheel exists).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sglang_fleet.catalogue import CATALOGUE_DIR, catalogue_path, write_catalogue

PROJECT = Path(__file__).resolve().parents[2]
TORCH_REQUIREMENT = "torch==2.13.0"
# Import name -> PyPI distribution, for modules whose names differ.
_DISTRIBUTIONS = {"PIL": "pillow", "yaml": "pyyaml", "zmq": "pyzmq", "google": "protobuf",
                  "sklearn": "scikit-learn", "cv2": "opencv-python-headless",
                  "pydantic_core": "pydantic"}
_MISSING = re.compile(r"No module named '([A-Za-z0-9_]+)")
MAX_DISCOVERY_ROUNDS = 40


class RefEnvError(RuntimeError):
    pass


def ref_root() -> Path:
    return Path(os.environ.get("SGLANG_FLEET_REF_DIR") or PROJECT / ".cache" / "sglang-ref")


@dataclass(frozen=True)
class RefEnv:
    """A release's reference environment: which Python and PYTHONPATH run its parser."""

    version: str
    python: Path
    sglang_dir: Path

    def run(self, *args: str, stdin: str | None = None, timeout: float = 600
            ) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(self.sglang_dir), PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONHOME", None)
        return subprocess.run([str(self.python), *args], input=stdin, capture_output=True,
                              text=True, env=env, timeout=timeout, cwd=self.sglang_dir)

    def probe(self, command: str, payload: Any = None) -> Any:
        """Run catalogue_probe.py inside this environment; its JSON answer."""
        probe = self.sglang_dir.parent / "catalogue_probe.py"
        # A copy outside the package: run from src/sglang_fleet, our bisect.py would shadow
        # the standard library's for SGLang.
        probe.write_text(resources.files("sglang_fleet").joinpath("catalogue_probe.py")
                         .read_text(encoding="utf-8"))
        proc = self.run(str(probe), command,
                        stdin=None if payload is None else json.dumps(payload))
        if proc.returncode != 0:
            raise RefEnvError(f"SGLang {self.version} probe '{command}' failed: "
                              f"{proc.stderr.strip()[-2000:]}")
        return json.loads(proc.stdout)


def _pip(python: Path, *args: str) -> None:
    # The installed torch stays: a parser import must never pull a multi-GB CUDA build.
    pin = python.parent.parent / "torch-constraint.txt"
    proc = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True)
    pin.write_text(f"torch=={proc.stdout.strip()}\n" if proc.returncode == 0 else "")
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", "-c", str(pin), *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RefEnvError(f"pip install {' '.join(args)} failed:\n{proc.stderr.strip()[-3000:]}")


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(f"refenv: {text}", file=sys.stderr, flush=True)


def ensure(version: str, quiet: bool = False) -> RefEnv:
    """Build (or reuse) the reference environment of one SGLang release."""
    root = ref_root()
    venv = root / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        _say(quiet, f"creating {venv}")
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    torch_req = os.environ.get("SGLANG_FLEET_REF_TORCH", TORCH_REQUIREMENT)
    if subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode:
        _say(quiet, f"installing {torch_req} (CPU build) into {venv}")
        _pip(python, torch_req)
    target = root / f"sglang-{version}"
    env = RefEnv(version, python, target)
    ready = target / ".ready"
    if ready.exists():
        return env
    if not (target / "sglang").is_dir():
        _say(quiet, f"installing sglang=={version} --no-deps into {target}")
        shutil.rmtree(target, ignore_errors=True)
        _pip(python, "--no-deps", "--target", str(target), f"sglang=={version}")
    installed = _install_parser_imports(env, quiet)
    ready.write_text(json.dumps({"version": version, "installed": installed,
                                 "at": time.time()}) + "\n")
    return env


def _install_parser_imports(env: RefEnv, quiet: bool) -> list[str]:
    """Install, one by one, the modules that importing SGLang's argument parser needs."""
    installed: list[str] = []
    check = "from sglang.srt.server_args import ServerArgs, prepare_server_args"
    for _ in range(MAX_DISCOVERY_ROUNDS):
        proc = env.run("-c", check)
        if proc.returncode == 0:
            return installed
        missing = _MISSING.search(proc.stderr)
        if not missing:
            raise RefEnvError(f"SGLang {env.version}'s parser does not import: "
                              f"{proc.stderr.strip()[-2000:]}")
        dist = _DISTRIBUTIONS.get(missing.group(1), missing.group(1))
        if dist in installed:
            raise RefEnvError(f"installing {dist} did not provide module {missing.group(1)}")
        _say(quiet, f"SGLang {env.version}'s parser imports {missing.group(1)}: installing "
                    f"{dist}")
        _pip(env.python, dist)
        installed.append(dist)
    raise RefEnvError(f"SGLang {env.version}'s parser still misses modules after "
                      f"{MAX_DISCOVERY_ROUNDS} installs")


def real_catalogue(version: str, quiet: bool = False) -> dict[str, Any]:
    """The release's options as its own parser reports them."""
    dump = ensure(version, quiet).probe("dump")
    if dump["sglang_version"] != version:
        raise RefEnvError(f"asked for SGLang {version}, the environment has "
                          f"{dump['sglang_version']}")
    return dump


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.refenv",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_ensure = sub.add_parser("ensure", help="build or reuse reference environments")
    p_ensure.add_argument("versions", nargs="+")
    p_cat = sub.add_parser("catalogue", help="print or write a release's catalogue")
    p_cat.add_argument("versions", nargs="+")
    p_cat.add_argument("--write", action="store_true",
                       help=f"write {CATALOGUE_DIR.relative_to(PROJECT)}/sglang-<version>.json")
    args = parser.parse_args(argv)
    try:
        for version in args.versions:
            env = ensure(version)
            if args.command == "ensure":
                print(f"SGLang {version}: {env.python} with PYTHONPATH={env.sglang_dir}")
                continue
            dump = real_catalogue(version)
            if args.write:
                path = write_catalogue(dump)
                print(f"SGLang {version}: {len(dump['options'])} options -> "
                      f"{path.relative_to(PROJECT) if path.is_relative_to(PROJECT) else path}")
            else:
                json.dump(dump, sys.stdout, indent=1)
                print()
    except RefEnvError as exc:
        print(f"refenv: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["RefEnv", "RefEnvError", "catalogue_path", "ensure", "real_catalogue", "ref_root"]
