"""dstack's gpuhunt catalog, read with the gpuhunt library itself (extra ``tuneplan[catalog]``).

gpuhunt 0.1.34 publishes every offline provider on its own (``gpuhunt/_internal/catalog.py``:
``CATALOG_URL`` ends in ``/v3``; ``<base>/<provider>/version`` names the latest version and
``<base>/<provider>/<version>/catalog.zip`` holds ``<provider>.csv``). The download is ours
(``network.fetch_bytes``: timeouts, retries, conditional requests, local replay in tests);
reading the CSV and querying it is gpuhunt's: the file goes into a directory named by
``GPUHUNT_CATALOG_DIR``, the variable gpuhunt's ``Catalog`` reads offline providers from, and
``Catalog.query`` returns its ``CatalogItem`` objects, which become offers here.

Units (gpuhunt ``CatalogItem``): ``price`` USD/h for the whole instance; spot prices are
separate items (``spot`` True) and merge with the on-demand item of the same shape into one
offer; ``memory`` and ``gpu_memory`` GiB (gpuhunt rounds reported MiB to whole GiB; the GPU's
only picks a variant), ``disk_size`` GB. CPU-only and TPU (vendor google) items are not GPU
offers. Rows gpuhunt's reader skips as malformed are counted as rejected rows.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import os
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import (
    FetchError,
    HttpCache,
    SourceSkipped,
    fetch_bytes,
    fetch_text,
)
from tuneplan.adapters.importers.validation import (
    OfferCollector,
    PayloadError,
    RowRejected,
    merge_results,
    read_count,
    read_name,
    read_number,
    require_price,
    spec_memory_bytes,
)
from tuneplan.core.catalog.offers import Offer, normalise_gpu_name, normalise_provider_name
from tuneplan.units import GB, GiB

SOURCE = "gpuhunt"
#: gpuhunt 0.1.34 ``CATALOG_URL``.
DEFAULT_URL = "https://dstack-gpu-pricing.s3.eu-west-1.amazonaws.com/v3"
#: gpuhunt 0.1.34 ``OFFLINE_PROVIDERS``: the providers it serves from its published catalog
#: (the online ones query each cloud's API live, most with a key, and are not imported here).
PROVIDERS = ("aws", "azure", "verda", "gcp", "lambdalabs", "nebius", "oci", "runpod",
             "cloudrift")
#: Columns gpuhunt 0.1.34 ``storage.item_from_row`` requires (the v2 CSV layout it reads).
REQUIRED_COLUMNS = ("instance_name", "location", "price", "cpu", "memory", "gpu_count", "spot")
#: A catalog zip beyond this is not the published catalog (tens of MB); refuse to inflate it.
MAX_UNCOMPRESSED_BYTES = 1_000_000_000
_CATALOG_DIR_ENV = "GPUHUNT_CATALOG_DIR"
_STORAGE_LOGGER = "gpuhunt._internal.storage"
#: ``GPUHUNT_CATALOG_DIR`` is process-wide: one gpuhunt read at a time (refresh is threaded).
_READ_LOCK = threading.Lock()


def source_name(provider: str) -> str:
    """Store source of one gpuhunt provider's catalog: ``gpuhunt/<provider>``."""
    return f"{SOURCE}/{provider}"


@dataclass
class _Shape:
    item: Any  # gpuhunt.CatalogItem of the first row of this shape
    where: str
    prices: dict[bool, Decimal] = field(default_factory=dict)  # spot? -> lowest USD/h


