"""Which code may import which: the product never imports its simulator or its test fleet (the
simulator provides a node's GPUs through the GPU layer's backend and its launch through the
install mode), and nothing under plugins/ imports them either; the package's modules import
each other one way, with no loop; its folders stand on floors (docs/layout.md) and each imports
only folders below its own; module_utils imports nothing of the controller and has no loop;
no folder holds more than 15 modules."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
SIMULATOR = "sglang_fleet.sim"
TEST_FLEET = "sglang_fleet.testfleet"
MODULE_UTILS = REPO / "plugins" / "module_utils"
# The product's folders, ground floor first: a folder imports only folders on lower floors
# (and the node-side code, sglang_fleet.node, the symlink to plugins/module_utils).
FLOORS = {
    "known": 1, "settings": 1,        # what is known of SGLang; the settings tables
    "launch": 2, "staging": 2,        # the LaunchSpec and its launch files; staged weights
    "router": 3, "runs": 3,           # the RouterSpec; playbook runs and what they say
    "bench": 4, "recovery": 4,        # measurements and experiments; recovery's decisions
    "rollout": 4,                     # a canary judged by what clients feel
    "record": 4,                      # the run record: each run's page and its JSON
    "cli": 5,                         # the command line
    "reference": 6,                   # developers' checks against real SGLang
}
# The simulator and the test fleet stand apart: the simulator reads only what is known of
# SGLang (and the node's GPU layer); the test fleet drives everything.
APART = {"sim": {"known"}, "testfleet": None}
MAX_MODULES = 15


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_no_plugin_and_no_controller_module_imports_the_simulator_or_the_test_fleet():
    product = [p for p in (REPO / "src" / "sglang_fleet").rglob("*.py")
               if not {"sim", "testfleet"} & set(p.relative_to(REPO / "src").parts)]
    product += list((REPO / "plugins").rglob("*.py"))
    assert len(product) > 40
    offenders = sorted(str(p.relative_to(REPO)) for p in product
                       if any(name == apart or name.startswith(apart + ".")
                              for name in _imports(p) for apart in (SIMULATOR, TEST_FLEET)))
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
    assert "sglang_fleet.settings.server" in graph["sglang_fleet.launch.spec"]
    loop = _a_cycle(graph)
    assert loop == [], " -> ".join(loop)


def test_the_loop_finder_finds_a_loop():
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": set()}) == []


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def test_each_folder_imports_only_the_folders_below_it():
    modules = _package_modules()
    folders = {_folder(name) for name in modules} - {""}
    assert folders == set(FLOORS) | set(APART), "a new folder: give it a floor in FLOORS"
    wrong = []
    for name, path in modules.items():
        here = _folder(name)
        for target in _imported_modules(name, path, modules):
            there = _folder(target)
            if not there or there == here:
                continue
            if here in APART:
                ok = APART[here] is None or there in APART[here]
            else:
                ok = there in FLOORS and FLOORS[there] < FLOORS.get(here, 0)
            if not ok:
                wrong.append(f"{name} -> {target}")
    assert wrong == [], wrong


def _module_utils() -> dict[str, Path]:
    return {".".join(p.relative_to(MODULE_UTILS).with_suffix("").parts): p
            for p in MODULE_UTILS.rglob("*.py") if p.name != "__init__.py"}


def test_module_utils_import_nothing_of_the_controller_and_have_no_loop():
    modules = _module_utils()
    assert len(modules) > 25
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""])
                assert not any(n.startswith("sglang_fleet") for n in names), (name, names)
            if isinstance(node, ast.ImportFrom) and node.level:
                package = name.split(".")[:-node.level]
                base = [*package, *(node.module.split(".") if node.module else [])]
                found |= {".".join(base)} | {".".join([*base, a.name]) for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    assert "common.vocab" in graph["health.classify"]  # the graph sees real imports
    loop = _a_cycle(graph)
    assert loop == [], " -> ".join(loop)


def test_no_folder_holds_more_than_15_modules():
    crowded = {}
    for root in (SRC / "sglang_fleet", MODULE_UTILS):
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
            count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
            if count > MAX_MODULES:
                crowded[str(folder.relative_to(REPO))] = count
    assert crowded == {}, crowded
