"""A web app over a private, seeded catalog, and a TestClient for it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")
pytest.importorskip("multipart")

from fastapi.testclient import TestClient

from tuneplan.web import create_app


@pytest.fixture
def store_path() -> Path:
    """The catalog the CLI uses in this test (TUNEPLAN_HOME is private per test)."""
    return Path(os.environ["TUNEPLAN_HOME"]) / "catalog.sqlite"


@pytest.fixture
def client(store_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(store_path)) as test_client:
        yield test_client


from tests.cli.conftest import run_cli  # noqa: E402, F401  (the CLI, to compare documents)
