"""dstack's gpuhunt published catalog: a zip with one CSV per provider, refreshed by dstack; no key.

Columns (v2): instance_name, location, price, cpu, memory, gpu_count, gpu_name, gpu_memory,
spot, disk_size, gpu_vendor, flags. ``price`` is USD/h for the whole instance; spot prices
are separate rows (``spot`` True) and are merged with the on-demand row of the same shape
into one offer. ``gpu_memory`` is GiB per GPU (gpuhunt rounds reported MiB to whole GiB) and
only picks a variant; CPU-only rows and TPU rows (vendor google) are not GPU offers.
"""

from __future__ import annotations

import csv
import io
import zipfile
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import partial
from pathlib import PurePosixPath
from typing import Any

import httpx

from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import FetchError, fetch_bytes, fetch_text
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
DEFAULT_URL = "https://dstack-gpu-pricing.s3.eu-west-1.amazonaws.com"
VERSION_PATH = "/v2/version"
CATALOG_PATH = "/v2/{version}/catalog.zip"
COLUMNS = ("instance_name", "location", "price", "cpu", "memory", "gpu_count", "gpu_name",
           "gpu_memory", "spot", "disk_size", "gpu_vendor")
# Rows that differ only in these are one offer (on-demand and spot rows merge; vendor is implied).
_SHAPE_COLUMNS = (*(c for c in COLUMNS if c not in ("price", "spot", "gpu_vendor")), "flags")
#: A catalog zip beyond this is not the published catalog (tens of MB); refuse to inflate it.
MAX_UNCOMPRESSED_BYTES = 1_000_000_000


@dataclass
class _Shape:
    row: dict[str, str]
    where: str
    prices: dict[bool, Decimal] = field(default_factory=dict)  # spot? -> lowest USD/h


def fetch(client: httpx.Client, *, base_url: str = DEFAULT_URL,
          fetched_at: datetime | None = None) -> ImportResult:
    """Read the latest version name, download that catalog zip, parse every CSV in it."""
    base = base_url.rstrip("/")
    version = fetch_text(client, base + VERSION_PATH).strip()
    if not version or "/" in version or len(version) > 64:
        raise FetchError(f"gpuhunt version {version[:40]!r} is not a version name")
    archive = fetch_bytes(client, "GET", base + CATALOG_PATH.format(version=version))
    return parse_gpuhunt_zip(archive, fetched_at or utc_now())


def parse_gpuhunt_zip(archive: bytes, fetched_at: datetime) -> ImportResult:
    """Offers from every ``<provider>.csv`` in a gpuhunt catalog zip."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as bundle:
            members = [m for m in bundle.infolist() if m.filename.endswith(".csv")]
            if sum(m.file_size for m in members) > MAX_UNCOMPRESSED_BYTES:
                raise PayloadError("gpuhunt zip inflates beyond 1 GB; refusing it")
            texts = {PurePosixPath(m.filename).stem: bundle.read(m).decode("utf-8-sig")
                     for m in members}
    except (zipfile.BadZipFile, UnicodeDecodeError, EOFError, OSError) as exc:
        raise PayloadError(f"gpuhunt catalog is not a readable zip of CSV files: {exc}") from exc
    if not texts:
        raise PayloadError("gpuhunt zip holds no CSV files")
    return merge_results(parse_gpuhunt_csv(text, provider, fetched_at)
                         for provider, text in sorted(texts.items()))


def parse_gpuhunt_csv(text: str, provider: str, fetched_at: datetime) -> ImportResult:
    """Offers from one provider's CSV (v1 or v2 columns); ``provider`` is its file stem."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise PayloadError(f"gpuhunt {provider}.csv lacks columns {missing}")
    collector = OfferCollector()
    shapes: dict[tuple[str, ...], _Shape] = {}
    try:
        for line, row in enumerate(reader, start=2):
            where = f"{provider}.csv line {line}"
            try:
                _merge(shapes, row, where)
            except RowRejected as exc:
                collector.reject(where, exc)
    except csv.Error as exc:
        raise PayloadError(f"gpuhunt {provider}.csv is malformed: {exc}") from exc
    name = normalise_provider_name(provider)
    for shape in shapes.values():
        collector.add(shape.where, partial(_offer, shape, name, fetched_at))
    return collector.result()


def _merge(shapes: dict[tuple[str, ...], _Shape], row: dict[str, Any], where: str) -> None:
    """File one row under its shape (everything but price and spot), keeping the lowest price."""
    if None in row or any(row.get(c) is None for c in COLUMNS):
        raise RowRejected("wrong number of fields")
    if str(row["gpu_count"]).strip() in ("", "0", "0.0") or row["gpu_vendor"] == "google":
        return  # CPU-only or TPU rows are not GPU offers
    spot = {"true": True, "false": False}.get(str(row["spot"]).strip().lower())
    if spot is None:
        raise RowRejected(f"spot {str(row['spot'])[:20]!r} is not True/False")
    price = require_price(row["price"], "price")
    key = tuple(str(row.get(c, "")) for c in _SHAPE_COLUMNS)
    shape = shapes.setdefault(key, _Shape(row=row, where=where))
    shape.prices[spot] = min(price, shape.prices.get(spot, price))


def _offer(shape: _Shape, provider: str, fetched_at: datetime) -> Offer:
    row = shape.row
    raw_gpu = read_name(row["gpu_name"], "gpu_name")
    memory_gib = read_number(row["gpu_memory"], "gpu_memory")
    gpu = normalise_gpu_name(raw_gpu, int(memory_gib * GiB) if memory_gib else None)
    ram_gib = read_number(row["memory"], "memory")
    disk_gb = read_number(row["disk_size"], "disk_size")
    flags = str(row.get("flags") or "").strip()
    instance = read_name(row["instance_name"], "instance_name")
    return Offer(
        provider=provider, instance_type=f"{instance} [{flags}]" if flags else instance,
        gpu=gpu, gpu_count=read_count(row["gpu_count"], "gpu_count"),
        gpu_memory_bytes=spec_memory_bytes(gpu), vcpus=read_number(row["cpu"], "cpu"),
        ram_bytes=None if ram_gib is None else int(ram_gib * GiB),
        disk_bytes=None if disk_gb is None else int(disk_gb * GB),
        region=read_name(row["location"] or "unknown", "location"),
        price_per_hour=shape.prices.get(False), spot_price_per_hour=shape.prices.get(True),
        fetched_at=fetched_at, source=SOURCE, notes=f"gpuhunt flags: {flags}" if flags else "",
    )