def fetch(client: httpx.Client, *, provider: str, base_url: str = DEFAULT_URL,
          cache: HttpCache | None = None, fetched_at: datetime | None = None) -> ImportResult:
    """Read ``provider``'s latest version name, download that catalog zip, read it with gpuhunt.

    SourceSkipped when the gpuhunt library (extra ``tuneplan[catalog]``) is not installed.
    """
    require_library()
    base = base_url.rstrip("/")
    version = fetch_text(client, f"{base}/{provider}/version", cache=cache).strip()
    if not version or "/" in version or len(version) > 64 or not version.isprintable():
        raise FetchError(f"gpuhunt {provider} version {version[:40]!r} is not a version name")
    archive = fetch_bytes(client, "GET", f"{base}/{provider}/{version}/catalog.zip", cache=cache)
    return parse_gpuhunt_catalog({provider: provider_csv(archive, provider)},
                                 fetched_at or utc_now())


def require_library() -> None:
    """SourceSkipped unless the gpuhunt library (extra ``tuneplan[catalog]``) is installed."""
    try:
        import gpuhunt  # noqa: F401
    except ImportError as exc:
        raise SourceSkipped("gpuhunt: skipped, install tuneplan[catalog] (the gpuhunt "
                            "library) to include it") from exc


def provider_csv(archive: bytes, provider: str) -> str:
    """The ``<provider>.csv`` of one provider's catalog zip (what gpuhunt's loader opens)."""
    name = f"{provider}.csv"
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as bundle:
            member = bundle.getinfo(name)
            if member.file_size > MAX_UNCOMPRESSED_BYTES:
                raise PayloadError(f"gpuhunt {name} inflates beyond 1 GB; refusing it")
            return bundle.read(member).decode("utf-8-sig")
    except KeyError as exc:
        raise PayloadError(f"gpuhunt catalog zip of {provider} holds no {name}") from exc
    except (zipfile.BadZipFile, UnicodeDecodeError, EOFError, OSError) as exc:
        raise PayloadError(f"gpuhunt catalog of {provider} is not a readable zip: {exc}") from exc


def parse_gpuhunt_catalog(texts: Mapping[str, str], fetched_at: datetime) -> ImportResult:
    """Offers from provider CSVs (``{"aws": text}``), read and queried by gpuhunt's Catalog."""
    unknown = sorted(p for p in texts if p not in PROVIDERS)
    if unknown:
        raise PayloadError(f"gpuhunt serves no offline provider {unknown[0]!r}")
    for provider, text in texts.items():
        _check_header(text, provider)
    items, skipped = _query(texts)
    return merge_results(items_to_offers(provider, [i for i in items if i.provider == provider],
                                 skipped.get(provider, []), fetched_at)
                         for provider in sorted(texts))


def _check_header(text: str, provider: str) -> None:
    try:
        header = next(csv.reader(io.StringIO(text)), [])
    except csv.Error as exc:
        raise PayloadError(f"gpuhunt {provider}.csv is malformed: {exc}") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise PayloadError(f"gpuhunt {provider}.csv lacks columns {missing}")


