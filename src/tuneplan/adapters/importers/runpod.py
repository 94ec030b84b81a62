"""RunPod GPU types and prices from its public GraphQL API (``gpuTypes``); no key needed.

Prices in the API are USD per hour **per GPU**; offers here are whole pods of 1, 2, 4 and 8
GPUs (up to ``maxGpuCount``) priced count x per-GPU. Secure and Community Cloud are separate
offers. No region in this query, so ``region`` is the cloud tier. Does not query stock.
"""

from __future__ import annotations

import os
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
    spec_memory_bytes,
)
from tuneplan.core.catalog.offers import Offer, normalise_gpu_name
from tuneplan.units import GiB

SOURCE = "runpod"
PROVIDER = "RunPod"
DEFAULT_URL = "https://api.runpod.io/graphql"
#: Environment variable with an optional key; the gpuTypes prices are public without one.
KEY_ENV = "RUNPOD_API_KEY"
POD_SIZES = (1, 2, 4, 8)
QUERY = """query GpuTypes { gpuTypes { id displayName memoryInGb maxGpuCount
  secureCloud communityCloud securePrice communityPrice secureSpotPrice communitySpotPrice } }"""


def fetch(client: httpx.Client, *, base_url: str = DEFAULT_URL,
          fetched_at: datetime | None = None) -> ImportResult:
    """POST the gpuTypes query and parse it (see ``parse_runpod_gpu_types``).

    An optional key goes in the ``Authorization: Bearer`` header (as dstack 0.22.5's RunPod
    client sends it), never in the URL, where logs and error texts would show it.
    """
    key = os.environ.get(KEY_ENV, "").strip()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    payload = fetch_json(client, "POST", base_url, json={"query": QUERY}, headers=headers)
    return parse_runpod_gpu_types(payload, fetched_at or utc_now())


def parse_runpod_gpu_types(payload: Any, fetched_at: datetime) -> ImportResult:
    """Offers from a gpuTypes result: ``{"data": {"gpuTypes": [...]}}`` or the bare list.

    On-demand = ``securePrice``/``communityPrice``, spot = ``*SpotPrice`` (per GPU-hour, x count).
    A tier's price counts only where the tier is offered (``communityCloud`` false makes the
    0.5 ``communityPrice`` a placeholder; ``secureCloud`` false makes securePrice 0).
    """
    gpu_types = _gpu_types(payload)
    collector = OfferCollector()
    for index, item in enumerate(gpu_types):
        for tier in ("secure", "community"):
            for count in POD_SIZES:
                collector.add(f"gpuTypes[{index}] {tier} x{count}",
                              partial(_offer, item, tier, count, fetched_at))
    return collector.result()


def _gpu_types(payload: Any) -> list[Any]:
    if isinstance(payload, dict):
        if payload.get("errors"):
            message = str(payload["errors"])[:200]
            raise PayloadError(f"RunPod GraphQL returned errors: {message}")
        payload = (payload.get("data") or {}).get("gpuTypes")
    if not isinstance(payload, list):
        raise PayloadError("RunPod payload has no gpuTypes list")
    return payload


def _offer(item: Any, tier: str, count: int, fetched_at: datetime) -> Offer | None:
    if not isinstance(item, dict):
        raise RowRejected(f"item is {type(item).__name__}, expected an object")
    max_count = read_count(item.get("maxGpuCount"), "maxGpuCount")
    if item.get(f"{tier}Cloud") is not True or count > max_count:
        return None
    on_demand = read_price(item.get(f"{tier}Price"), f"{tier}Price")
    spot = read_price(item.get(f"{tier}SpotPrice"), f"{tier}SpotPrice")
    if on_demand is None and spot is None:
        return None
    memory_gb = read_number(item.get("memoryInGb"), "memoryInGb")
    # memoryInGb only picks a variant (A100 40 vs 80 GB); the offer carries the spec's memory.
    hint_bytes = int(memory_gb * GiB) if memory_gb else None
    display = read_name(item.get("displayName") or item.get("id"), "displayName")
    gpu = normalise_gpu_name(display, hint_bytes)
    return Offer(
        provider=PROVIDER,
        instance_type=f"{count}x {display} {tier.upper()}",
        gpu=gpu,
        gpu_count=count,
        gpu_memory_bytes=spec_memory_bytes(gpu),
        vcpus=None,
        ram_bytes=None,
        region=f"{tier}-cloud",
        price_per_hour=None if on_demand is None else on_demand * count,
        spot_price_per_hour=None if spot is None else spot * count,
        fetched_at=fetched_at,
        source=SOURCE,
        notes=f"per-GPU price x {count}; RunPod id {str(item.get('id'))[:80]!r}",
    )
