"""The JSON twins of the pages (``/api/*``), each mirroring a CLI command's ``--json``.

Thin: validate (pydantic bounds → 422), call ``web.documents``, return the document.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from tuneplan.web.app import TuneplanJSON
from tuneplan.web.documents import (
    catalog_document,
    gpus_document,
    memory_document,
    models_document,
)
from tuneplan.web.inputs import JobInput, OfferQuery, PlanInput, resolve_web_model

router = APIRouter(prefix="/api", tags=["api"])
_BAD: dict[int | str, dict[str, Any]] = {
    422: {"description": "Bad input: `detail` lists each field (`loc`) and the reason (`msg`)."}}
_JSON: dict[str, Any] = {"content": {"application/json": {}}}


@router.get("/offers", response_class=TuneplanJSON, responses={**_BAD, 200: _JSON})
async def api_offers(request: Request, query: Annotated[OfferQuery, Query()]) -> Response:
    """`tuneplan offers --json`: offers of the catalog, filtered and sorted; money as strings
    (USD per hour for the whole instance; `*_per_gpu_hour` divide by the count). One page:
    `limit` offers after `offset`; the `X-Total-Count` header says how many match, and a
    `Link: <...>; rel="next"` header gives the next page while there is one."""
    from starlette.concurrency import run_in_threadpool

    from tuneplan.web.documents import offers_json, offers_key

    state = request.app.state
    key = offers_key(query)
    stamp = await catalog_stamp(request)
    found = state.offers_cache.get((key, stamp))
    if found is None:
        found = await run_in_threadpool(offers_json, query, state.store_path)
        state.offers_cache.put((key, found.stamp), found)
    headers = {"X-Total-Count": str(found.total)}
    if query.offset + found.count < found.total:
        following = request.url.include_query_params(offset=query.offset + found.count)
        headers["Link"] = f'<{following}>; rel="next"'
    return Response(found.body, media_type="application/json", headers=headers)


async def catalog_stamp(request: Request) -> tuple[str, int]:
    """The catalog's stamp now (read on the event loop once the file is open: microseconds)."""
    from starlette.concurrency import run_in_threadpool

    watch = request.app.state.catalog_watch
    if watch.is_open:
        stamp: tuple[str, int] = watch.stamp()
        return stamp
    return await run_in_threadpool(watch.stamp)  # the first read may create and seed the file


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
    model = resolve_web_model(job.model, job.config, **hub_access(request))
    return TuneplanJSON(memory_document(job, model))


def hub_access(request: Request) -> dict[str, Any]:
    """``resolve_web_model``'s hub arguments for this request: the switch, the app's gate and
    the client's address (what the per-client rate limit counts)."""
    state = request.app.state
    return {"allow_hub": state.allow_hub, "gate": state.hub_gate,
            "client": request.client.host if request.client else ""}


_BUSY: dict[int | str, dict[str, Any]] = {
    503: {"description": "Busy: too many plans running or queued; see `Retry-After`."},
    429: {"description": "Too many hub lookups from this address; see `Retry-After`."}}


@router.post("/plan", response_class=TuneplanJSON,
             responses={**_BAD, **_BUSY, 200: _JSON})
async def api_plan(request: Request, job: PlanInput) -> Response:
    """`tuneplan plan MODEL --json`: ranked plans with why and warnings, and rejected offers.
    Planned in a worker process; a repeated job over an unchanged catalog is answered from
    memory."""
    from starlette.concurrency import run_in_threadpool

    from tuneplan.web.planning import build_job, plan_document_bytes, plan_key

    state = request.app.state
    model = await run_in_threadpool(
        lambda: resolve_web_model(job.model, job.config, **hub_access(request)))
    built = build_job(job, model)
    key = plan_key("json", built, model, job.top, await catalog_stamp(request))
    body: bytes = await state.plan_pool.run(key, plan_document_bytes, built, model, job.top,
                                            state.store_path)
    return Response(body, media_type="application/json")
