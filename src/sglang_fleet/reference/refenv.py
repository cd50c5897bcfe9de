"""Reference environments: real SGLang releases installed without a GPU, to read their argument
parser. One virtualenv holds a CPU torch and the modules SGLang's parser imports; each release
is installed with `--no-deps` into its own folder and put on PYTHONPATH when probed.

    python -m sglang_fleet.reference.refenv ensure 0.5.23    # build or reuse the environment
    python -m sglang_fleet.reference.refenv catalogue 0.5.23 --write
                                                    # regenerate the shipped catalogue

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

from sglang_fleet.known.catalogue import CATALOGUE_DIR, catalogue_path, write_catalogue

PROJECT = Path(__file__).resolve().parents[3]
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
        probe.write_text(resources.files("sglang_fleet").joinpath("reference", "catalogue_probe.py")
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
    proc = subprocess.run([str(python), "-c", "import torch, torchvision; "
                           "print(f'torch=={torch.__version__}\\ntorchvision=="
                           "{torchvision.__version__}')"], capture_output=True, text=True)
    # Without the local label (+cpu, +cu130): `==2.14.1` admits the installed build, while a
    # label the wheel's file name lacks would match no candidate at all.
    pin.write_text(re.sub(r"\+\S+", "", proc.stdout) if proc.returncode == 0 else "")
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
    if subprocess.run([str(python), "-c", "import torch, torchvision"],
                      capture_output=True).returncode:
        _say(quiet, f"installing {torch_req} into {venv}")
        _pip(python, *torch_req.split())
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
    installed += _install_check_imports(env, quiet)
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


def sample_model_dir() -> Path:
    """A model folder with SAMPLE_MODEL_CONFIG, for running SGLang's checks."""
    folder = ref_root() / "models" / "kimi-k2.5-shape"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.json"
    text = json.dumps(SAMPLE_MODEL_CONFIG, indent=1) + "\n"
    if not config.exists() or config.read_text() != text:
        config.write_text(text)
    return folder


def _install_check_imports(env: RefEnv, quiet: bool) -> list[str]:
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
        _pip(env.python, dist)
        installed.append(dist)
    raise RefEnvError(f"SGLang {env.version}'s checks still miss modules after "
                      f"{MAX_DISCOVERY_ROUNDS} installs")


def real_catalogue(version: str, quiet: bool = False) -> dict[str, Any]:
    """The release's options as its own parser reports them."""
    dump = ensure(version, quiet).probe("dump")
    if dump["sglang_version"] != version:
        raise RefEnvError(f"asked for SGLang {version}, the environment has "
                          f"{dump['sglang_version']}")
    return dump


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_fleet.reference.refenv",
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
           "sample_model_dir"]
