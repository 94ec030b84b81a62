"""The gpuhunt library is an optional extra: only its importer imports it, and only lazily."""

from __future__ import annotations

import ast
import sys

import httpx
import pytest

import tuneplan
from tuneplan.adapters.importers import gpuhunt
from tuneplan.adapters.importers.network import SourceSkipped

SRC = tuneplan.__file__.removesuffix("__init__.py")


def _gpuhunt_imports(tree: ast.AST) -> list[ast.AST]:
    return [node for node in ast.walk(tree)
            if (isinstance(node, ast.Import)
                and any(a.name.split(".")[0] == "gpuhunt" for a in node.names))
            or (isinstance(node, ast.ImportFrom) and node.level == 0
                and (node.module or "").split(".")[0] == "gpuhunt")]


def test_only_the_gpuhunt_importer_imports_the_library_and_never_at_module_level() -> None:
    from pathlib import Path

    importers = {}
    for path in sorted(Path(SRC).rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        if _gpuhunt_imports(tree):
            importers[str(path.relative_to(SRC))] = tree
    assert list(importers) == ["adapters/importers/gpuhunt.py",
                               "adapters/importers/gpuhunt_online.py"]
    for tree in importers.values():
        module_level = [n for n in tree.body  # type: ignore[attr-defined]
                        if isinstance(n, ast.Import | ast.ImportFrom) and _gpuhunt_imports(n)]
        assert module_level == []  # `catalog refresh` works without the extra


def test_without_the_library_a_gpuhunt_source_is_skipped_not_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gpuhunt", None)  # "import gpuhunt" raises ImportError
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(500)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client, pytest.raises(
            SourceSkipped, match=r"install tuneplan\[catalog\]"):
        gpuhunt.fetch(client, provider="aws")
    assert asked == []  # nothing downloaded for a catalog it could not read
