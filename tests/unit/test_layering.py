"""Which code may import which: the product never imports its simulator (the simulator
provides a node's GPUs through the GPU layer's backend and its launch through the install
mode), and nothing under plugins/ imports it either; the package's modules import each other
one way, with no loop."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
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


def _package_modules() -> dict[str, Path]:
    modules = {}
    for path in (SRC / "sglang_fleet").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports anywhere in its file: at the top, inside a function,
    or only for type checking (a reader and a type checker follow those too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m in modules and m != name}


def _a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import loop as the path that closes it, or [] when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        path.append(node)
        for target in sorted(graph[node]):
            if loop := visit(target):
                return loop
        path.pop()
        done.add(node)
        return []

    for start in sorted(graph):
        if loop := visit(start):
            return loop
    return []


def test_the_package_has_no_import_loop():
    modules = _package_modules()
    graph = {name: _imported_modules(name, path, modules) for name, path in modules.items()}
    # the graph sees real imports
    assert "sglang_fleet.settings.server" in graph["sglang_fleet.spec.launch_spec"]
    loop = _a_cycle(graph)
    assert loop == [], " -> ".join(loop)


def test_the_loop_finder_finds_a_loop():
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": set()}) == []
