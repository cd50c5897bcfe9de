"""The stdout callback loads the collection's filter and action plugins in ansible-playbook's
own process, so that the workers it forks inherit them: each name it loads must be one the
collection has, or the load is silently skipped and every worker imports them again."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_plugin_the_callback_loads_exists():
    callback = _load(ROOT / "plugins" / "callback" / "sglang_fleet.py", "sglang_fleet_callback")
    filters = {}
    for path in (ROOT / "plugins" / "filter").glob("*.py"):
        filters.update(_load(path, f"filter_{path.stem}").FilterModule().filters())
    for kind, name in callback._FORKED_PLUGINS:
        namespace, collection, short = name.split(".")
        assert (namespace, collection) == ("sglang", "fleet")
        if kind == "filter":
            assert short in filters, name
        else:
            assert (ROOT / "plugins" / "action" / f"{short}.py").is_file(), name
    # Both filter files and every action plugin that imports the package are covered.
    loaded = {short for _, name in callback._FORKED_PLUGINS for short in [name.split(".")[2]]}
    assert {p.stem for p in (ROOT / "plugins" / "action").glob("*.py")} <= loaded
    assert "sglang_fleet_launch_spec" in loaded and "sglang_fleet_router_spec" in loaded
