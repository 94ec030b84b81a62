"""The refresh orchestrator: one atomic snapshot per source, failures isolated and reported."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import FIXTURES
from tests.waiting import HANG_GUARD_S, wait_until
from tuneplan.adapters import refresh as refresh_module
from tuneplan.adapters.importers import azure, runpod, vastai
from tuneplan.adapters.importers.base import ImportResult
from tuneplan.adapters.importers.network import HttpCache
from tuneplan.adapters.refresh import LiveSource, refresh, select_sources
from tuneplan.adapters.store import CatalogStore
from tuneplan.core.catalog.offers import Offer
from tuneplan.errors import InvalidValueError

PAYLOADS = FIXTURES / "importers"
OLD = datetime(2026, 11, 1, tzinfo=UTC)


def dump(path: Path) -> str:
    """Every row of every table, as SQL text (row-for-row comparison)."""
    with sqlite3.connect(path) as connection:
        return "\n".join(connection.iterdump())


def payload(name: str) -> Any:
    return json.loads((PAYLOADS / name).read_text())


def routes(overrides: dict[str, httpx.Response] | None = None) -> httpx.Client:
    """A mock web: RunPod, vast.ai and Azure answer with their recorded payloads."""
    overrides = overrides or {}

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in overrides:
            return overrides[host]
        if host == "runpod.test":
            return httpx.Response(200, json={"data": {"gpuTypes": payload(
                "runpod_gpu_types.json")}})
        if host == "vast.test":
            return httpx.Response(200, json=payload("vastai_bundles_offer.json"))
        return httpx.Response(200, json=payload("azure_retail_prices_gpu_page.json"))

    return httpx.Client(transport=httpx.MockTransport(handler))


def sources() -> tuple[LiveSource, ...]:
    return (
        LiveSource(name="runpod", group="runpod",
                   fetch=partial(runpod.fetch, base_url="https://runpod.test/graphql")),
        LiveSource(name="vastai", group="vastai",
                   fetch=partial(vastai.fetch, base_url="https://vast.test/bundles/")),
        LiveSource(name="azure", group="azure",
                   fetch=partial(azure.fetch, base_url="https://azure.test/prices")),
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CatalogStore]:
    """A catalog with an old snapshot of each test source (2 offers each)."""
    opened = CatalogStore.open(tmp_path / "catalog.sqlite", seed=False)
    first = refresh(opened, client=routes(), available=sources())
    assert [o.status for o in first] == ["ok", "ok", "ok"]
    yield opened
    opened.close()


def test_refresh_writes_each_source_as_its_own_snapshot(store: CatalogStore) -> None:
    status = {s.source: s.offers for s in store.status()}
    assert status == {"runpod": 83, "vastai": 1, "azure": 6}
    h100 = [o for o in store.offers() if o.instance_type == "Standard_ND96isr_H100_v5"]
    assert [o.price_per_hour for o in h100] == [Decimal("98.32")]


@pytest.mark.parametrize(("broken", "fragment"), [
    (httpx.Response(500), "HTTP 500"),
    (httpx.Response(200, text='{"data": {"gpuTypes": [{"id": "NVIDIA'), "unreadable JSON"),
    (httpx.Response(200, json={"data": {"gpuTypes": [{"displayName": "H100 SXM",
                                                      "secureCloud": True, "maxGpuCount": 8,
                                                      "securePrice": -2.99}]}}),
     "no valid offers"),
    (httpx.Response(200, json={"data": {"gpuTypes": "surprise"}}), "no gpuTypes list"),
])
def test_a_broken_source_keeps_its_snapshot_and_does_not_block_others(
        store: CatalogStore, broken: httpx.Response, fragment: str) -> None:
    before = dump(store.path)
    outcomes = refresh(store, client=routes({"runpod.test": broken}), available=sources())
    by_source = {o.source: o for o in outcomes}
    assert by_source["runpod"].failed and fragment in by_source["runpod"].message
    assert "previous snapshot kept" in by_source["runpod"].message
    assert by_source["vastai"].status == by_source["azure"].status == "ok"
    old_lines = [line for line in before.splitlines() if "'runpod'" in line]
    new_lines = [line for line in dump(store.path).splitlines() if "'runpod'" in line]
    assert new_lines == old_lines and len(old_lines) == 84  # 1 snapshot row + 83 offers


def test_every_source_failing_leaves_the_database_row_for_row_identical(
        store: CatalogStore) -> None:
    before = dump(store.path)
    down = {h: httpx.Response(503) for h in ("runpod.test", "vast.test", "azure.test")}
    outcomes = refresh(store, client=routes(down), available=sources())
    assert all(o.failed for o in outcomes)
    assert dump(store.path) == before


def test_a_crash_inside_an_importer_is_contained(store: CatalogStore) -> None:
    def crashing(client: httpx.Client, **_: Any) -> ImportResult:
        raise ZeroDivisionError("division by zero in a parser")

    available = (LiveSource(name="runpod", group="runpod", fetch=crashing), *sources()[1:])
    before = dump(store.path)
    outcomes = refresh(store, client=routes(), available=available)
    assert outcomes[0].failed and "ZeroDivisionError" in outcomes[0].message
    assert [o.status for o in outcomes[1:]] == ["ok", "ok"]
    runpod_lines = [line for line in before.splitlines() if "'runpod'" in line]
    assert runpod_lines == [line for line in dump(store.path).splitlines() if "'runpod'" in line]


def test_an_exception_half_way_through_the_write_rolls_back(
        store: CatalogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    before = dump(store.path)
    original = store.replace_source

    def exploding(offers: Iterable[Offer]) -> Iterator[Offer]:
        for index, offer in enumerate(offers):
            if index == 40:
                raise OSError("disk vanished half-way")
            yield offer

    monkeypatch.setattr(store, "replace_source",
                        lambda source, offers, at, **kw: original(source, exploding(offers), at,
                                                                  **kw))
    outcomes = refresh(store, ["runpod"], client=routes(), available=sources())
    assert outcomes[0].failed and "writing failed" in outcomes[0].message
    assert "disk vanished" in outcomes[0].message
    assert dump(store.path) == before


def test_mostly_rejected_rows_keep_the_previous_snapshot(store: CatalogStore) -> None:
    types = payload("runpod_gpu_types.json")
    hostile = [{**t, "securePrice": "NaN", "communityPrice": -1} for t in types[1:]] + types[:1]
    before = dump(store.path)
    reply = httpx.Response(200, json={"data": {"gpuTypes": hostile}})
    (outcome,) = refresh(store, ["runpod"], client=routes({"runpod.test": reply}),
                         available=sources())
    assert outcome.failed and "rows rejected" in outcome.message
    assert dump(store.path) == before


def test_a_successful_refresh_replaces_and_keeps_history(store: CatalogStore) -> None:
    types = payload("runpod_gpu_types.json")
    cheaper = [{**t, "securePrice": 0.01} if t["displayName"] == "H100 SXM" else t for t in types]
    reply = httpx.Response(200, json={"data": {"gpuTypes": cheaper}})
    (outcome,) = refresh(store, ["runpod"], client=routes({"runpod.test": reply}),
                         available=sources())
    assert outcome.status == "ok" and outcome.offers_written == 83
    h100 = [o for o in store.offers() if o.instance_type == "1x H100 SXM SECURE"]
    assert [o.price_per_hour for o in h100] == [Decimal("0.01")]
    assert {s.source: s.snapshots for s in store.status()}["runpod"] == 2


def test_unknown_source_name_lists_the_valid_ones() -> None:
    with pytest.raises(InvalidValueError, match="choose from all, azure, aws, runpod"):
        select_sources(["nope"])
    assert "aws" not in {s.name for s in select_sources(None)}  # opt-in: huge offer files
    assert [s.name for s in select_sources(["aws"])] == ["aws"]
    chosen = select_sources(["skypilot"])
    assert len(chosen) == 21 and chosen[0].name == "skypilot/aws"
    assert [s.name for s in select_sources(["skypilot/gcp", "AZURE"])] == ["skypilot/gcp",
                                                                           "azure"]


def test_key_source_without_key_is_skipped_not_failed(
        store: CatalogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    lambda_source = next(s for s in refresh_module.live_sources() if s.name == "lambda")
    (outcome,) = refresh(store, ["lambda"], client=routes(), available=(lambda_source,))
    assert outcome.status == "skipped" and "LAMBDA_API_KEY" in outcome.message


_KILLED_SCRIPT = textwrap.dedent("""
    import sys, time
    from functools import partial
    import httpx
    from tests.adapters.test_refresh import routes, sources
    from tuneplan.adapters.refresh import refresh
    from tuneplan.adapters.store import CatalogStore

    store = CatalogStore.open(sys.argv[1], seed=False)
    original = store.replace_source

    def stalling(offers):
        for index, offer in enumerate(offers):
            if index == 30:
                open(sys.argv[2], "w").write("half-way")  # tell the parent, then hang
                time.sleep(60)
            yield offer

    store.replace_source = lambda s, offers, at, **kw: original(s, stalling(offers), at, **kw)
    refresh(store, ["runpod"], client=routes(), available=sources())
