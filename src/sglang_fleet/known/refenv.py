"""Reference environments: real SGLang releases installed without a GPU, to read their argument
parser. One virtualenv holds a CPU torch and the modules SGLang's parser imports; each release
is installed with `--no-deps` into its own folder and put on PYTHONPATH when probed.

    python -m sglang_fleet.known.refenv ensure 0.5.23    # build or reuse the environment
    python -m sglang_fleet.known.refenv catalogue 0.5.23 --write
                                                    # regenerate the shipped catalogue

The environment lives in `.cache/sglang-ref/` of the project (SGLANG_FLEET_REF_DIR overrides).
The torch requirement defaults to the CPU build pinned below (SGLANG_FLEET_REF_TORCH overrides,
e.g. with a PIP_EXTRA_INDEX_URL pointing at PyTorch's CPU wheels where no local wheel exists).
"""

from __future__ import annotations

import argparse
import difflib
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

from packaging.version import InvalidVersion, Version

from sglang_fleet.known import release_cache, warm_probe
from sglang_fleet.known.catalogue import (
    CATALOGUE_DIR,
    catalogue_path,
    forget_catalogues,
    write_catalogue,
)
from sglang_fleet.known.catalogue_probe import ANSWERS

PROJECT = release_cache.PROJECT
# The oldest release whose parser this builder knows (sglang.srt.server_args'
# ServerArgs.add_cli_args and prepare_server_args, probed by catalogue_probe.py).
MIN_SUPPORTED = "0.5.4.post3"
# pip's "Could not find a version that satisfies the requirement sglang==X (from versions: ...)"
_FROM_VERSIONS = re.compile(r"from versions: ([^)]*)\)")
# What pip (urllib3, requests) prints when the index is out of reach: refused, unresolved,
# timed out, behind a broken proxy or TLS.
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Max retries exceeded|"
    r"connection broken|Temporary failure in name resolution|Name or service not known|"
    r"Network is unreachable|ConnectTimeoutError|Read timed out|SSLError|ProxyError|"
    r"Could not fetch URL")
# SGLang's post-parse checks (resolve_once) import its model configs, some of which import
# torchvision at module load: torch and torchvision come as the pair this machine kind keeps on
# disk (a CUDA build; it runs on the CPU, and nothing here allocates GPU memory).
TORCH_REQUIREMENT = "torch==2.14.1 torchvision==0.29.1"
# Import name -> PyPI distribution, for modules whose names differ.
_DISTRIBUTIONS = {"PIL": "pillow", "yaml": "pyyaml", "zmq": "pyzmq", "google": "protobuf",
                  "sklearn": "scikit-learn", "cv2": "opencv-python-headless",
                  "pydantic_core": "pydantic", "tvm_ffi": "apache-tvm-ffi"}
# A checkpoint's config.json with Kimi-K2.5's language model's shape (64 attention heads, 61
# layers, 384 routed experts), written as transformers' DeepseekV3Config: SGLang's argument
# resolution reads a model's config (never its weights), so its checks run on this folder.
SAMPLE_MODEL_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_attention_heads": 64, "num_key_value_heads": 64, "num_hidden_layers": 61,
    "first_k_dense_replace": 1, "n_routed_experts": 384, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 163840, "max_position_embeddings": 262144, "rope_theta": 50000.0,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "bos_token_id": 163584, "eos_token_id": 163585,
}
# The installed torch pair, read from its metadata (importing torch takes seconds).
_TORCH_PINS = ("from importlib.metadata import version as v; "
               "print(f\"torch=={v('torch')}\\ntorchvision=={v('torchvision')}\")")
_MISSING = re.compile(r"No module named '([A-Za-z0-9_]+)")
MAX_DISCOVERY_ROUNDS = 40


class RefEnvError(RuntimeError):
    pass


def ref_root() -> Path:
    return release_cache.root()


