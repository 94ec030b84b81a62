"""Offers (a rentable GPU instance at a price), the filter over them, and provider names.

Pure: offers are built by importers (adapters) and stored by ``adapters.store``; this module
checks their invariants, filters and sorts them. GPU names go through ``normalise_gpu_name``
(the one alias table, in ``core.catalog.gpu_names``). Provider features live in
``core.catalog.providers``.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any

from tuneplan.core.catalog.gpu_names import (
    _CANONICAL_SET,
    CANONICAL_GPUS,
    GPU_ALIASES,
    gpu_matches,
    normalise_gpu_name,
)
from tuneplan.core.catalog.providers import Provider, normalise_provider_name, provider_matches
from tuneplan.errors import InvalidOfferError, InvalidValueError

__all__ = [
    "CANONICAL_GPUS", "GPU_ALIASES", "MAX_PRICE_PER_GPU_HOUR", "OFFER_RECORD_FIELDS", "Offer",
    "OfferFilter", "OfferSort",
    "Provider", "filter_offers", "gpu_matches", "normalise_gpu_name", "normalise_provider_name",
    "offer_from_record", "offer_record", "provider_matches", "region_matches", "sort_offers",
]

#: Sanity cap: no GPU rents for more than this per GPU-hour (B300 on-demand is ~18 USD/GPU-h).
#: A price above it is a unit error (cents, per-month, per-cluster) or hostile input.
MAX_PRICE_PER_GPU_HOUR = Decimal(200)
#: GPUs per offer: the bundled snapshot's largest instance has 16; more than 128 is garbage.
_MAX_GPU_COUNT = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One rentable instance shape in one place at one point in time.

    Prices are USD per hour for the whole instance (all ``gpu_count`` GPUs);
    ``price_per_gpu_hour``/``spot_price_per_gpu_hour`` divide by the count and are named so.
    ``gpu_memory_bytes`` is per GPU. ``attachable`` marks a GPU priced without its host VM
    (GCP accelerator rows): its price covers the GPUs only. Raises InvalidOfferError.
    """

    provider: str
    instance_type: str
    gpu: str
    gpu_count: int
    gpu_memory_bytes: int
    vcpus: float | None
    ram_bytes: int | None
    disk_bytes: int | None = None
    region: str
    zone: str | None = None
    price_per_hour: Decimal | None
    spot_price_per_hour: Decimal | None = None
    currency: str = "USD"
    interconnect: str | None = None
    fetched_at: datetime
    source: str
    attachable: bool = False
    notes: str = ""

    def __post_init__(self) -> None:
        problems = _offer_problems(self)
        if problems:
            raise InvalidOfferError(
                f"invalid offer {self.provider}/{self.instance_type or '-'} in {self.region}: "
                + "; ".join(problems)
            )

    @property
    def id(self) -> str:
        """Stable short id: hash of provider, instance, region, zone, GPU and count."""
        key = "|".join((self.provider.lower(), self.instance_type, self.region, self.zone or "",
                        self.gpu, str(self.gpu_count)))
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    @property
    def price_per_gpu_hour(self) -> Decimal | None:
        """On-demand USD per GPU-hour = price_per_hour / gpu_count."""
        return None if self.price_per_hour is None else self.price_per_hour / self.gpu_count

    @property
    def spot_price_per_gpu_hour(self) -> Decimal | None:
        """Spot USD per GPU-hour = spot_price_per_hour / gpu_count."""
        if self.spot_price_per_hour is None:
            return None
        return self.spot_price_per_hour / self.gpu_count

    @property
    def total_gpu_memory_bytes(self) -> int:
        """gpu_memory_bytes x gpu_count."""
        return self.gpu_memory_bytes * self.gpu_count


