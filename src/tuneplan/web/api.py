"""The JSON twins of the pages (``/api/*``), each mirroring a CLI command's ``--json``.

Thin: validate (pydantic bounds → 422), call ``web.documents``, return the document.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from tuneplan.web.app import TuneplanJSON
from tuneplan.web.documents import (
    catalog_document,
    gpus_document,
    memory_document,
    models_document,
    offers_document,
)
from tuneplan.web.inputs import JobInput, OfferQuery, PlanInput, resolve_web_model

router = APIRouter(prefix="/api", tags=["api"])
_BAD: dict[int | str, dict[str, Any]] = {
    422: {"description": "Bad input: `detail` lists each field (`loc`) and the reason (`msg`)."}}
_JSON: dict[str, Any] = {"content": {"application/json": {}}}


@router.get("/offers", response_class=TuneplanJSON, responses={**_BAD, 200: _JSON})
def api_offers(request: Request, query: Annotated[OfferQuery, Query()]) -> TuneplanJSON:
    """`tuneplan offers --json`: offers of the catalog, filtered and sorted; money as strings
    (USD per hour for the whole instance; `*_per_gpu_hour` divide by the count)."""
    return TuneplanJSON(offers_document(query, request.app.state.store_path))


@router.get("/catalog", response_class=TuneplanJSON, responses={200: _JSON})
def api_catalog(request: Request) -> TuneplanJSON:
    """`tuneplan catalog status --json`: per-source fetch time, offer count, age, stale flag."""
    return TuneplanJSON(catalog_document(request.app.state.store_path))


@router.get("/gpus", response_class=TuneplanJSON, responses={**_BAD, 200: _JSON})
def api_gpus(min_memory: Annotated[str | None, Query(
        max_length=24, pattern=r"^[0-9][0-9_.,]*\s*[A-Za-z]{0,3}$",
        description="at least this much memory per GPU: 80GB (10^9) or 80GiB (2^30)")] = None,
             ) -> TuneplanJSON:
    """`tuneplan gpus --json`: GPU specifications (exact bytes, dense peak FLOP/s)."""
    return TuneplanJSON(gpus_document(min_memory))


@router.get("/models", response_class=TuneplanJSON, responses={200: _JSON})
def api_models() -> TuneplanJSON:
    """`tuneplan models --json`: the bundled registry with exact parameter counts."""
    return TuneplanJSON(models_document())


@router.post("/memory", response_class=TuneplanJSON, responses={**_BAD, 200: _JSON})
def api_memory(request: Request, job: JobInput) -> TuneplanJSON:
    """`tuneplan memory MODEL --json`: per-GPU memory, term by term. Give `model` (bundled
    name or hub id) or `config` (a config.json object); `gpu` adds fits/headroom."""
    model = resolve_web_model(job.model, job.config, allow_hub=request.app.state.allow_hub)
    return TuneplanJSON(memory_document(job, model))


@router.post("/plan", response_class=TuneplanJSON, responses={**_BAD, 200: _JSON})
def api_plan(request: Request, job: PlanInput) -> TuneplanJSON:
    """`tuneplan plan MODEL --json`: ranked plans with why and warnings, and rejected offers."""
    from tuneplan.web.planning import plan_document, run_plan

    model = resolve_web_model(job.model, job.config, allow_hub=request.app.state.allow_hub)
    result = run_plan(job, model, request.app.state.store_path)
    document: dict[str, Any] = plan_document(result, job.top, request.app.state.store_path)
    return TuneplanJSON(document)
