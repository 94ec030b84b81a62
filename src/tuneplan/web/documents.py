"""The JSON documents behind every page, built by the same functions the CLI calls.

Each function returns plain data (the CLI's ``--json`` shape); pages render it, the API returns
it. No estimating or filtering logic lives here: that is the core's and the adapters'.
"""

from __future__ import annotations

from dataclasses import asdict
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tuneplan.core.catalog.offers import OfferFilter, OfferSort, offer_record
from tuneplan.core.models import ModelSpec
from tuneplan.errors import BadInputError
from tuneplan.units import parse_size
from tuneplan.web.inputs import FieldError, OfferQuery, job_request


def offer_filter(query: OfferQuery) -> OfferFilter:
    """The core filter for a query, as ``tuneplan offers`` builds it from its flags."""
    try:
        floor = parse_size(query.min_gpu_memory) if query.min_gpu_memory else None
    except BadInputError as exc:
        raise FieldError("min_gpu_memory", str(exc)) from exc
    providers = tuple(p.strip() for p in (query.provider or "").split(",") if p.strip())
    price = None if query.max_price is None else Decimal(str(query.max_price))
    return OfferFilter(gpu=query.gpu or None, min_gpu_memory_bytes=floor,
                       gpu_count=query.count, providers=providers, region=query.region or None,
                       spot=query.spot, max_price_per_hour=price)


def offers_document(query: OfferQuery, store_path: Path | None) -> list[dict[str, Any]]:
    """``tuneplan offers --json``: the filtered, sorted offers (at most ``limit``)."""
    from tuneplan.adapters.store import CatalogStore

    with CatalogStore.open(store_path) as store:
        offers = store.offers(offer_filter(query), sort=OfferSort(query.sort))
    return [offer_record(o) for o in offers[:query.limit]]


def catalog_document(store_path: Path | None) -> dict[str, Any]:
    """``tuneplan catalog status --json``: per-source age, counts and the stale flag."""
    from tuneplan.adapters.store import STALE_AFTER_S, CatalogStore

    with CatalogStore.open(store_path) as store:
        statuses = store.status()
        path = store.path
    return {"path": str(path), "stale_after_days": STALE_AFTER_S // 86_400,
            "sources": [asdict(s) for s in statuses]}


def gpus_document(min_memory: str | None = None) -> list[dict[str, Any]]:
    """``tuneplan gpus --json``: every bundled GPU spec plus its usable memory."""
    from tuneplan.adapters.bundled import load_gpu_specs

    try:
        floor = parse_size(min_memory) if min_memory else 0
    except BadInputError as exc:
        raise FieldError("min_memory", str(exc)) from exc
    return [asdict(s) | {"usable_memory_bytes": s.usable_memory_bytes}
            for s in load_gpu_specs() if s.memory_bytes >= floor]


@cache
def models_document() -> list[dict[str, Any]]:
    """``tuneplan models --json`` (cached: the bundled registry never changes in a process)."""
    from tuneplan.adapters.hub import list_bundled_models

    return list_bundled_models()


def providers_by_name() -> dict[str, Any]:
    """Bundled provider features keyed by lower-case name (billing, storage persistence)."""
    from tuneplan.adapters.bundled import load_providers

    return {p.name.lower(): p for p in load_providers()}


def memory_document(job: BaseModel, model: ModelSpec) -> dict[str, Any]:
    """``tuneplan memory --json`` for a job: the same flags → Strategy → estimate path."""
    from tuneplan.service.memory_report import memory_document as cli_document
    from tuneplan.service.memory_report import run_memory

    if job.gpu:  # checked first so that an unknown name is reported against its field
        from tuneplan.adapters.bundled import resolve_gpu_spec

        try:
            resolve_gpu_spec(job.gpu)
        except BadInputError as exc:
            raise FieldError("gpu", str(exc)) from exc
    estimate, spec, gpu = run_memory(job_request(job, "memory", model.name), model=model)
    return cli_document(estimate, spec, gpu)