def _offer_problems(offer: Offer) -> list[str]:
    problems: list[str] = []
    if not offer.provider.strip():
        problems.append("provider is empty")
    if not offer.region.strip():
        problems.append("region is empty")
    if offer.gpu not in _CANONICAL_SET:
        problems.append(f"GPU {offer.gpu!r} is not a canonical GPU (normalise it first)")
    if not isinstance(offer.gpu_count, int) or not 1 <= offer.gpu_count <= _MAX_GPU_COUNT:
        problems.append(f"gpu_count must be a whole number 1..{_MAX_GPU_COUNT}, "
                        f"got {offer.gpu_count!r}")
    if offer.gpu_memory_bytes <= 0:
        problems.append("gpu_memory_bytes must be > 0")
    if offer.price_per_hour is None and offer.spot_price_per_hour is None:
        problems.append("no price: need an on-demand or a spot price")
    count = offer.gpu_count if isinstance(offer.gpu_count, int) and offer.gpu_count > 0 else 1
    for label, price in (("price_per_hour", offer.price_per_hour),
                         ("spot_price_per_hour", offer.spot_price_per_hour)):
        if price is None:
            continue
        if not isinstance(price, Decimal) or not price.is_finite() or price <= 0:
            problems.append(f"{label} must be a finite Decimal > 0, got {price!r}")
        elif price > MAX_PRICE_PER_GPU_HOUR * count:
            problems.append(f"{label} {price} USD/h exceeds the sanity cap "
                            f"{MAX_PRICE_PER_GPU_HOUR} USD per GPU-hour")
    if offer.currency != "USD":
        problems.append(f"currency {offer.currency!r} is not USD (convert in the importer)")
    if offer.fetched_at.tzinfo is None or offer.fetched_at.utcoffset() != timedelta(0):
        problems.append("fetched_at must be timezone-aware UTC")
    for label, value in (("vcpus", offer.vcpus), ("ram_bytes", offer.ram_bytes),
                         ("disk_bytes", offer.disk_bytes)):
        if value is not None and value < 0:
            problems.append(f"{label} must not be negative")
    if not offer.source.strip():
        problems.append("source is empty")
    return problems


class OfferSort(StrEnum):
    """Sort keys for offers; ties break on provider, instance and region for a stable order."""

    PRICE = "price"
    PRICE_PER_GPU = "price-per-gpu"
    MEMORY = "memory"


@dataclass(frozen=True, slots=True, kw_only=True)
class OfferFilter:
    """What a query asks for; every field None/False/empty means "any".

    ``gpu`` is a word-prefix match (``H100`` = H100 PCIe, SXM5, NVL); ``region`` a prefix;
    ``providers`` names or aliases; ``spot`` keeps offers with a spot price and prices them by
    it; ``max_price_per_hour`` applies to the whole instance at the price used.
    """

    gpu: str | None = None
    min_gpu_memory_bytes: int | None = None
    gpu_count: int | None = None
    providers: tuple[str, ...] = ()
    region: str | None = None
    spot: bool = False
    max_price_per_hour: Decimal | None = None

    def price_of(self, offer: Offer) -> Decimal | None:
        """The instance price this query uses: spot when ``spot`` else on-demand."""
        return offer.spot_price_per_hour if self.spot else offer.price_per_hour

    def accepts(self, offer: Offer) -> bool:
        """True when the offer passes every condition."""
        price = self.price_of(offer)
        checks = (
            price is not None,
            self.gpu is None or gpu_matches(self.gpu, offer.gpu),
            self.min_gpu_memory_bytes is None
            or offer.gpu_memory_bytes >= self.min_gpu_memory_bytes,
            self.gpu_count is None or offer.gpu_count == self.gpu_count,
            not self.providers or any(provider_matches(p, offer.provider) for p in self.providers),
            self.region is None or region_matches(self.region, offer.region, offer.zone),
            self.max_price_per_hour is None or (price is not None
                                                and price <= self.max_price_per_hour),
        )
        return all(checks)


def region_matches(prefix: str, region: str, zone: str | None) -> bool:
    """The ``--region`` rule: a case-insensitive prefix of the region or of the zone."""
    wanted = prefix.lower()
    return region.lower().startswith(wanted) or (
        zone is not None and zone.lower().startswith(wanted))


def filter_offers(offers: Iterable[Offer], query: OfferFilter) -> list[Offer]:
    """The offers that pass ``query``, in input order."""
    return [offer for offer in offers if query.accepts(offer)]


def sort_offers(offers: Iterable[Offer], by: OfferSort, *, spot: bool = False) -> list[Offer]:
    """Sort ascending by instance price or per-GPU price, or descending by GPU memory.

    ``spot`` sorts by the spot price; offers without the price used go last.
    """
    infinity = Decimal("Infinity")

    def price(offer: Offer) -> Decimal:
        value = offer.spot_price_per_hour if spot else offer.price_per_hour
        if value is None:
            return infinity
        return value / offer.gpu_count if by is OfferSort.PRICE_PER_GPU else value

    def key(offer: Offer) -> tuple[object, ...]:
        tie = (offer.provider, offer.instance_type, offer.region, offer.zone or "")
        if by is OfferSort.MEMORY:
            return (-offer.total_gpu_memory_bytes, price(offer), *tie)
        return (price(offer), *tie)

    return sorted(offers, key=key)


# Unicode categories that can garble or disguise terminal and HTML text: control (Cc), format
# (Cf: bidi overrides such as U+202E, zero-width joiners), surrogates, private use, unassigned,
# and line/paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def is_safe_text(text: str) -> bool:
    """No control, format or separator characters (importers reject names that would garble
    or disguise what a terminal or page shows)."""
    return not any(unicodedata.category(ch) in _UNSAFE_CATEGORIES for ch in text)


