"""Which code may import which: the product never imports its simulator (the simulator
provides a node's GPUs through the GPU layer's backend and its launch through the install
mode), and nothing under plugins/ imports it either."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIMULATOR = "sglang_fleet.sim"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_no_plugin_and_no_controller_module_imports_the_simulator():
    product = [p for p in (REPO / "src" / "sglang_fleet").rglob("*.py")
               if not {"sim", "testfleet"} & set(p.relative_to(REPO / "src").parts)]
    product += list((REPO / "plugins").rglob("*.py"))
    assert len(product) > 40
    offenders = sorted(str(p.relative_to(REPO)) for p in product
                       if any(name == SIMULATOR or name.startswith(SIMULATOR + ".")
                              for name in _imports(p)))
    assert offenders == [], offenders
