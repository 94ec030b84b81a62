"""The JSON documents behind every page, built by the same functions the CLI calls.

Each function returns plain data (the CLI's ``--json`` shape); pages render it, the API returns
it. No estimating or filtering logic lives here: that is the core's and the adapters'.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tuneplan.core.catalog.offers import OfferFilter, OfferSort
from tuneplan.core.models import ModelSpec
from tuneplan.errors import BadInputError
from tuneplan.web.inputs import FieldError, OfferQuery, job_request


def offer_filter(query: OfferQuery) -> OfferFilter:
    """The core filter for a query, as ``tuneplan offers`` builds it from its flags."""
    from tuneplan.service.catalog import offer_filter as service_filter

    return service_filter(gpu=query.gpu, min_gpu_memory=query.min_gpu_memory,
                          count=query.count, provider=query.provider, region=query.region,
                          spot=query.spot, max_price=query.max_price)


def offers_document(query: OfferQuery, store_path: Path | None) -> list[dict[str, Any]]:
    """``tuneplan offers --json``: the filtered, sorted offers (at most ``limit``)."""
    return offers_page(query, store_path)[0]


def offers_page(query: OfferQuery, store_path: Path | None
                ) -> tuple[list[dict[str, Any]], int, tuple[str, int]]:
    """(records of one page, how many match in all, the catalog stamp read): filtered, sorted
    and paged (``limit``/``offset``) in SQL."""
    from tuneplan.service import catalog

    found = catalog.find_offers(offer_filter(query), OfferSort(query.sort), store_path,
                                limit=query.limit, offset=query.offset)
    return catalog.offers_document(found.offers), found.total, found.stamp


@dataclass(frozen=True, slots=True)
class OffersJson:
    """One page of ``/api/offers`` rendered once, kept by (query, catalog stamp)."""

    body: bytes
    count: int
    total: int
    stamp: tuple[str, int]


def offers_key(query: OfferQuery) -> tuple[Any, ...]:
    """The canonical offers query (parsed filter, sort, page): equal meanings share a key."""
    return (offer_filter(query), query.sort, query.limit, query.offset)


def offers_json(query: OfferQuery, store_path: Path | None) -> OffersJson:
    """``offers_page`` as the JSON body the API sends (the CLI's encoder)."""
    from tuneplan.service.jsondoc import dumps

    records, total, stamp = offers_page(query, store_path)
    return OffersJson(body=dumps(records).encode("utf-8"), count=len(records), total=total,
                      stamp=stamp)


def catalog_document(store_path: Path | None) -> dict[str, Any]:
    """``tuneplan catalog status --json``."""
    from tuneplan.service.catalog import catalog_document as document

    return document(store_path)


def gpus_document(min_memory: str | None = None) -> list[dict[str, Any]]:
    """``tuneplan gpus --json``: every bundled GPU spec plus its usable memory."""
    from tuneplan.service.catalog import gpu_specs
    from tuneplan.service.catalog import gpus_document as document

    return document(gpu_specs(min_memory))


@cache
def models_document() -> list[dict[str, Any]]:
    """``tuneplan models --json`` (cached: the bundled registry never changes in a process)."""
    from tuneplan.service.catalog import models_document as document

    return document()


def providers_by_name() -> dict[str, Any]:
    """Bundled provider features keyed by lower-case name (billing, storage persistence)."""
    from tuneplan.service.catalog import providers

    return {p.name.lower(): p for p in providers()}


def memory_document(job: BaseModel, model: ModelSpec) -> dict[str, Any]:
    """``tuneplan memory --json`` for a job: the same flags → Strategy → estimate path."""
    from tuneplan.service.memory_report import memory_document as cli_document
    from tuneplan.service.memory_report import run_memory

    gpu_name = getattr(job, "gpu", None)
    if gpu_name:  # checked first so that an unknown name is reported against its field
        from tuneplan.adapters.bundled import resolve_gpu_spec

        try:
            resolve_gpu_spec(gpu_name)
        except BadInputError as exc:
            raise FieldError("gpu", str(exc)) from exc
    estimate, spec, gpu = run_memory(job_request(job, "memory", model.name), model=model)
    return cli_document(estimate, spec, gpu)