""")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_refresh_killed_mid_write_leaves_the_database_identical(
        store: CatalogStore, tmp_path: Path) -> None:
    store.close()
    before = dump(store.path)
    marker = tmp_path / "half-way"
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", _KILLED_SCRIPT, str(store.path), str(marker)],
                             cwd=root, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [str(root), str(root / "src"), os.environ.get("PYTHONPATH", "")])})
    try:
        wait_until(lambda: marker.exists() or child.poll() is not None,
                   "the child reaching the middle of its write")
        assert marker.exists(), "the child ended before the middle of its write"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=HANG_GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    assert dump(store.path) == before
    reopened = CatalogStore.open(store.path, seed=False)
    assert {s.source: s.offers for s in reopened.status()}["runpod"] == 83
    reopened.close()


def test_a_live_skypilot_catalog_retires_the_bundled_snapshot_of_its_cloud(tmp_path: Path) -> None:
    # Without retiring, instance types dropped upstream would linger from the bundled snapshot.
    store = CatalogStore.open(tmp_path / "catalog.sqlite")  # seeded from the bundled snapshot
    seeded = {o.instance_type for o in store.offers() if o.source == "skypilot-snapshot/lambda"}
    assert "gpu_1x_a10" in seeded
    live_csv = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,"
                "GpuInfo,SpotPrice\n"
                "gpu_8x_h100_sxm5,H100,8,208,1800,23.92,us-east-1,,\n")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=live_csv)

    available = tuple(s for s in refresh_module.live_sources() if s.name == "skypilot/lambda")
    client = httpx.Client(transport=httpx.MockTransport(handler))
    (outcome,) = refresh(store, ["skypilot/lambda"], client=client, available=available)
    assert outcome.status == "ok", outcome.message
    lambda_offers = [o for o in store.offers() if o.provider == "Lambda"]
    assert {o.instance_type for o in lambda_offers} == {"gpu_8x_h100_sxm5"}
    assert "skypilot-snapshot/lambda" not in {s.source for s in store.status()}
    history = [p for p in store.history("A10") if p.source == "skypilot-snapshot/lambda"]
    assert history, "the retired snapshot stays as price history"
    store.close()


def test_sources_are_fetched_concurrently_and_reported_in_order(store: CatalogStore) -> None:
    # Each fetch waits until all three are running: a one-at-a-time refresh would break the
    # barrier (its timeout only stops a hung test) and every source would fail.
    barrier = threading.Barrier(3, timeout=HANG_GUARD_S)
    threads: set[str] = set()

    def meeting(source: LiveSource) -> LiveSource:
        def fetch(client: httpx.Client, **kwargs: Any) -> ImportResult:
            barrier.wait()
            threads.add(threading.current_thread().name)
            return source.fetch(client, **kwargs)
        return LiveSource(name=source.name, group=source.group, fetch=fetch)

    started: list[str] = []
    outcomes = refresh(store, client=routes(), available=tuple(map(meeting, sources())),
                       on_progress=lambda s, o: started.append(s.name) if o is None else None)
    assert [(o.source, o.status) for o in outcomes] == [
        ("runpod", "ok"), ("vastai", "ok"), ("azure", "ok")]
    assert len(threads) == 3 and sorted(started) == ["azure", "runpod", "vastai"]
    assert {s.source: s.snapshots for s in store.status()} == {
        "runpod": 2, "vastai": 2, "azure": 2}


def test_source_lists_split_on_commas_and_all_takes_every_source() -> None:
    assert [s.name for s in select_sources(["runpod,vastai", " azure "])] == [
        "runpod", "vastai", "azure"]
    everything = select_sources(["all"])
    # every source but "vastai": gpuhunt/vastai (opt-in, the same marketplace) replaces it
    assert {s.name for s in refresh_module.live_sources()} - {s.name for s in everything} == {
        "vastai"}
    assert "aws" in {s.name for s in everything}  # all includes the opt-in sources
    assert [s.name for s in select_sources(["gpuhunt"])] == [
        f"gpuhunt/{p}" for p in ("aws", "azure", "verda", "gcp", "lambdalabs", "nebius", "oci",
                                 "runpod", "cloudrift", "vastai", "vultr", "digitalocean")]
    with pytest.raises(InvalidValueError, match="empty source"):
        select_sources(["runpod,"])


def test_cache_goes_only_to_cacheable_sources(store: CatalogStore, tmp_path: Path) -> None:
    given: dict[str, object] = {}

    def recording(name: str, cacheable: bool) -> LiveSource:
        def fetch(client: httpx.Client, **kwargs: Any) -> ImportResult:
            given[name] = kwargs.get("cache")
            raise OSError("stop here")
        return LiveSource(name=name, group=name, fetch=fetch, cacheable=cacheable)

    cache = HttpCache(tmp_path / "http")
    refresh(store, client=routes(), cache=cache,
            available=(recording("public", True), recording("keyed", False)))
    assert given == {"public": cache, "keyed": None}