@dataclass(frozen=True)
class RefEnv:
    """A release's reference environment: which Python and PYTHONPATH run its parser."""

    version: str
    python: Path
    sglang_dir: Path

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(self.sglang_dir), PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONHOME", None)
        return env

    def run(self, *args: str, stdin: str | None = None, timeout: float = 600
            ) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.python), *args], input=stdin, capture_output=True,
                              text=True, env=self.environment(), timeout=timeout,
                              cwd=self.sglang_dir)

    def _probe_file(self) -> tuple[Path, str]:
        probe = self.sglang_dir.parent / "catalogue_probe.py"
        text = _probe_text()
        # A copy outside the package: run from src/sglang_fleet, our bisect.py would shadow
        # the standard library's for SGLang. Replaced whole: parallel callers run it meanwhile.
        if not probe.exists() or probe.read_text(encoding="utf-8") != text:
            release_cache.write_text(probe, text)
        return probe, text

    def probe(self, command: str, payload: Any = None) -> Any:
        """catalogue_probe.py's JSON answer to `command` in this environment: `check`,
        `parse` and `prepare` from the release's warm probe (known/warm_probe.py: SGLang
        imported once per release, not once per question), `dump` from a run of its own."""
        probe, text = self._probe_file()
        if command in ANSWERS:
            try:
                return warm_probe.ask(self, probe, text, command, payload)
            except (OSError, ValueError, warm_probe.WarmProbeError) as exc:
                raise RefEnvError(f"SGLang {self.version} probe '{command}' failed: "
                                  f"{exc}") from None
        proc = self.run(str(probe), command,
                        stdin=None if payload is None else json.dumps(payload))
        if proc.returncode != 0:
            raise RefEnvError(f"SGLang {self.version} probe '{command}' failed: "
                              f"{proc.stderr.strip()[-2000:]}")
        return json.loads(proc.stdout)

    def check(self, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The release's verdicts on `cases` (catalogue_probe.check), from its warm probe."""
        return self.probe("check", cases)

    def stop_warm_probe(self) -> bool:
        """End this release's warm probe, if one listens."""
        return warm_probe.stop(self, _probe_text())


def _probe_text() -> str:
    return resources.files("sglang_fleet.known").joinpath("catalogue_probe.py").read_text(
        encoding="utf-8")


def stop_warm_probes() -> list[str]:
    """End the warm probe of every release built here; the releases whose probe listened."""
    stopped = []
    for folder in sorted(ref_root().glob("sglang-*")):
        env = _env_of(folder.name.removeprefix("sglang-"))
        if (folder / ".ready").exists() and env.stop_warm_probe():
            stopped.append(env.version)
    return stopped


def _env_of(version: str) -> RefEnv:
    """The release's environment in the reference folder, built or not: the shared venv's
    Python, the release's own folder."""
    root = ref_root()
    return RefEnv(version, root / "venv" / "bin" / "python", root / f"sglang-{version}")


def _pip(python: Path, *args: str, wheelhouse: Path | None = None) -> None:
    """pip of the release environment (never the project's own .venv). With a wheelhouse it
    reads that folder only, for a controller without registry access."""
    # The installed torch stays: a parser import must never pull a multi-GB CUDA build.
    pin = python.parent.parent / "torch-constraint.txt"
    proc = subprocess.run([str(python), "-c", _TORCH_PINS], capture_output=True, text=True)
    # Without the local label (+cpu, +cu130): `==2.14.1` admits the installed build, while a
    # label the wheel's file name lacks would match no candidate at all.
    pin.write_text(re.sub(r"\+\S+", "", proc.stdout) if proc.returncode == 0 else "")
    pip_install(python, "-c", str(pin), *args, wheelhouse=wheelhouse)


def pip_install(python: Path | str, *args: str, wheelhouse: Path | None = None) -> None:
    """`pip install` with `python`: from the wheelhouse only where one is given, else from
    the registry, failing fast where it is out of reach."""
    source = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else [
        "--retries", "1", "--timeout", "20"]
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", *source, *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RefEnvError(f"pip install {' '.join(args)} failed:\n{proc.stderr.strip()[-3000:]}")


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(f"refenv: {text}", file=sys.stderr, flush=True)


def release_name_problem(version: str, program: str = "SGLang",
                         minimum: str = MIN_SUPPORTED,
                         lacks: str = "lay out their argument parser otherwise (no "
                                      "sglang.srt.server_args.prepare_server_args with "
                                      "add_cli_args)") -> str | None:
    """Why `version` cannot name a release this builder supports, before anything is fetched."""
    try:
        wanted = Version(version)
    except InvalidVersion:
        return f"{version!r} is not a release number (such as {minimum})"
    if wanted < Version(minimum):
        return (f"{program} {version} is not supported: releases before {minimum} {lacks}; "
                f"pin {minimum} or newer")
    return None


def explain_install_failure(version: str, error: str, wheelhouse: Path | None,
                            requirement: str | None = None, package: str = "sglang"
                            ) -> RefEnvError:
    """pip's refusal, said as what the operator does next: the nearest releases for a name
    that does not exist, --wheelhouse for a registry out of reach."""
    listed = _FROM_VERSIONS.search(error)
    offered = [v.strip() for v in listed.group(1).split(",")] if listed else []
    offered = [v for v in offered if v and v != "none"]
    where = f"the wheelhouse {wheelhouse}" if wheelhouse else "the package registry"
    wanted = requirement or f"{package}=={version}"
    if offered and requirement is None:
        return RefEnvError(f"{package} {version} is not a release in {where}; the nearest are: "
                           f"{', '.join(nearest_releases(version, offered))}")
    last = error.strip().splitlines()[-1] if error.strip() else "no output"
    if wheelhouse:
        return RefEnvError(f"the wheelhouse {wheelhouse} holds no {wanted} wheel (pip: "
                           f"{last}); put the wheel there")
    if _UNREACHABLE.search(error):
        return RefEnvError(f"could not reach the package registry to fetch {wanted} (pip: "
                           f"{last}); on a controller without registry access pass "
                           f"--wheelhouse DIR: a folder with the release's wheel and the "
                           f"modules its parser imports (`pip download {package}=={version}` "
                           f"elsewhere)")
    if listed:  # reached, and it lists nothing: another index, or a mirror without it
        return RefEnvError(f"the package registry pip uses lists no release of {wanted} (pip: "
                           f"{last}); point pip at an index that has it (PIP_INDEX_URL, "
                           f"pip.conf) or pass --wheelhouse DIR with its wheel")
    return RefEnvError(f"pip could not install {wanted} (pip: {last}); the lines before it "
                       f"say why:\n{error.strip()[-1500:]}")


def nearest_releases(version: str, offered: list[str], count: int = 3) -> list[str]:
    """The `count` releases next to `version` in release order, oldest first."""
    known = sorted({v for v in offered if _valid(v)}, key=Version)
    if not _valid(version):
        return sorted(difflib.get_close_matches(version, known, n=count, cutoff=0), key=Version)
    wanted = Version(version)
    at = sum(1 for v in known if Version(v) < wanted)
    # By distance from where `version` would sit; the older one first on a tie.
    order = sorted(range(len(known)), key=lambda i: (abs(i - at + 0.5), -i))
    return sorted((known[i] for i in order[:count]), key=Version)


def _valid(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def ensure(version: str, quiet: bool = False, wheelhouse: Path | None = None) -> RefEnv:
    """Build (or reuse) the reference environment of one SGLang release. A failed build leaves
    no folder behind (the next call starts clean), and never touches the project's .venv."""
    problem = release_name_problem(version)
    if problem:
        raise RefEnvError(problem)
    env = _env_of(version)
    if (env.sglang_dir / ".ready").exists() and env.python.exists():
        return env
    with release_cache.locked(f"sglang-{version}"):
        return _build(version, quiet, wheelhouse)


def _build(version: str, quiet: bool, wheelhouse: Path | None) -> RefEnv:
    root = ref_root()
    venv = root / "venv"
    env = _env_of(version)
    python, target = env.python, env.sglang_dir
    ready = target / ".ready"
    if ready.exists():
        return env
    created = not python.exists()
    if created:
        _say(quiet, f"creating {venv}")
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    torch_req = os.environ.get("SGLANG_FLEET_REF_TORCH", TORCH_REQUIREMENT)
    if subprocess.run([str(python), "-c", _TORCH_PINS], capture_output=True).returncode:
        _say(quiet, f"installing {torch_req} into {venv}")
        try:
            _pip(python, *torch_req.split(), wheelhouse=wheelhouse)
        except RefEnvError as exc:
            if created:  # nothing half-built stays behind
                shutil.rmtree(venv, ignore_errors=True)
            raise explain_install_failure(version, str(exc), wheelhouse, torch_req) from None
    if not (target / "sglang").is_dir():
        _say(quiet, f"installing sglang=={version} --no-deps into {target}")
        partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            _pip(python, "--no-deps", "--target", str(partial), f"sglang=={version}",
                 wheelhouse=wheelhouse)
        except RefEnvError as exc:
            raise explain_install_failure(version, str(exc), wheelhouse) from None
        finally:
            if not (partial / "sglang").is_dir():
                shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    try:
        installed = _install_parser_imports(env, quiet, wheelhouse)
        installed += _install_check_imports(env, quiet, wheelhouse)
    except RefEnvError:
        shutil.rmtree(target, ignore_errors=True)  # a rerun starts clean
        raise
    ready.write_text(json.dumps({"version": version, "installed": installed,
                                 "at": time.time()}) + "\n")
    return env


def _install_parser_imports(env: RefEnv, quiet: bool, wheelhouse: Path | None = None
                            ) -> list[str]:
    """Install, one by one, the modules that importing SGLang's argument parser needs."""
    installed: list[str] = []
    check = "from sglang.srt.server_args import ServerArgs, prepare_server_args"
    for _ in range(MAX_DISCOVERY_ROUNDS):
        proc = env.run("-c", check)
        if proc.returncode == 0:
            return installed
        missing = _MISSING.search(proc.stderr)
        if not missing or missing.group(1) == "sglang":
            # Not a module to install: the release's own files are laid out otherwise.
            raise RefEnvError(f"SGLang {env.version} is not supported: its package has no "
                              f"{check.removeprefix('from ').replace(' import ', ':')} "
                              f"as releases from {MIN_SUPPORTED} have ("
                              f"{proc.stderr.strip().splitlines()[-1]})")
        dist = _DISTRIBUTIONS.get(missing.group(1), missing.group(1))
        if dist in installed:
            raise RefEnvError(f"installing {dist} did not provide module {missing.group(1)}")
        _say(quiet, f"SGLang {env.version}'s parser imports {missing.group(1)}: installing "
                    f"{dist}")
        _pip(env.python, dist, wheelhouse=wheelhouse)
        installed.append(dist)
    raise RefEnvError(f"SGLang {env.version}'s parser still misses modules after "
                      f"{MAX_DISCOVERY_ROUNDS} installs")


def sample_model_dir() -> Path:
    """A model folder with SAMPLE_MODEL_CONFIG, for running SGLang's checks."""
    folder = ref_root() / "models" / "kimi-k2.5-shape"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.json"
    text = json.dumps(SAMPLE_MODEL_CONFIG, indent=1) + "\n"
    if not config.exists() or config.read_text() != text:
        release_cache.write_text(config, text)
    return folder


def _install_check_imports(env: RefEnv, quiet: bool, wheelhouse: Path | None = None
                           ) -> list[str]:
    """Install, one by one, what SGLang's post-parse checks import (the probe's `check`) for
    a release whose server arguments have them (ServerArgs.resolve_once)."""
    installed: list[str] = []
    has_checks = ("from sglang.srt.server_args import ServerArgs; import sys; "
                  "sys.exit(not hasattr(ServerArgs, 'resolve_once'))")
    if env.run("-c", has_checks).returncode:
        return installed
    case = [{"argv": ["--model-path", str(sample_model_dir()), "--tp-size", "8"]}]
    for _ in range(MAX_DISCOVERY_ROUNDS):
        verdict = env.probe("check", case)[0]
        missing = _MISSING.search(" ".join(verdict["error"] or []))
        if verdict["ok"] or not missing:
            return installed
        dist = _DISTRIBUTIONS.get(missing.group(1), missing.group(1))
        if dist in installed:
            raise RefEnvError(f"installing {dist} did not provide module {missing.group(1)}")
        _say(quiet, f"SGLang {env.version}'s post-parse checks import {missing.group(1)}: "
                    f"installing {dist}")
        _pip(env.python, dist, wheelhouse=wheelhouse)
        installed.append(dist)
    raise RefEnvError(f"SGLang {env.version}'s checks still miss modules after "
                      f"{MAX_DISCOVERY_ROUNDS} installs")


def ensure_catalogue(version: str, quiet: bool = False, wheelhouse: Path | None = None
                     ) -> Path:
    """The release's catalogue on this controller: built from its package (its environment
    first, where that is not built yet) and cached, or the cached one."""
    path = release_cache.catalogue_file("sglang", version)
    if path.exists():
        return path
    release_cache.write_json(path, real_catalogue(version, quiet, wheelhouse))
    forget_catalogues()
    return path


def real_catalogue(version: str, quiet: bool = False, wheelhouse: Path | None = None
                   ) -> dict[str, Any]:
    """The release's options as its own parser reports them."""
    dump = ensure(version, quiet, wheelhouse).probe("dump")
    if dump["sglang_version"] != version:
        raise RefEnvError(f"asked for SGLang {version}, the environment has "
                          f"{dump['sglang_version']}")
    return dump


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.known.refenv",
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


__all__ = ["RefEnv", "RefEnvError", "catalogue_path", "ensure", "real_catalogue", "ref_root",
           "sample_model_dir", "stop_warm_probes"]
