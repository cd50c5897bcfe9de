"""sglang-fleet: deploy, gate, recover and measure SGLang servers on GPU fleets."""

from importlib.metadata import PackageNotFoundError, version

# One source: pyproject.toml's version, as pip installed it (the collection's plugins compare
# it with galaxy.yml's, plugins/plugin_utils/package_version.py).
try:
    __version__ = version("sglang-fleet")
except PackageNotFoundError:  # imported from a source tree pip never installed
    __version__ = "unknown"
