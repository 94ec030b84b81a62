"""Layering rules of docs/ARCHITECTURE.md, enforced: the core imports only stdlib and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import tuneplan

SRC = Path(tuneplan.__file__).parent
# Modules outside core/ that the core may import: pure, stdlib-only leaves.
CORE_MAY_IMPORT = {"tuneplan.core", "tuneplan.units", "tuneplan.explain", "tuneplan.errors"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text("utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.append("tuneplan.core")  # relative imports inside core stay inside core
    return names


def _allowed(name: str) -> bool:
    top = name.split(".")[0]
    if top == "tuneplan":
        return any(name == ok or name.startswith(ok + ".") for ok in CORE_MAY_IMPORT)
    return top in sys.stdlib_module_names or top == "__future__"


def test_core_imports_only_stdlib_and_core() -> None:
    core_files = sorted((SRC / "core").rglob("*.py"))
    assert core_files, "core/ has no modules"
    offenders = [
        f"{path.relative_to(SRC)}: {name}"
        for path in core_files for name in _imports(path) if not _allowed(name)
    ]
    assert offenders == []


def test_leaf_modules_the_core_uses_are_stdlib_only() -> None:
    for leaf in ("units.py", "explain.py", "errors.py"):
        bad = [n for n in _imports(SRC / leaf) if not _allowed(n)]
        assert bad == [], leaf


def test_the_checker_would_catch_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\nfrom tuneplan.adapters import hub\nimport json\n")
    assert [n for n in _imports(bad) if not _allowed(n)] == ["numpy", "tuneplan.adapters"]


# --- the layers of the whole package -------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_imports() -> dict[str, set[str]]:
    """module -> tuneplan modules it imports anywhere (module level or inside functions),
    ``from a import b`` counted as ``a.b`` when ``a.b`` is a module."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base
                           for a in node.names]
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target.startswith("tuneplan") and target != name:
                    found.add(target)
        graph[name] = found
    return graph


GRAPH = _all_imports()


def _importers_of(layer: str, *, within: str) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if m.startswith(within)
                  for t in targets if t == layer or t.startswith(layer + "."))


def test_the_web_never_imports_the_cli() -> None:
    assert _importers_of("tuneplan.cli", within="tuneplan.web") == []


def test_adapters_import_neither_the_service_layer_nor_a_face() -> None:
    for layer in ("tuneplan.service", "tuneplan.cli", "tuneplan.web"):
        assert _importers_of(layer, within="tuneplan.adapters") == []


def test_the_service_layer_imports_no_face() -> None:
    for layer in ("tuneplan.cli", "tuneplan.web"):
        assert _importers_of(layer, within="tuneplan.service") == []


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        component.add(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        out.append(component)
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on:
                low[node] = min(low[node], index[child])
    return out


def _folder(module: str) -> str:
    path = SRC.parent.joinpath(*module.split("."))
    return str(path if path.is_dir() else path.parent)


def test_no_import_circle_spans_more_than_one_folder() -> None:
    wide = [sorted(c) for c in _cycles(GRAPH) if len({_folder(m) for m in c}) > 1]
    assert wide == []


def test_the_cycle_finder_finds_a_cycle_across_folders() -> None:
    graph = {"tuneplan.cli.app": {"tuneplan.cli.plan"}, "tuneplan.cli.plan": {"tuneplan.web.x"},
             "tuneplan.web.x": {"tuneplan.cli.app"}, "tuneplan.units": set()}
    assert _cycles(graph) == [{"tuneplan.cli.app", "tuneplan.cli.plan", "tuneplan.web.x"}]
    assert _importers_of("tuneplan.cli", within="tuneplan.web") == []  # the real tree is clean
