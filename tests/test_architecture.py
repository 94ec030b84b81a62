"""Layering rules of ARCHITECTURE.md, enforced: the core imports only stdlib and itself."""

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
