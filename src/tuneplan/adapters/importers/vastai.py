"""vast.ai marketplace offers from its public bundles search API; no key needed.

Each offer is one host's GPUs. ``dph_total`` (USD/h for the whole offer, including the
default disk's storage) is the on-demand price; ``min_bid`` (USD/h, whole offer) is the least
an interruptible rental can bid, used as the spot price. ``gpu_ram`` is MiB as nvidia-smi
reports it (24,564 for a 24 GiB card) and only picks a GPU variant; ``cpu_ram`` is MB.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

import httpx

from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import fetch_json
from tuneplan.adapters.importers.validation import (
    OfferCollector,
    PayloadError,
    RowRejected,
    read_count,
    read_name,
    read_number,
    read_price,
    require_price,
    spec_memory_bytes,
)
from tuneplan.core.catalog.offers import Offer, normalise_gpu_name
from tuneplan.units import GB, MB, MiB

SOURCE = "vastai"
PROVIDER = "Vast.ai"
DEFAULT_URL = "https://console.vast.ai/api/v0/bundles/"
#: Rentable, not rented, best-scored first; vast.ai caps one search page.
QUERY: dict[str, Any] = {
    "rentable": {"eq": True}, "rented": {"eq": False}, "order": [["score", "desc"]],
    "limit": 3000,
}


def fetch(client: httpx.Client, *, base_url: str = DEFAULT_URL,
          fetched_at: datetime | None = None) -> ImportResult:
    """POST one search (vast.ai returns every matching offer in one page) and parse it."""
    payload = fetch_json(client, "POST", base_url, json=QUERY)
    return parse_vastai_offers(payload, fetched_at or utc_now())


def parse_vastai_offers(payload: Any, fetched_at: datetime) -> ImportResult:
    """Offers from ``{"offers": [...]}`` (REST API) or the bare list (CLI ``--raw``)."""
    offers = payload.get("offers") if isinstance(payload, dict) else payload
    if not isinstance(offers, list):
        raise PayloadError("vast.ai payload has no offers list")
    collector = OfferCollector()
    for index, item in enumerate(offers):
        collector.add(f"offers[{index}]", partial(_offer, item, fetched_at))
    return collector.result()


def _offer(item: Any, fetched_at: datetime) -> Offer:
    if not isinstance(item, dict):
        raise RowRejected(f"offer is {type(item).__name__}, expected an object")
    count = read_count(item.get("num_gpus"), "num_gpus")
    raw_gpu = read_name(item.get("gpu_name"), "gpu_name")
    gpu_ram_mib = read_number(item.get("gpu_ram"), "gpu_ram")
    gpu = normalise_gpu_name(raw_gpu, int(gpu_ram_mib * MiB) if gpu_ram_mib else None)
    price = require_price(item.get("dph_total"), "dph_total")
    offer_id = read_name(item.get("id"), "id")
    disk_gb = read_number(item.get("disk_space"), "disk_space")
    return Offer(
        provider=PROVIDER, instance_type=f"{count}x {raw_gpu} #{offer_id}", gpu=gpu,
        gpu_count=count, gpu_memory_bytes=spec_memory_bytes(gpu),
        vcpus=read_number(item.get("cpu_cores_effective"), "cpu_cores_effective"),
        ram_bytes=_ram_share_bytes(item),
        disk_bytes=None if disk_gb is None else int(disk_gb * GB),
        region=read_name(item.get("geolocation") or "unknown", "geolocation"),
        price_per_hour=price, spot_price_per_hour=read_price(item.get("min_bid"), "min_bid"),
        fetched_at=fetched_at, source=SOURCE,
        notes="price includes the default disk; spot = minimum bid for an interruptible rental",
    )


def _ram_share_bytes(item: dict[str, Any]) -> int | None:
    """Host RAM in bytes that comes with the offer: cpu_ram (MB) x effective / total cores."""
    ram_mb = read_number(item.get("cpu_ram"), "cpu_ram")
    cores = read_number(item.get("cpu_cores"), "cpu_cores")
    effective = read_number(item.get("cpu_cores_effective"), "cpu_cores_effective")
    if ram_mb is None:
        return None
    share = effective / cores if cores and effective is not None else 1.0
    return int(ram_mb * MB * min(share, 1.0))