OFFER_RECORD_FIELDS = (
    "provider", "instance_type", "gpu", "gpu_count", "gpu_memory_bytes", "vcpus", "ram_bytes",
    "region", "zone", "price_per_hour", "spot_price_per_hour", "currency", "interconnect",
    "fetched_at", "source", "id", "price_per_gpu_hour", "spot_price_per_gpu_hour", "disk_bytes",
    "attachable", "notes",
)


def offer_record(offer: Offer) -> dict[str, object]:
    """An offer as a flat record (CLI/web JSON and CSV): docs/CLI.md's keys, then ``id``, the
    per-GPU prices (named ``*_per_gpu_hour``), ``disk_bytes``, ``attachable`` and ``notes``.
    Money stays Decimal; the caller renders it."""
    return {
        "provider": offer.provider, "instance_type": offer.instance_type, "gpu": offer.gpu,
        "gpu_count": offer.gpu_count, "gpu_memory_bytes": offer.gpu_memory_bytes,
        "vcpus": offer.vcpus, "ram_bytes": offer.ram_bytes, "region": offer.region,
        "zone": offer.zone, "price_per_hour": offer.price_per_hour,
        "spot_price_per_hour": offer.spot_price_per_hour, "currency": offer.currency,
        "interconnect": offer.interconnect, "fetched_at": offer.fetched_at,
        "source": offer.source, "id": offer.id,
        "price_per_gpu_hour": offer.price_per_gpu_hour,
        "spot_price_per_gpu_hour": offer.spot_price_per_gpu_hour,
        "disk_bytes": offer.disk_bytes, "attachable": offer.attachable, "notes": offer.notes,
    }


_DERIVED_KEYS = ("id", "price_per_gpu_hour", "spot_price_per_gpu_hour")


def offer_from_record(record: Mapping[str, Any]) -> Offer:
    """The inverse of ``offer_record`` for its JSON form (money as strings, ``fetched_at`` as
    ISO 8601): every key must be an ``offer_record`` key; the derived ones (``id``, per-GPU
    prices) are checked against the rebuilt offer, so an edited record is refused. Raises
    InvalidValueError naming every problem."""
    problems = [f"unknown key offer.{k}" for k in record if k not in OFFER_RECORD_FIELDS]

    def money(key: str) -> Decimal | None:
        value = record.get(key)
        if value is None:
            return None
        try:
            return Decimal(str(value))
        except ArithmeticError:
            problems.append(f"offer.{key}={value!r} is not an amount")
            return None

    fetched: Any = record.get("fetched_at")
    if isinstance(fetched, str):
        try:
            fetched = datetime.fromisoformat(fetched)
        except ValueError:
            problems.append(f"offer.fetched_at={fetched!r} is not an ISO 8601 time")
    if not isinstance(fetched, datetime):
        problems.append("offer.fetched_at is missing or not a time")
    for key in ("provider", "instance_type", "gpu", "region", "source"):
        if not isinstance(record.get(key), str):
            problems.append(f"offer.{key} is missing or not text")
    for key in ("gpu_count", "gpu_memory_bytes"):
        if isinstance(record.get(key), bool) or not isinstance(record.get(key), int):
            problems.append(f"offer.{key} is missing or not a whole number")
    prices = money("price_per_hour"), money("spot_price_per_hour")
    if problems:
        raise InvalidValueError("; ".join(problems))
    try:
        offer = Offer(
            provider=record["provider"], instance_type=record["instance_type"],
            gpu=record["gpu"], gpu_count=record["gpu_count"],
            gpu_memory_bytes=record["gpu_memory_bytes"], vcpus=record.get("vcpus"),
            ram_bytes=record.get("ram_bytes"), disk_bytes=record.get("disk_bytes"),
            region=record["region"], zone=record.get("zone"), price_per_hour=prices[0],
            spot_price_per_hour=prices[1], currency=record.get("currency", "USD"),
            interconnect=record.get("interconnect"), fetched_at=fetched,
            source=record["source"], attachable=bool(record.get("attachable", False)),
            notes=str(record.get("notes") or ""))
    except (TypeError, InvalidOfferError) as exc:
        raise InvalidValueError(f"offer record has a bad value: {exc}") from None
    rebuilt = offer_record(offer)
    for key in _DERIVED_KEYS:
        if key in record and record[key] is not None and str(record[key]) != str(rebuilt[key]):
            raise InvalidValueError(f"offer.{key}={record[key]!r} disagrees with the offer's "
                                    f"fields ({rebuilt[key]})")
    return offer
