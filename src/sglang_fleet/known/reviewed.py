"""Reviewed data shipped with the package: what the toolkit models of each SGLang release, NCCL
variable names and simulator profiles (data/). SGLang's flags themselves are in the generated
catalogue (sglang_fleet.known.catalogue)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

import yaml


def data_text(name: str) -> str:
    return resources.files("sglang_fleet").joinpath("data", name).read_text(encoding="utf-8")


# libyaml where PyYAML has it: each simulated worker reads its profile and the known bugs as it
# starts, and the pure-Python parser took a third of a scheduler's start-up CPU.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def data_yaml(name: str) -> Any:
    """A shipped data file (data/NAME), parsed."""
    return yaml.load(data_text(name), Loader=_FAST_LOADER)  # noqa: S506 - a safe loader


@dataclass(frozen=True)
class Release:
    """One pinnable SGLang release, as modelled from its source."""

    version: str
    launch_module: str
    args_parser: str
    default_attention_backend: dict[str, dict[str, str]]
    trtllm_mla_on_sm100: tuple[str, ...]
    cuda_graph_captured_by_default: tuple[str, ...]
    cuda_graph_disable: dict[str, Any]
    cuda_graph_max_bs_flag: str

    def default_backend(self, family: str, compute_capability: str,
                        architecture: str | None = None) -> str:
        """The attention backend SGLang picks when none is set, for this GPU and model family
        (and architecture, where known: None means the family's usual one)."""
        table = self.default_attention_backend[family]
        major = str(compute_capability).split(".", 1)[0]
        if family == "MLA" and major == "10" and (
                architecture is None or architecture in self.trtllm_mla_on_sm100):
            return "trtllm_mla"
        return table.get(major, table["other"])


@cache
def releases() -> dict[str, Release]:
    raw = data_yaml("sglang_versions.yml")
    return {version: Release(
        version=version, launch_module=r["launch_module"], args_parser=r["args_parser"],
        default_attention_backend=r["default_attention_backend"],
        trtllm_mla_on_sm100=tuple(r["trtllm_mla_on_sm100"]),
        cuda_graph_captured_by_default=tuple(r["cuda_graph"]["captured_by_default"]),
        cuda_graph_disable=dict(r["cuda_graph"]["disable"]),
        cuda_graph_max_bs_flag=r["cuda_graph"]["max_bs_flag"]) for version, r in raw.items()}


def release_of(version: str, flags: Any) -> tuple[Release, str | None]:
    """What the toolkit models of a release (sglang_versions.yml), and a note when it is not
    modelled: then the nearest modelled release whose CUDA-graph flags this one has (by its
    own catalogue's `flags`), the older one first, stands in for it."""
    from packaging.version import Version

    known = releases()
    if version in known:
        return known[version], None
    fits = [r for r in known.values()
            if all(f in flags for f in (*r.cuda_graph_disable, r.cuda_graph_max_bs_flag))]
    if not fits:
        fits = list(known.values())
    wanted = Version(version)
    older = sorted((r for r in fits if Version(r.version) <= wanted),
                   key=lambda r: Version(r.version))
    base = older[-1] if older else min(fits, key=lambda r: Version(r.version))
    return replace(base, version=version), (
        f"SGLang {version}'s default attention backends and CUDA-graph flags are taken from "
        f"{base.version}'s (data/sglang_versions.yml models no other); its flags, defaults "
        f"and refusals are its own")


@cache
def nccl_variable_names() -> frozenset[str]:
    lines = data_text("nccl_variables.txt").splitlines()
    return frozenset(x.strip() for x in lines if x.strip() and not x.startswith("#"))


def nccl_did_you_mean(name: str) -> str | None:
    close = difflib.get_close_matches(name, sorted(nccl_variable_names()), n=1, cutoff=0.75)
    return close[0] if close else None


def shipped_sim_profiles() -> list[str]:
    return sorted(
        p.name.removesuffix(".yml")
        for p in resources.files("sglang_fleet").joinpath("data", "sim_profiles").iterdir()
        if p.name.endswith(".yml"))


@cache
def sim_profile(name: str) -> dict[str, Any]:
    try:
        return data_yaml(f"sim_profiles/{name}.yml")
    except FileNotFoundError:
        raise KeyError(f"unknown simulator profile {name!r}; known: "
                       f"{', '.join(shipped_sim_profiles())}") from None
