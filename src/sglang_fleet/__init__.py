"""sglang-fleet: deploy, gate, recover and measure SGLang servers on GPU fleets."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """`__version__`: pyproject.toml's version, as pip installed it (one source; the
    collection's plugins compare it with galaxy.yml's, plugins/plugin_utils/package_version.py).
    Read on first use: importlib.metadata costs every process that imports the package (each
    simulated scheduler, each CLI call) more than the rest of its start."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("sglang-fleet")
    except PackageNotFoundError:  # imported from a source tree pip never installed
        value = "unknown"
    globals()["__version__"] = value
    return value
