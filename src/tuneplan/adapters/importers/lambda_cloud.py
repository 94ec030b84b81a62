"""Lambda Cloud instance types and prices (``GET /api/v1/instance-types``); needs a key.

The key comes from ``LAMBDA_API_KEY``; without it the source is skipped with a message.
``price_cents_per_hour`` is integer US cents per hour for the whole instance (110 = 1.10
USD/h); on-demand only. GPU name, count and memory come from the description
("8x H100 (80 GB SXM5)"). One offer per region with capacity at fetch time, else one offer
with region "unlisted".
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any

import httpx

from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import api_key, fetch_json
from tuneplan.adapters.importers.validation import (
    OfferCollector,
    PayloadError,
    RowRejected,
    read_name,
    read_number,
    require_price,
    spec_memory_bytes,
)
from tuneplan.core.catalog.offers import Offer, normalise_gpu_name
from tuneplan.errors import UnknownGpuError
from tuneplan.units import GiB

SOURCE = "lambda"
PROVIDER = "Lambda"
DEFAULT_URL = "https://cloud.lambdalabs.com"
PATH = "/api/v1/instance-types"
KEY_ENV = "LAMBDA_API_KEY"
_DESCRIPTION = re.compile(r"^(\d+)x (.+?) \((\d+(?:\.\d+)?) GB(?: ([\w-]+))?\)$")


def fetch(client: httpx.Client, *, base_url: str = DEFAULT_URL,
          fetched_at: datetime | None = None) -> ImportResult:
    """GET the instance types with the key from LAMBDA_API_KEY (SourceSkipped without it)."""
    key = api_key(KEY_ENV, SOURCE)
    payload = fetch_json(client, "GET", base_url.rstrip("/") + PATH, auth=(key, ""))
    return parse_lambda_instance_types(payload, fetched_at or utc_now())


def parse_lambda_instance_types(payload: Any, fetched_at: datetime) -> ImportResult:
    """Offers from ``{"data": {name: {instance_type, regions_with_capacity_available}}}``."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, dict):
        raise PayloadError("Lambda payload has no data object")
    collector = OfferCollector()
    for name, entry in data.items():
        for offer_region in _regions(entry):
            collector.add(f"{str(name)[:60]} {offer_region}",
                          partial(_offer, entry, offer_region, fetched_at))
    return collector.result()


def _regions(entry: Any) -> list[str]:
    regions = entry.get("regions_with_capacity_available") if isinstance(entry, dict) else None
    names = [r.get("name") for r in regions or [] if isinstance(r, dict)]
    return [str(n) for n in names if n] or ["unlisted"]


def _offer(entry: Any, region: str, fetched_at: datetime) -> Offer | None:
    kind = entry.get("instance_type") if isinstance(entry, dict) else None
    if not isinstance(kind, dict):
        raise RowRejected("entry has no instance_type object")
    match = _DESCRIPTION.match(str(kind.get("description", "")))
    if match is None:
        return None  # CPU-only types have no "Nx GPU (M GB)" description
    count, name, memory_gb, form = int(match[1]), match[2], float(match[3]), match[4]
    gpu = _gpu(name, form, int(memory_gb * GiB))
    cents = require_price(kind.get("price_cents_per_hour"), "price_cents_per_hour")
    specs: dict[str, Any] = kind["specs"] if isinstance(kind.get("specs"), dict) else {}
    ram_gib = read_number(specs.get("memory_gib"), "memory_gib")
    disk_gib = read_number(specs.get("storage_gib"), "storage_gib")
    return Offer(
        provider=PROVIDER, instance_type=read_name(kind.get("name"), "name"), gpu=gpu,
        gpu_count=count, gpu_memory_bytes=spec_memory_bytes(gpu),
        vcpus=read_number(specs.get("vcpus"), "vcpus"),
        ram_bytes=None if ram_gib is None else int(ram_gib * GiB),
        disk_bytes=None if disk_gib is None else int(disk_gib * GiB),
        region=read_name(region, "region"), price_per_hour=cents / Decimal(100),
        fetched_at=fetched_at, source=SOURCE,
        notes="" if region != "unlisted" else "no region had capacity at fetch time",
    )


def _gpu(name: str, form: str | None, hint_bytes: int) -> str:
    """Try "A100 PCIe" before "A100", so a form factor in the description picks the variant."""
    for candidate in ([f"{name} {form}", name] if form else [name]):
        try:
            return normalise_gpu_name(candidate, hint_bytes)
        except UnknownGpuError:
            continue
    raise UnknownGpuError(f"unknown Lambda GPU {name!r}", raw=name)