class _SkippedRows(logging.Handler):
    """Collects the rows gpuhunt's reader skips (it logs one warning per malformed row)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.rows: dict[str, list[tuple[str, str]]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) == 3:  # "Skipping malformed row in %s catalog at line %s: %s"
            provider, line, reason = (str(a) for a in args)
            self.rows.setdefault(provider, []).append((f"{provider}.csv line {line}", reason))
        else:
            self.rows.setdefault("", []).append(("gpuhunt", record.getMessage()[:200]))


def _query(texts: Mapping[str, str]) -> tuple[list[Any], dict[str, list[tuple[str, str]]]]:
    """gpuhunt ``Catalog.query`` over ``texts`` written to a temporary catalog directory."""
    import gpuhunt

    with tempfile.TemporaryDirectory(prefix="tuneplan-gpuhunt-") as directory:
        for provider, text in texts.items():
            Path(directory, f"{provider}.csv").write_text(text, encoding="utf-8")
        with _READ_LOCK, _catalog_dir(directory), _captured() as skipped:
            catalog = gpuhunt.Catalog(balance_resources=False, auto_reload=False)
            try:
                items = catalog.query(provider=sorted(texts))
            except csv.Error as exc:
                raise PayloadError(f"gpuhunt catalog CSV is malformed: {exc}") from exc
    return list(items), skipped.rows


@contextlib.contextmanager
def _catalog_dir(directory: str) -> Iterator[None]:
    before = os.environ.get(_CATALOG_DIR_ENV)
    os.environ[_CATALOG_DIR_ENV] = directory
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_CATALOG_DIR_ENV, None)
        else:
            os.environ[_CATALOG_DIR_ENV] = before


@contextlib.contextmanager
def _captured() -> Iterator[_SkippedRows]:
    """Route gpuhunt's skipped-row warnings here, not to the terminal."""
    logger = logging.getLogger(_STORAGE_LOGGER)
    handler, propagate = _SkippedRows(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def items_to_offers(provider: str, items: list[Any], skipped: list[tuple[str, str]],
                    fetched_at: datetime) -> ImportResult:
    """Offers of source ``gpuhunt/<provider>`` from gpuhunt ``CatalogItem`` objects (offline
    catalog or online provider alike); ``skipped`` are (where, why) of rows gpuhunt dropped."""
    collector = OfferCollector()
    for where, reason in skipped:
        collector.reject(where, reason)
    shapes: dict[tuple[Any, ...], _Shape] = {}
    for index, item in enumerate(items):
        where = f"{provider}.csv item {index + 1}"
        try:
            _merge(shapes, item, where)
        except RowRejected as exc:
            collector.reject(where, exc)
    name = normalise_provider_name(provider)
    for shape in shapes.values():
        collector.add(shape.where, partial(_offer, shape, name, source_name(provider),
                                           fetched_at))
    return collector.result()


def _merge(shapes: dict[tuple[Any, ...], _Shape], item: Any, where: str) -> None:
    """File one item under its shape (everything but price and spot), keeping the lowest price."""
    vendor = getattr(item.gpu_vendor, "value", item.gpu_vendor)
    if not item.gpu_count or vendor == "google":
        return  # CPU-only or TPU items are not GPU offers
    price = require_price(item.price, "price")
    key = (item.instance_name, item.location, item.cpu, item.memory, item.gpu_count,
           item.gpu_name, item.gpu_memory, item.disk_size, tuple(item.flags),
           getattr(item.cpu_arch, "value", item.cpu_arch))
    shape = shapes.setdefault(key, _Shape(item=item, where=where))
    spot = bool(item.spot)
    shape.prices[spot] = min(price, shape.prices.get(spot, price))


def _offer(shape: _Shape, provider: str, source: str, fetched_at: datetime) -> Offer:
    item = shape.item
    raw_gpu = read_name(item.gpu_name, "gpu_name")
    memory_gib = read_number(item.gpu_memory, "gpu_memory")
    gpu = normalise_gpu_name(raw_gpu, int(memory_gib * GiB) if memory_gib else None)
    ram_gib = read_number(item.memory, "memory")
    disk_gb = read_number(item.disk_size, "disk_size")
    flags = " ".join(str(f) for f in item.flags)
    instance = read_name(item.instance_name, "instance_name")
    arch = str(getattr(item.cpu_arch, "value", item.cpu_arch) or "")
    notes = [f"gpuhunt flags: {flags}" if flags else "",
             f"CPU architecture: {arch}" if arch and arch != "x86" else ""]
    return Offer(
        provider=provider, instance_type=f"{instance} [{flags}]" if flags else instance,
        gpu=gpu, gpu_count=read_count(item.gpu_count, "gpu_count"),
        gpu_memory_bytes=spec_memory_bytes(gpu), vcpus=read_number(item.cpu, "cpu"),
        ram_bytes=None if ram_gib is None else int(ram_gib * GiB),
        disk_bytes=None if disk_gb is None else int(disk_gb * GB),
        region=read_name(item.location or "unknown", "location"),
        price_per_hour=shape.prices.get(False), spot_price_per_hour=shape.prices.get(True),
        fetched_at=fetched_at, source=source, notes="; ".join(n for n in notes if n),
    )
