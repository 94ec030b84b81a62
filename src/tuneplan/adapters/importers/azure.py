"""Azure VM prices from the public Retail Prices API (paginated by ``NextPageLink``); no key.

Only pay-as-you-go Linux prices become offers: ``type`` Consumption, not Windows, not Low
Priority; a ``... Spot`` meter is the spot price of the same size and region. Reservation
items (``retailPrice`` = the total for a 1- or 3-year term) and DevTest prices are skipped.
The API does not name GPUs, so ``_SKU_GPUS`` maps VM sizes to GPU x count (from Azure's size
docs); an N-series size missing there is reported as unknown, a fractional GPU is rejected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any

import httpx

from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import MAX_PAGES, FetchError, HttpCache, fetch_json
from tuneplan.adapters.importers.validation import (
    OfferCollector,
    PayloadError,
    RowRejected,
    read_name,
    require_price,
    spec_memory_bytes,
)
from tuneplan.core.catalog.offers import Offer
from tuneplan.errors import UnknownGpuError

SOURCE = "azure"
PROVIDER = "Azure"
DEFAULT_URL = "https://prices.azure.com/api/retail/prices"
API_VERSION = "2023-01-01-preview"
#: Server-side filter: VM meters of N-series sizes (all GPU sizes start Standard_N).
FILTER = ("serviceName eq 'Virtual Machines' and priceType eq 'Consumption' "
          "and contains(armSkuName, 'Standard_N')")

# (size pattern without "Standard_", canonical GPU, GPUs per size from the leading vCPU number).
# A count below 1 is a fractional (partitioned) GPU, which an Offer cannot represent.
_SKU_GPUS: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"NC(\d+)ads_A100_v4", "A100 80GB PCIe", {"24": 1, "48": 2, "96": 4}),
    (r"ND(\d+)asr_v4", "A100 40GB SXM4", {"96": 8}),
    (r"ND(\d+)amsr_A100_v4", "A100 80GB SXM4", {"96": 8}),
    (r"NCC?(\d+)adi?s_H100_v5", "H100 NVL", {"40": 1, "80": 2}),
    (r"ND(\d+)isr_H100_v5", "H100 SXM5", {"96": 8}),
    (r"ND(\d+)isr_H200_v5", "H200 SXM", {"96": 8}),
    (r"ND(\d+)isr_MI300X_v5", "MI300X", {"96": 8}),
    (r"ND(\d+)isr_NDR_GB200_v6", "GB200 (per Blackwell GPU)", {"128": 4}),
    (r"NC(\d+)as_T4_v3", "T4", {"4": 1, "8": 1, "16": 1, "64": 4}),
    (r"NC(\d+)r?s_v3", "V100 PCIe 16GB", {"6": 1, "12": 2, "24": 4}),
    (r"ND(\d+)rs_v2", "V100 SXM2 32GB", {"40": 8}),
    (r"NC(\d+)ads_A10_v4", "A10", {"8": 1 / 3, "16": 2 / 3, "32": 1}),
    (r"NV(\d+)adm?s_A10_v5", "A10", {"6": 1 / 6, "12": 1 / 3, "18": 1 / 2, "36": 1, "72": 2}),
    (r"NV(\d+)as_v4", "Radeon Instinct MI25", {"4": 1 / 8, "8": 1 / 4, "16": 1 / 2, "32": 1}),
    # Retired sizes still priced in some regions (K80 / M60 boards, two GPUs per board).
    (r"NC(\d+)r?(?:_Promo)?", "K80", {"6": 1, "12": 2, "24": 4}),
    (r"NV(\d+)(?:_Promo)?", "M60", {"6": 1, "12": 2, "24": 4}),
    (r"NV(\d+)s_v3", "M60", {"12": 1, "24": 2, "48": 4}),
)
_SKU_RES = tuple((re.compile(rf"^Standard_{p}$"), gpu, counts) for p, gpu, counts in _SKU_GPUS)


@dataclass(frozen=True, slots=True)
class _Key:
    sku: str
    region: str


def fetch(client: httpx.Client, *, base_url: str = DEFAULT_URL,
          cache: HttpCache | None = None, fetched_at: datetime | None = None) -> ImportResult:
    """GET every page (following ``NextPageLink``) into memory, then parse them all at once."""
    items: list[Any] = []
    url: str | None = base_url
    params: dict[str, str] | None = {"api-version": API_VERSION, "$filter": FILTER}
    for _ in range(MAX_PAGES):
        if url is None:
            return parse_azure_prices({"Items": items}, fetched_at or utc_now())
        page = fetch_json(client, "GET", url, params=params, cache=cache)
        if not isinstance(page, dict) or not isinstance(page.get("Items"), list):
            raise PayloadError(f"Azure page {_page_name(url)} has no Items list")
        items.extend(page["Items"])
        url, params = _next_link(page), None  # the link carries the query already
    raise FetchError(f"Azure prices: more than {MAX_PAGES} pages, stopped")


def _next_link(page: dict[str, Any]) -> str | None:
    link = page.get("NextPageLink")
    if link is None or link == "":
        return None
    if not isinstance(link, str) or not link.startswith(("http://", "https://")):
        raise PayloadError(f"Azure NextPageLink {str(link)[:60]!r} is not a URL")
    return link


def _page_name(url: str) -> str:
    match = re.search(r"\$skip=(\d+)", url)
    return f"skip={match.group(1)}" if match else "1"


def parse_azure_prices(payload: Any, fetched_at: datetime) -> ImportResult:
    """Offers from Retail Prices items: an envelope ``{"Items": [...]}`` or the item list.

    One offer per (VM size, region): on-demand = the Consumption meter, spot = the ``Spot``
    meter; ``retailPrice`` is USD per hour for the whole VM (``unitOfMeasure`` "1 Hour").
    """
    items = payload.get("Items") if isinstance(payload, dict) else payload
    if not isinstance(items, list):
        raise PayloadError("Azure payload has no Items list")
    prices: dict[_Key, dict[str, Decimal]] = {}
    collector = OfferCollector()
    for index, item in enumerate(items):
        try:
            picked = _price_of(item)
        except RowRejected as exc:
            collector.reject(f"Items[{index}]", exc)
            continue
        if picked is not None:
            key, kind, price = picked
            prices.setdefault(key, {})[kind] = price
    for key, kinds in prices.items():
        collector.add(f"{key.sku} {key.region}", partial(_offer, key, kinds, fetched_at))
    return collector.result()


def _price_of(item: Any) -> tuple[_Key, str, Decimal] | None:
    """(size, region), "on_demand"/"spot" and the hourly price; None for items not wanted."""
    if not isinstance(item, dict):
        raise RowRejected(f"item is {type(item).__name__}, expected an object")
    meter = f"{item.get('meterName', '')} {item.get('skuName', '')}"
    product = str(item.get("productName", ""))
    if (item.get("type") != "Consumption" or "Low Priority" in meter
            or product.endswith("Windows") or "Dedicated Host" in product):
        return None
    if item.get("unitOfMeasure") != "1 Hour":
        raise RowRejected(f"unitOfMeasure {str(item.get('unitOfMeasure'))[:30]!r} is not 1 Hour")
    if item.get("currencyCode", "USD") != "USD":
        raise RowRejected(f"currency {str(item.get('currencyCode'))[:10]!r} is not USD")
    sku = read_name(item.get("armSkuName"), "armSkuName")
    region = read_name(item.get("armRegionName"), "armRegionName")
    price = require_price(item.get("retailPrice"), "retailPrice")
    return _Key(sku, region), "spot" if meter.rstrip().endswith("Spot") else "on_demand", price


def _offer(key: _Key, prices: dict[str, Decimal], fetched_at: datetime) -> Offer | None:
    gpu, count = gpus_of_sku(key.sku)
    if gpu is None:
        return None
    if count < 1 or count != int(count):
        raise RowRejected(f"{key.sku} has a fractional GPU ({count:.2f} x {gpu})")
    return Offer(
        provider=PROVIDER, instance_type=key.sku, gpu=gpu, gpu_count=int(count),
        gpu_memory_bytes=spec_memory_bytes(gpu), vcpus=_vcpus(key.sku), ram_bytes=None,
        region=key.region, price_per_hour=prices.get("on_demand"),
        spot_price_per_hour=prices.get("spot"), fetched_at=fetched_at, source=SOURCE,
    )


def gpus_of_sku(sku: str) -> tuple[str | None, float]:
    """Canonical GPU and GPUs per VM for an Azure size; (None, 0) for a size without GPUs.

    Raises UnknownGpuError for an N-series (GPU) size missing from the table.
    """
    for pattern, gpu, counts in _SKU_RES:
        match = pattern.match(sku)
        if match and match.group(1) in counts:
            return gpu, counts[match.group(1)]
    if re.match(r"^Standard_N[CDGV]", sku):
        raise UnknownGpuError(f"Azure size {sku} is not in the GPU size table", raw=sku)
    return None, 0


def _vcpus(sku: str) -> float | None:
    match = re.match(r"^Standard_[A-Z]+(\d+)", sku)
    return float(match.group(1)) if match else None
