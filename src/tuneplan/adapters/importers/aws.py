"""AWS EC2 on-demand prices from the public Price List bulk offer file (one per region); no key.

Keeps plain on-demand Linux: term OnDemand, tenancy Shared, no pre-installed software, no
licence, capacity status Used and ``marketoption`` OnDemand (the Capacity Block product of
the same instance type is priced 0.00 in the file). Prices are USD per hour for the whole
instance. The file names no GPU model, so ``_FAMILY_GPUS`` maps instance families to GPUs.
Spot prices are not in the Price List API. The offer files are large (hundreds of MB).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any

import httpx

from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import HttpCache, fetch_json
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
from tuneplan.core.catalog.offers import Offer
from tuneplan.errors import UnknownGpuError
from tuneplan.units import GiB

SOURCE = "aws"
PROVIDER = "AWS"
DEFAULT_URL = "https://pricing.us-east-1.amazonaws.com"
OFFER_PATH = "/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
DEFAULT_REGIONS = ("us-east-1",)

# Instance family (the part before the first ".") -> canonical GPU, from the EC2 accelerated
# computing instance docs. A family with GPUs that is missing here is reported as unknown.
_FAMILY_GPUS: dict[str, str] = {
    "p3": "V100 SXM2 16GB", "p3dn": "V100 SXM2 32GB",
    "p4d": "A100 40GB SXM4", "p4de": "A100 80GB SXM4",
    "p5": "H100 SXM5", "p5e": "H200 SXM", "p5en": "H200 SXM",
    "p6-b200": "B200 (HGX)", "p6-b300": "B300 (HGX)",
    "g4dn": "T4", "g5": "A10G", "g5g": "T4G", "g6": "L4", "gr6": "L4", "g6e": "L40S",
    "p2": "K80", "g3": "M60", "g3s": "M60",
}
_WANTED = {
    "tenancy": "Shared", "operatingSystem": "Linux", "preInstalledSw": "NA",
    "licenseModel": "No License required", "capacitystatus": "Used",
}


def fetch(client: httpx.Client, *, base_url: str = DEFAULT_URL,
          regions: Sequence[str] = DEFAULT_REGIONS, cache: HttpCache | None = None,
          fetched_at: datetime | None = None) -> ImportResult:
    """Download each region's offer file, then parse them together (all in memory first)."""
    payloads = [fetch_json(client, "GET", base_url.rstrip("/") + OFFER_PATH.format(region=r),
                           cache=cache)
                for r in regions]
    stamp = fetched_at or utc_now()
    return merge_results(parse_aws_offer_file(payload, stamp) for payload in payloads)


def parse_aws_offer_file(payload: Any, fetched_at: datetime) -> ImportResult:
    """Offers from an AmazonEC2 offer file (``products`` + ``terms.OnDemand``)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("products"), dict):
        raise PayloadError("AWS offer file has no products object")
    on_demand = (payload.get("terms") or {}).get("OnDemand")
    if not isinstance(on_demand, dict):
        raise PayloadError("AWS offer file has no terms.OnDemand object")
    collector = OfferCollector()
    for sku, product in payload["products"].items():
        terms = on_demand.get(sku)
        collector.add(f"product {str(sku)[:40]}", partial(_offer, product, terms, fetched_at))
    return collector.result()


def _offer(product: Any, terms: Any, fetched_at: datetime) -> Offer | None:
    if not isinstance(product, dict) or not isinstance(product.get("attributes"), dict):
        raise RowRejected("product has no attributes object")
    attrs = product["attributes"]
    gpus = str(attrs.get("gpu", "0")).strip()
    if not str(product.get("productFamily", "")).startswith("Compute Instance") or gpus in (
            "", "0", "NA"):
        return None
    if any(attrs.get(k) != v for k, v in _WANTED.items()):
        return None
    if attrs.get("marketoption", "OnDemand") != "OnDemand":
        return None
    instance = read_name(attrs.get("instanceType"), "instanceType")
    gpu = gpu_of_instance_type(instance)
    memory_gib = read_number(str(attrs.get("memory", "")).removesuffix(" GiB"), "memory")
    network = str(attrs.get("networkPerformance") or "")[:60]
    return Offer(
        provider=PROVIDER, instance_type=instance, gpu=gpu,
        gpu_count=read_count(gpus, "gpu"), gpu_memory_bytes=spec_memory_bytes(gpu),
        vcpus=read_number(attrs.get("vcpu"), "vcpu"),
        ram_bytes=None if memory_gib is None else int(memory_gib * GiB),
        region=read_name(attrs.get("regionCode"), "regionCode"),
        price_per_hour=_hourly_usd(terms), fetched_at=fetched_at, source=SOURCE,
        # networkPerformance is the NIC (EFA) rate between nodes, not the GPU link that
        # ``interconnect`` names (NVLink ...), so it goes in the notes.
        notes=f"network: {network}" if network else "",
    )


def _hourly_usd(terms: Any) -> Decimal:
    """The one hourly USD price of an on-demand term (several dimensions = ambiguous)."""
    if not isinstance(terms, dict) or not terms:
        raise RowRejected("no OnDemand term for this product")
    dimensions = [d for term in terms.values() if isinstance(term, dict)
                  for d in (term.get("priceDimensions") or {}).values()]
    hourly = [d for d in dimensions if isinstance(d, dict) and d.get("unit") == "Hrs"]
    if len(hourly) != 1:
        raise RowRejected(f"expected one hourly price dimension, found {len(hourly)}")
    return require_price((hourly[0].get("pricePerUnit") or {}).get("USD"), "pricePerUnit.USD")


def gpu_of_instance_type(instance_type: str) -> str:
    """Canonical GPU of an EC2 GPU instance type; UnknownGpuError for an unmapped family."""
    family = instance_type.split(".", 1)[0]
    if family not in _FAMILY_GPUS:
        raise UnknownGpuError(f"EC2 family {family!r} is not in the GPU family table",
                              raw=f"aws:{family}")
    return _FAMILY_GPUS[family]
