"""Offer records (``offer_record``) → table rows for the offers page: display text, the raw
value each column sorts by, the provider's billing and storage notes, and the stale mark.
Presentation only: filtering and sorting of the catalog happen in the store and the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from tuneplan.core.catalog.offers import provider_matches
from tuneplan.units import format_bytes, format_duration


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    text: str
    sort: str        # what the client-side sort compares (numbers as numbers)
    numeric: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class OfferRow:
    offer_id: str
    cells: tuple[Cell, ...]
    stale: bool
    attachable: bool


COLUMNS = ("GPU", "mem/GPU", "GPUs", "provider", "instance", "region", "$/h", "$/GPU-h",
           "spot $/h", "spot $/GPU-h", "link", "billing", "storage kept", "source")


_STEPS = {1: "per second", 60: "per minute", 3600: "per hour"}


def offer_rows(records: list[dict[str, Any]], catalog: dict[str, Any]) -> list[OfferRow]:
    """One row per record, in the order given (the store's sort)."""
    from tuneplan.web.documents import providers_by_name

    stale = {s["source"] for s in catalog["sources"] if s["stale"]}
    providers = providers_by_name()
    return [_row(r, r["source"] in stale, _provider(providers, str(r["provider"])))
            for r in records]


def _provider(providers: dict[str, Any], name: str) -> Any:
    found = providers.get(name.lower())
    if found is None:
        found = next((p for p in providers.values() if provider_matches(name, p.name)), None)
    return found


def _row(r: dict[str, Any], stale: bool, provider: Any) -> OfferRow:
    step = None if provider is None else provider.billing_granularity_s
    billing = "?" if step is None else _STEPS.get(step, f"per {format_duration(step)}")
    persists = "?" if provider is None or not provider.storage_survives_stop else \
        str(provider.storage_survives_stop)
    cells = (
        Cell(text=str(r["gpu"]), sort=str(r["gpu"])),
        _bytes(r["gpu_memory_bytes"]),
        Cell(text=str(r["gpu_count"]), sort=str(r["gpu_count"]), numeric=True),
        Cell(text=str(r["provider"]), sort=str(r["provider"])),
        Cell(text=str(r["instance_type"] or "(GPU only)"), sort=str(r["instance_type"])),
        Cell(text=str(r["zone"] or r["region"]), sort=str(r["zone"] or r["region"])),
        _money(r["price_per_hour"]), _money(r["price_per_gpu_hour"]),
        _money(r["spot_price_per_hour"]), _money(r["spot_price_per_gpu_hour"]),
        Cell(text=str(r["interconnect"] or "PCIe"), sort=str(r["interconnect"] or "")),
        Cell(text=billing, sort=billing),
        Cell(text=persists[:60], sort=persists),
        Cell(text=f"{r['source']} · {_date(r['fetched_at'])}", sort=str(r["source"])),
    )
    return OfferRow(offer_id=str(r["id"]), cells=cells, stale=stale,
                    attachable=bool(r["attachable"]))


def _bytes(value: int) -> Cell:
    return Cell(text=format_bytes(value, digits=0) if value % 2**30 == 0 else
                format_bytes(value, digits=1), sort=str(value), numeric=True)


def _money(value: Decimal | None) -> Cell:
    if value is None:
        return Cell(text="–", sort="", numeric=True)
    return Cell(text=f"${value:,.3f}" if value < 10 else f"${value:,.2f}", sort=str(value),
                numeric=True)


def _date(value: datetime) -> str:
    return f"{value:%Y-%m-%d}"
