"""`tuneplan catalog refresh` as a shell sees it, against mock sources (never the network)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial

import httpx
import pytest

from tests.cli.conftest import CliResult
from tests.conftest import FIXTURES
from tuneplan.adapters import refresh as refresh_module
from tuneplan.adapters.importers import network, runpod, vastai
from tuneplan.adapters.refresh import LiveSource

Run = Callable[..., CliResult]
PAYLOADS = FIXTURES / "importers"


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.host == "runpod.test":
        types = json.loads((PAYLOADS / "runpod_gpu_types.json").read_text())
        return httpx.Response(200, json={"data": {"gpuTypes": types}})
    return httpx.Response(500)  # vast.ai is down


@pytest.fixture(autouse=True)
def _mock_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    mock = httpx.MockTransport(_handler)

    def fetcher(module_fetch: Callable[..., object], base_url: str) -> Callable[..., object]:
        def fetch(client: httpx.Client, **kwargs: object) -> object:
            with httpx.Client(transport=mock) as mocked:
                return module_fetch(mocked, base_url=base_url, **kwargs)
        return fetch

    sources = (
        LiveSource(name="runpod", group="runpod",
                   fetch=fetcher(runpod.fetch, "https://runpod.test/graphql")),
        LiveSource(name="vastai", group="vastai",
                   fetch=fetcher(vastai.fetch, "https://vast.test/bundles/")),
    )
    monkeypatch.setattr(refresh_module, "live_sources", partial(tuple, sources))
    # vast.ai's 500 is retried; the backoff must not make the test wait.
    monkeypatch.setattr(network, "DEFAULT_RETRY", network.RetryPolicy(sleep=lambda s: None))


def test_refresh_one_good_source_exits_0_with_json(run_cli: Run) -> None:
    result = run_cli("catalog", "refresh", "--source", "runpod", "--json")
    assert result.code == 0, result.stderr
    document = result.json()
    (outcome,) = document["sources"]
    assert (outcome["source"], outcome["status"], outcome["offers_written"]) == (
        "runpod", "ok", 83)
    assert document["failed"] == []
    status = run_cli("catalog", "status", "--json")
    assert status.code == 0, status.stderr
    assert "runpod" in status.stdout


def test_refresh_with_a_failing_source_exits_1_and_names_it(run_cli: Run) -> None:
    result = run_cli("catalog", "refresh", "--json")
    assert result.code == 1
    document = result.json()
    assert document["failed"] == ["vastai"]
    assert {o["source"]: o["status"] for o in document["sources"]} == {"runpod": "ok",
                                                                      "vastai": "failed"}
    assert "vastai" in result.stderr and "HTTP 500" in result.stderr


def test_refresh_table_output(run_cli: Run) -> None:
    result = run_cli("catalog", "refresh", "--source", "runpod")
    assert result.code == 0, result.stderr
    assert "runpod" in result.stdout and "83" in result.stdout


def test_unknown_source_exits_2_listing_valid_ones(run_cli: Run) -> None:
    result = run_cli("catalog", "refresh", "--source", "nope")
    assert result.code == 2
    assert "unknown source 'nope'" in result.stderr and "runpod, vastai" in result.stderr
    assert result.stdout == ""


def test_comma_separated_and_all_refresh_every_named_source(run_cli: Run) -> None:
    for words in (["--source", "runpod,vastai"], ["--source", "all"],
                  ["--source", "vastai", "--source", "runpod"]):
        result = run_cli("catalog", "refresh", *words, "--json")
        assert result.code == 1, words
        assert {o["source"]: o["status"] for o in result.json()["sources"]} == {
            "runpod": "ok", "vastai": "failed"}, words


def test_progress_is_plain_lines_on_stderr_when_it_is_not_a_terminal(run_cli: Run) -> None:
    result = run_cli("catalog", "refresh", "--source", "runpod,vastai")
    lines = [line for line in result.stderr.splitlines() if line.startswith("refresh [")]
    assert sorted(lines) == [
        "refresh [1/2] failed: vastai: failed: HTTP 500 from https://vast.test/bundles/ "
        "(4 attempts); previous snapshot kept",
        "refresh [2/2] ok: runpod: 83 offers written"] or sorted(lines) == [
        "refresh [1/2] ok: runpod: 83 offers written",
        "refresh [2/2] failed: vastai: failed: HTTP 500 from https://vast.test/bundles/ "
        "(4 attempts); previous snapshot kept"]
    assert "\x1b[" not in result.stderr  # no Rich live display on a non-terminal


def test_progress_is_a_rich_display_when_stderr_is_a_terminal(
        run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    result = run_cli("catalog", "refresh", "--source", "runpod")
    assert result.code == 0, result.stderr
    assert "refresh [" not in result.stderr  # no plain lines: the live bar instead
    assert "runpod" in result.stdout and "83" in result.stdout
