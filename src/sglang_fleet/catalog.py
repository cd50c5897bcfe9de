"""Reviewed data shipped with the package: SGLang releases, NCCL variable names, sim profiles."""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from typing import Any

import yaml


def _data_text(name: str) -> str:
    return resources.files("sglang_fleet").joinpath("data", name).read_text(encoding="utf-8")


@cache
def sglang_versions() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(_data_text("sglang_versions.yml"))


@cache
def nccl_variable_names() -> frozenset[str]:
    lines = _data_text("nccl_variables.txt").splitlines()
    return frozenset(x.strip() for x in lines if x.strip() and not x.startswith("#"))


def nccl_did_you_mean(name: str) -> str | None:
    close = difflib.get_close_matches(name, sorted(nccl_variable_names()), n=1, cutoff=0.75)
    return close[0] if close else None


@cache
def sim_profile(name: str) -> dict[str, Any]:
    try:
        return yaml.safe_load(_data_text(f"sim_profiles/{name}.yml"))
    except FileNotFoundError:
        known = sorted(
            p.name.removesuffix(".yml")
            for p in resources.files("sglang_fleet").joinpath("data", "sim_profiles").iterdir()
        )
        raise KeyError(f"unknown simulator profile {name!r}; known: {', '.join(known)}") from None
