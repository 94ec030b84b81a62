"""Catalog use cases both faces share: find offers, GPU specs, providers, models, catalog
status, each with its JSON document (the CLI's ``--json`` is the web's ``/api/*``).

Filters arrive as the user typed them (strings, numbers); a bad one raises JobFlagError naming
the filter, so the CLI prints one line and the web answers 422 on that field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneplan.core.catalog.offers import Offer, OfferFilter, OfferSort, offer_record
from tuneplan.errors import BadInputError
from tuneplan.service.jobflags import JobFlagError
from tuneplan.units import parse_size, parse_usd

if TYPE_CHECKING:
    from tuneplan.adapters.store import SourceStatus

MAX_COUNT = 1_024  # GPUs per instance: no machine has more
MAX_GPU_MEMORY = 2**44  # bytes per GPU (16 TiB): a floor above it is a typo, and it fits SQLite


def _short_int(value: int) -> str:
    """At most 40 characters of an int (a 5,000-digit one is never converted whole)."""
    return str(value) if abs(value) < 10**40 else "a number of over 40 digits"


def offer_filter(*, gpu: str | None = None, min_gpu_memory: str | None = None,
                 count: int | None = None, provider: str | None = None,
                 region: str | None = None, spot: bool = False,
                 max_price: str | float | None = None) -> OfferFilter:
    """The core's filter from the filters of ``tuneplan offers`` (and ``/api/offers``)."""
    try:
        floor = parse_size(min_gpu_memory) if min_gpu_memory else None
    except BadInputError as exc:
        raise JobFlagError("min-gpu-memory", f"--min-gpu-memory: {exc}") from exc
    if floor is not None and floor > MAX_GPU_MEMORY:
        raise JobFlagError("min-gpu-memory", "--min-gpu-memory must be at most 16 TiB "
                           f"({MAX_GPU_MEMORY:,} bytes), got {(min_gpu_memory or '')[:40]}")
    if count is not None and not 1 <= count <= MAX_COUNT:
        raise JobFlagError("count", f"--count must be between 1 and {MAX_COUNT}, "
                                    f"got {_short_int(count)}")
    try:
        price = parse_usd(str(max_price)) if max_price is not None else None
    except BadInputError as exc:
        raise JobFlagError("max-price", f"--max-price: {exc}") from exc
    providers = tuple(p.strip() for p in (provider or "").split(",") if p.strip())
    return OfferFilter(gpu=gpu or None, min_gpu_memory_bytes=floor, gpu_count=count,
                       providers=providers, region=region or None, spot=spot,
                       max_price_per_hour=price)


@dataclass(frozen=True, slots=True)
class OfferSearch:
    offers: list[Offer]            # the matches, sorted (one page when a limit was given)
    statuses: list[SourceStatus]   # the catalog's sources and their ages
    total: int = 0                 # how many match in all
    stamp: tuple[str, int] = ("", 0)  # the catalog stamp the offers were read at


def find_offers(query: OfferFilter, sort: OfferSort = OfferSort.PRICE,
                store_path: str | Path | None = None, *, limit: int | None = None,
                offset: int = 0) -> OfferSearch:
    """Offers of the catalog matching ``query``, sorted, with the catalog's source ages: at
    most ``limit`` (all when None) after the first ``offset``, filtered and paged in SQL."""
    from tuneplan.adapters.store import CatalogStore

    with CatalogStore.open(store_path) as store:
        page = store.offer_page(query, sort=sort, limit=limit, offset=offset)
        return OfferSearch(offers=page.offers, statuses=store.status(), total=page.total,
                           stamp=page.stamp)


class CatalogWatch:
    """The catalog's stamp, read cheaply and often (a server checks it on every request).

    Keeps one connection open (thread-safe, under a lock) and reopens it when the file at
    ``store_path`` is replaced (deleted and rebuilt: another inode). A cache keyed on
    ``stamp()`` never serves a catalog older than the last committed write.
    """

    def __init__(self, store_path: str | Path | None = None) -> None:
        import threading

        self._path = store_path
        self._lock = threading.Lock()
        self._store: Any = None
        self._inode: tuple[int, int] | None = None

    @property
    def is_open(self) -> bool:
        """True once the file has been opened (the next ``stamp`` creates nothing)."""
        return self._store is not None

    def stamp(self) -> tuple[str, int]:
        """(token, generation) of the catalog now; raises CatalogError."""
        import os

        from tuneplan.adapters.store import CatalogStore

        with self._lock:
            if self._store is not None:
                try:
                    info = os.stat(self._store.path)
                    same = (info.st_dev, info.st_ino) == self._inode
                except OSError:
                    same = False
                if not same:
                    self._store.close()
                    self._store = None
            if self._store is None:
                store = CatalogStore.open(self._path, check_same_thread=False)
                info = os.stat(store.path)
                self._store, self._inode = store, (info.st_dev, info.st_ino)
            stamp: tuple[str, int] = self._store.stamp()
            return stamp

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def offers_document(offers: list[Offer]) -> list[dict[str, Any]]:
    """``tuneplan offers --json``."""
    return [offer_record(o) for o in offers]


def catalog_document(store_path: str | Path | None = None) -> dict[str, Any]:
    """``tuneplan catalog status --json``: per-source age, counts and the stale flag."""
    from tuneplan.adapters.store import STALE_AFTER_S, CatalogStore

    with CatalogStore.open(store_path) as store:
        statuses = store.status()
        path = store.path
    return {"path": str(path), "stale_after_days": STALE_AFTER_S // 86_400,
            "sources": [asdict(s) for s in statuses]}


def gpu_specs(min_memory: str | None = None) -> list[Any]:
    """Bundled GPU specs with at least ``min_memory`` per GPU."""
    from tuneplan.adapters.bundled import load_gpu_specs

    try:
        floor = parse_size(min_memory) if min_memory else 0
    except BadInputError as exc:
        raise JobFlagError("min-memory", f"--min-memory: {exc}") from exc
    return [s for s in load_gpu_specs() if s.memory_bytes >= floor]


def gpus_document(specs: list[Any]) -> list[dict[str, Any]]:
    """``tuneplan gpus --json``: every spec plus its driver total and usable (CUDA-visible)
    memory in bytes; ``driver_memory`` / ``usable_memory`` say basis, source, confidence."""
    return [asdict(s) | {"driver_memory_bytes": s.driver_memory_bytes,
                         "usable_memory_bytes": s.usable_memory_bytes} for s in specs]


def models_document() -> list[dict[str, Any]]:
    """``tuneplan models --json``: the bundled registry with exact parameter counts."""
    from tuneplan.adapters.hub import list_bundled_models

    return list_bundled_models()


def providers() -> list[Any]:
    from tuneplan.adapters.bundled import load_providers

    return list(load_providers())


def providers_document(found: list[Any]) -> list[dict[str, Any]]:
    """``tuneplan providers --json``."""
    return [asdict(p) for p in found]
