"""A user's own prices (negotiated, reserved, on-prem) from a CSV file -> offers.

Columns (header row, any order): ``provider, gpu, gpu_count, region`` and at least one of
``price_per_hour`` / ``spot_price_per_hour`` (USD per hour for the whole instance) are
required; ``instance_type, zone, vcpus, ram, disk, interconnect, gpu_memory, notes`` are
optional (sizes with their unit: ``512GiB``, ``80GB``). Pure parsing of text already read.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime
from functools import partial

from tuneplan.adapters.importers.base import ImportResult
from tuneplan.adapters.importers.validation import (
    MAX_NOTES_CHARS,
    OfferCollector,
    RowRejected,
    read_count,
    read_name,
    read_number,
    read_price,
    read_text,
    spec_memory_bytes,
)
from tuneplan.core.catalog.offers import Offer, normalise_gpu_name, normalise_provider_name
from tuneplan.errors import InvalidValueError
from tuneplan.units import parse_size

REQUIRED_COLUMNS = ("provider", "gpu", "gpu_count", "region")
OPTIONAL_COLUMNS = ("instance_type", "zone", "vcpus", "ram", "disk", "interconnect",
                    "gpu_memory", "notes", "price_per_hour", "spot_price_per_hour")
MAX_ROWS = 100_000
#: Largest CSV accepted (characters of text; ``catalog import`` checks the file's bytes too).
MAX_FILE_CHARS = 50_000_000


def parse_user_csv(text: str, source: str, fetched_at: datetime) -> ImportResult:
    """Offers from a user's CSV; rows that fail go to ``rejected_rows`` as ``"line N: why"``.

    Raises InvalidValueError when the header lacks a required column or names an unknown one.
    """
    if len(text) > MAX_FILE_CHARS:
        raise InvalidValueError(f"{source}: {len(text):,} characters, more than "
                                f"{MAX_FILE_CHARS:,}")
    reader = csv.DictReader(io.StringIO(text))
    try:
        header = [name.strip() for name in (reader.fieldnames or ())]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        unknown = [c[:40] for c in header if c not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
        if missing or unknown or not {"price_per_hour", "spot_price_per_hour"} & set(header):
            raise InvalidValueError(
                f"{source}: header must have {', '.join(REQUIRED_COLUMNS)} and price_per_hour "
                f"and/or spot_price_per_hour (missing {missing or 'none'}, "
                f"unknown {unknown[:10] or 'none'})")
        reader.fieldnames = header
        collector = OfferCollector()
        for index, row in enumerate(reader):
            if index >= MAX_ROWS:
                raise InvalidValueError(f"{source}: more than {MAX_ROWS} rows")
            collector.add(f"line {reader.line_num}", partial(_offer, row, source, fetched_at))
    except csv.Error as exc:  # a field over csv.field_size_limit(), a NUL in old Pythons, ...
        raise InvalidValueError(f"{source}: line {reader.line_num}: not readable CSV "
                                f"({exc})") from exc
    return collector.result()


def _size(row: dict[str, str | None], column: str) -> int | None:
    text = (row.get(column) or "").strip()
    if not text:
        return None
    if len(text) > 40:
        raise RowRejected(f"{column} is {len(text)} characters, longer than a size")
    try:
        return parse_size(text)
    except InvalidValueError as exc:
        raise RowRejected(f"{column}: {exc}") from exc


def _offer(row: dict[str, str | None], source: str, fetched_at: datetime) -> Offer:
    if None in row.values() or None in row:
        raise RowRejected("wrong number of fields")
    gpu = normalise_gpu_name(read_name(row.get("gpu"), "gpu"), _size(row, "gpu_memory"))
    return Offer(
        provider=normalise_provider_name(read_name(row.get("provider"), "provider")),
        instance_type=read_text(row.get("instance_type"), "instance_type"),
        gpu=gpu, gpu_count=read_count(row.get("gpu_count"), "gpu_count"),
        gpu_memory_bytes=spec_memory_bytes(gpu),
        vcpus=read_number(row.get("vcpus"), "vcpus"), ram_bytes=_size(row, "ram"),
        disk_bytes=_size(row, "disk"), region=read_name(row.get("region"), "region"),
        zone=read_text(row.get("zone"), "zone") or None,
        price_per_hour=read_price(row.get("price_per_hour"), "price_per_hour"),
        spot_price_per_hour=read_price(row.get("spot_price_per_hour"), "spot_price_per_hour"),
        interconnect=read_text(row.get("interconnect"), "interconnect") or None,
        fetched_at=fetched_at, source=source,
        notes=read_text(row.get("notes"), "notes", max_chars=MAX_NOTES_CHARS),
    )
