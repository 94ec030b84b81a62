"""The SQLite catalog: seeding, atomic snapshots (even when killed), history, corrupt files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from tests.waiting import HANG_GUARD_S
from tuneplan.adapters.store import SCHEMA_VERSION, CatalogStore, default_path, load_catalog
from tuneplan.core.catalog.offers import Offer, OfferFilter, OfferSort
from tuneplan.errors import CatalogError
from tuneplan.units import GiB

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def offer(index: int, fetched_at: datetime = T0, price: str = "2.50") -> Offer:
    return Offer(provider="RunPod", instance_type=f"type-{index}", gpu="H100 PCIe", gpu_count=1,
                 gpu_memory_bytes=80 * GiB, vcpus=16.0, ram_bytes=128 * GiB, region="US",
                 price_per_hour=Decimal(price), fetched_at=fetched_at, source="test-source")


def dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as connection:
        return list(connection.iterdump())


@pytest.fixture
def empty(tmp_path: Path) -> Iterator[CatalogStore]:
    with CatalogStore.open(tmp_path / "c.sqlite", seed=False) as store:
        yield store


def test_default_path_follows_tuneplan_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.setenv("TUNEPLAN_HOME", str(tmp_path))
    assert default_path() == tmp_path / "catalog.sqlite"


def test_first_open_seeds_from_the_bundled_snapshot(tmp_path: Path) -> None:
    with CatalogStore.open(tmp_path / "seeded.sqlite") as store:
        statuses = store.status(now=datetime(2026, 12, 1, tzinfo=UTC))
        assert len(statuses) == 22
        assert sum(s.offers for s in statuses) == 5095
        assert {s.fetched_at for s in statuses} == {datetime(2026, 11, 30, tzinfo=UTC)}
        assert not any(s.stale for s in statuses)
        assert store.status(now=datetime(2026, 12, 8, tzinfo=UTC))[0].stale  # 8 days later
        h100 = store.offers(OfferFilter(gpu="H100"))
        assert len({o.provider for o in h100}) >= 8
    with sqlite3.connect(tmp_path / "seeded.sqlite") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_replace_source_keeps_history_and_serves_the_newest(empty: CatalogStore) -> None:
    empty.replace_source("test-source", [offer(1), offer(2)], T0)
    later = T0 + timedelta(days=3)
    empty.replace_source("test-source", [offer(1, later, "2.00")], later)
    current = empty.offers()
    assert [(o.instance_type, o.price_per_hour) for o in current] == [("type-1", Decimal("2.00"))]
    (status,) = empty.status(now=later)
    assert (status.offers, status.snapshots, status.age_s) == (1, 2, 0.0)
    points = empty.history("H100")
    assert [(p.fetched_at, p.min_price_per_gpu_hour, p.offers) for p in points] == [
        (T0, Decimal("2.50"), 2), (later, Decimal("2.00"), 1)]


def test_same_offer_from_two_sources_newest_wins(empty: CatalogStore) -> None:
    empty.replace_source("a", [offer(1)], T0)
    newer = replace(offer(1, T0 + timedelta(hours=1), "1.99"), source="b")
    empty.replace_source("b", [newer], newer.fetched_at)
    assert [o.source for o in empty.offers()] == ["b"]


def test_a_write_that_raises_half_way_changes_nothing(empty: CatalogStore) -> None:
    empty.replace_source("test-source", [offer(i) for i in range(5)], T0)
    before = dump(empty.path)

    def broken() -> Iterator[Offer]:
        for index in range(100):
            if index == 50:
                raise ConnectionError("network dropped")
            yield offer(index, T0 + timedelta(days=1), "9.99")

    with pytest.raises(ConnectionError):
        empty.replace_source("test-source", broken(), T0 + timedelta(days=1))
    assert dump(empty.path) == before
    with pytest.raises(CatalogError, match="not an Offer"):
        empty.replace_source("test-source", [offer(1), "junk"], T0)  # type: ignore[list-item]
    assert dump(empty.path) == before


def test_a_killed_writer_leaves_the_database_row_for_row_identical(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with CatalogStore.open(path, seed=False) as store:
        store.replace_source("test-source", [offer(i) for i in range(5)], T0)
    before = dump(path)
    script = textwrap.dedent(f"""
        import sys, time
        from tests.adapters.test_store import offer, T0
        from tuneplan.adapters.store import CatalogStore
        def rows():
            for i in range(10_000):
                if i == 500:
                    print("half", flush=True)
                    time.sleep(60)
                yield offer(i, T0, "7.77")
        CatalogStore.open({str(path)!r}, seed=False).replace_source("test-source", rows(), T0)
    """)
    root = Path(__file__).parents[2]
    child = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [str(root), str(root / "src"), os.environ.get("PYTHONPATH", "")])})
    assert child.stdout is not None and child.stdout.readline().strip() == "half"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=HANG_GUARD_S)
    assert dump(path) == before
    with CatalogStore.open(path, seed=False) as store:
        assert len(store.offers()) == 5


def test_naive_fetched_at_is_refused(empty: CatalogStore) -> None:
    with pytest.raises(CatalogError, match="timezone-aware"):
        empty.replace_source("x", [offer(1)], datetime(2026, 1, 1))


def test_a_corrupt_file_is_one_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 200)
    with pytest.raises(CatalogError) as info:
        CatalogStore.open(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA user_version=99")
    with pytest.raises(CatalogError, match="newer than this tuneplan"):
        CatalogStore.open(path)


@pytest.mark.parametrize(("column", "value"), [
    ("price_per_hour", "-3"), ("price_per_hour", "lots"), ("gpu", "H999"),
    ("gpu_count", "eight"), ("fetched_at", "yesterday"),
])
def test_hostile_rows_are_one_catalog_error(empty: CatalogStore, column: str,
                                            value: str) -> None:
    empty.replace_source("test-source", [offer(1)], T0)
    with sqlite3.connect(empty.path) as connection:
        connection.execute(f"UPDATE offers SET {column}=?", (value,))
    with pytest.raises(CatalogError) as info:
        empty.offers()
    assert "\n" not in str(info.value)


def test_sorted_query_over_the_seeded_catalog(tmp_path: Path) -> None:
    with CatalogStore.open(tmp_path / "s.sqlite") as store:
        found = store.offers(OfferFilter(min_gpu_memory_bytes=80 * 10**9, gpu_count=8),
                             sort=OfferSort.PRICE)
    prices = [o.price_per_hour for o in found if o.price_per_hour is not None]
    assert len(found) > 50 and prices == sorted(prices)
    assert all(o.gpu_count == 8 and o.gpu_memory_bytes >= 80 * 10**9 for o in found)


def test_load_catalog_reads_the_seeded_user_catalog() -> None:
    found = load_catalog(OfferFilter(gpu="B300"), sort=OfferSort.PRICE_PER_GPU)
    assert {o.gpu for o in found} == {"B300 (HGX)"}
    per_gpu = [o.price_per_gpu_hour for o in found if o.price_per_gpu_hour is not None]
    assert per_gpu == sorted(per_gpu) and len(per_gpu) >= 5


def test_one_offer_by_id_is_the_same_as_in_the_full_listing(tmp_path: Path) -> None:
    with CatalogStore.open(tmp_path / "catalog.sqlite") as store:
        listed = store.offers()
        wanted = listed[len(listed) // 2]
        assert store.offer(wanted.id) == wanted
        assert store.offer("no-such-offer") is None


# ---- the stamp, and queries in SQL ---------------------------------------------------------

def test_every_write_changes_the_stamp_and_reads_do_not(empty: CatalogStore) -> None:
    token, generation = empty.stamp()
    assert len(token) == 16 and generation == 0
    empty.offers()
    assert empty.stamp() == (token, 0)  # reading writes nothing
    seen = {empty.stamp()}
    empty.replace_source("a", [offer(1), offer(2)], T0)  # refresh and import write like this
    seen.add(empty.stamp())
    empty.replace_source("a", [offer(3)], T0 + timedelta(days=1))
    seen.add(empty.stamp())
    empty.remove_source("a")
    seen.add(empty.stamp())
    with sqlite3.connect(empty.path) as connection:  # even a write behind the store's back
        connection.execute("INSERT INTO snapshots(source, fetched_at, row_count, is_current) "
                           "VALUES ('x', '2026-01-01T00:00:00+00:00', 0, 0)")
    seen.add(empty.stamp())
    assert len(seen) == 5 and all(t == token for t, _ in seen)
    generations = sorted(g for _, g in seen)
    assert generations == sorted(set(generations)) and generations[0] == 0


def test_another_file_has_another_token(tmp_path: Path) -> None:
    with CatalogStore.open(tmp_path / "a.sqlite", seed=False) as a, \
            CatalogStore.open(tmp_path / "b.sqlite", seed=False) as b:
        assert a.stamp()[0] != b.stamp()[0] and a.stamp()[1] == b.stamp()[1] == 0


def _core_reference(store: CatalogStore, query: OfferFilter, sort: OfferSort) -> list[str]:
    """What the SQL must equal: every current row through the core's filter, the newest copy
    of each id among those passing, then the core's sort (ties by id, as the SQL's are)."""
    from tuneplan.adapters.store import _COLUMNS, _offer
    from tuneplan.core.catalog.offers import sort_offers

    rows = store.connection.execute(
        f"SELECT {','.join('o.' + c for c in _COLUMNS)} FROM offers o JOIN snapshots s ON "
        "s.id=o.snapshot_id WHERE s.is_current=1 ORDER BY s.id, o.rowid").fetchall()
    newest: dict[str, Offer] = {}
    for row in rows:
        found = _offer(row, store.path)
        kept = newest.get(found.id)
        if query.accepts(found) and (kept is None or found.fetched_at >= kept.fetched_at):
            newest[found.id] = found
    by_id = sorted(newest.values(), key=lambda o: o.id)
    return [o.id for o in sort_offers(by_id, sort, spot=query.spot)]


@pytest.mark.parametrize("query", [
    OfferFilter(), OfferFilter(gpu="H100"), OfferFilter(gpu="a100", gpu_count=8),
    OfferFilter(spot=True, max_price_per_hour=Decimal("3")),
    OfferFilter(max_price_per_hour=Decimal("2.45")),       # a price boundary, exactly
    OfferFilter(providers=("aws", "RunPod", "lambda labs")), OfferFilter(region="us-"),
    OfferFilter(region="EUROPE-WEST4-A", spot=True),        # a zone, another case
    OfferFilter(min_gpu_memory_bytes=80 * 10**9, providers=("gcp",)),
    OfferFilter(gpu="no such gpu"),
])
def test_sql_filtering_and_sorting_equal_the_core_rules(tmp_path: Path,
                                                        query: OfferFilter) -> None:
    with CatalogStore.open(tmp_path / "c.sqlite") as store:
        store.replace_source("dupes", [  # the same ids again, newer, one cheaper one dearer
            replace(o, fetched_at=datetime(2026, 12, 1, tzinfo=UTC), source="dupes",
                    price_per_hour=None if o.price_per_hour is None else
                    o.price_per_hour * Decimal("0.5" if i % 2 else "3"))
            for i, o in enumerate(store.offers(OfferFilter(gpu="H100"))[:40])],
            datetime(2026, 12, 1, tzinfo=UTC))
        for sort in OfferSort:
            assert [o.id for o in store.offers(query, sort=sort)] == \
                _core_reference(store, query, sort), sort


def test_pages_partition_the_sorted_list_and_count_it(tmp_path: Path) -> None:
    with CatalogStore.open(tmp_path / "c.sqlite") as store:
        whole = store.offers(OfferFilter(gpu="H100"), sort=OfferSort.PRICE_PER_GPU)
        pages = [store.offer_page(OfferFilter(gpu="H100"), sort=OfferSort.PRICE_PER_GPU,
                                  limit=97, offset=start) for start in range(0, 1000, 97)]
    assert [o.id for p in pages for o in p.offers] == [o.id for o in whole]
    assert {p.total for p in pages} == {len(whole)} and len(whole) > 300
    assert pages[-1].offers == []  # past the end: empty, still counted
