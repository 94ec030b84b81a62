"""The HTML pages: offers, plan (form and results), a plan's detail. Server-rendered.

Thin: read the form or query, validate with the same pydantic models as the API, call
``web.documents``/``web.planning``, render a template. Templates escape everything.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, File, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ValidationError

from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import (
    Attention,
    Interconnect,
    Offload,
    Optimizer,
    Precision,
    Sharding,
)
from tuneplan.units import format_duration
from tuneplan.web.app import html
from tuneplan.web.documents import catalog_document, models_document
from tuneplan.web.documents import offers_page as find_offers_page
from tuneplan.web.inputs import MAX_UPLOAD_BYTES, FieldError, OfferQuery, PlanInput
from tuneplan.web.offers_view import COLUMNS, offer_rows

router = APIRouter(include_in_schema=False)
M = TypeVar("M", bound=BaseModel)
MAX_KEPT_PLANS = 64  # plan results kept in memory for their detail pages (oldest dropped)


def _validated(model: type[M], pairs: list[tuple[str, str]]) -> M:
    """Validate form or query pairs: empty fields mean "default"; a repeated name (hidden
    'false' before a checkbox) takes its last value."""
    data: dict[str, str] = {}
    for key, value in pairs:
        if value.strip():
            data[key] = value
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc


@router.get("/")
def index() -> RedirectResponse:
    return RedirectResponse("/offers", status_code=307)


@router.get("/offers", response_class=HTMLResponse)
def offers_page(request: Request) -> HTMLResponse:
    """The catalog as a filterable, sortable table with its age and sources."""
    query = _validated(OfferQuery, list(request.query_params.multi_items()))
    store = request.app.state.store_path
    records, matched, _ = find_offers_page(query, store)
    catalog = catalog_document(store)
    rows = offer_rows(records, catalog)
    following = None
    if query.offset + len(records) < matched:
        from urllib.parse import urlencode

        params = dict(request.query_params) | {"offset": str(query.offset + len(records))}
        following = f"/offers?{urlencode(params)}"
    return html(request, "offers.html", {
        "query": query, "rows": rows, "matched": matched, "catalog": catalog,
        "next_page": following,
        "stale_sources": [s for s in catalog["sources"] if s["stale"]],
        "columns": COLUMNS, "page": "offers",
        "oldest_age": format_duration(max((s["age_s"] for s in catalog["sources"]), default=0))})


def _form_context(values: dict[str, Any]) -> dict[str, Any]:
    return {"values": values, "models": models_document(), "page": "plan",
            "choices": {"method": list(Method), "quant": list(Quant),
                        "precision": list(Precision), "optimizer": list(Optimizer),
                        "recipe": list(Recipe), "attention": list(Attention),
                        "sharding": list(Sharding), "offload": list(Offload),
                        "interconnect": list(Interconnect)},
            "max_upload": MAX_UPLOAD_BYTES}


@router.get("/plan", response_class=HTMLResponse)
def plan_form(request: Request) -> HTMLResponse:
    """The job form; query parameters prefill it (``/plan?model=llama-3.1-8b&method=qlora``)."""
    job = _validated(PlanInput, list(request.query_params.multi_items()))
    values = job.model_dump(mode="json")
    if values["tokens"] is None:
        values["tokens"] = "50M"  # a length makes hours and cost; the API leaves it optional
    return html(request, "plan.html", _form_context(values))


@router.post("/plan", response_class=HTMLResponse)
async def plan_submit(request: Request,
                      config_file: Annotated[UploadFile | None, File()] = None) -> Response:
    """Run the planner on the submitted job and show ranked plans with both charts."""
    from starlette.concurrency import run_in_threadpool

    from tuneplan.web.api import catalog_stamp, hub_access
    from tuneplan.web.inputs import resolve_web_model
    from tuneplan.web.planning import build_job, plan_key, plan_result, plan_view

    form = await request.form()
    pairs = [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
    job = _validated(PlanInput, pairs)
    upload = await _read_upload(config_file)
    model = await run_in_threadpool(
        lambda: resolve_web_model(job.model, job.config, upload, **hub_access(request)))
    # Planning takes a second or so of CPU: in the app's planning pool, off the event loop.
    built = build_job(job, model)
    state = request.app.state
    result = await state.plan_pool.run(plan_key("result", built, model, 0,
                                                await catalog_stamp(request)),
                                       plan_result, built, model, state.store_path)
    key = _keep(request, (result, job))
    context = _form_context(job.model_dump(mode="json")) | {
        "view": plan_view(result, job.top), "key": key, "model_name": model.name,
        "catalog": catalog_document(request.app.state.store_path)}
    return html(request, "plan.html", context)


async def _read_upload(upload: UploadFile | None) -> bytes | None:
    if upload is None or not upload.filename:
        return None
    data = await upload.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        raise FieldError("config", f"config.json is larger than {MAX_UPLOAD_BYTES:,} bytes")
    return data if data else None


def _keep(request: Request, kept_value: tuple[Any, PlanInput]) -> str:
    """Remember a result for its detail pages; the key is a random token, not user input."""
    import secrets

    kept: OrderedDict[str, tuple[Any, PlanInput]] = request.app.state.plans
    key = secrets.token_urlsafe(9)
    kept[key] = kept_value
    while len(kept) > MAX_KEPT_PLANS:
        kept.popitem(last=False)
    return key


def _kept_plan(request: Request, key: str, plan_id: str) -> tuple[Any, int, Any, PlanInput]:
    """(plan, rank, result, form) kept for a results page; 404 page when gone."""
    kept = request.app.state.plans.get(key[:64])
    found = None if kept is None else next(
        ((rank, p) for rank, p in enumerate(kept[0].plans, start=1) if p.id == plan_id[:64]),
        None)
    if kept is None or found is None:
        raise _Gone
    return found[1], found[0], kept[0], kept[1]


class _Gone(Exception):
    pass


def _gone(request: Request) -> HTMLResponse:
    return html(request, "error.html", {"status": 404, "problems": [{
        "loc": ["path"], "msg": "no such plan (results are kept in memory for the "
                                f"last {MAX_KEPT_PLANS} runs): plan again"}]}, status=404)


@router.get("/plans/{key}/{plan_id}", response_class=HTMLResponse)
def plan_detail(request: Request, key: str, plan_id: str) -> HTMLResponse:
    """One plan: offer, strategy, memory chart and terms, time and cost, why and warnings."""
    from tuneplan.web.planning import plan_detail_view

    try:
        plan, rank, result, form = _kept_plan(request, key, plan_id)
    except _Gone:
        return _gone(request)
    return html(request, "plan_detail.html", {
        "d": plan_detail_view(plan, rank, result, form), "key": key, "page": "plan",
        "targets": ["all", "accelerate", "deepspeed", "skypilot", "dstack"]})


@router.get("/plans/{key}/{plan_id}/launch.zip")
def plan_launch(request: Request, key: str, plan_id: str,
                to: Annotated[Literal["all", "accelerate", "deepspeed", "skypilot", "dstack"],
                              Query()] = "all") -> Response:
    """The plan's launch bundle (``tuneplan launch PLAN_ID --to TO``) as a zip download."""
    from tuneplan.web.planning import launch_zip

    try:
        plan, _, result, _ = _kept_plan(request, key, plan_id)
    except _Gone:
        return _gone(request)
    name, data = launch_zip(plan, result, to)
    return Response(data, media_type="application/zip",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/docs", response_class=HTMLResponse)
def api_docs(request: Request) -> HTMLResponse:
    """The JSON API, listed from the app's own OpenAPI document (no CDN-hosted Swagger UI)."""
    schema = request.app.openapi()
    endpoints = [{"path": path, "method": method.upper(), "summary": op.get("summary", ""),
                  "description": op.get("description", ""),
                  "parameters": op.get("parameters", []),
                  "body": _body_fields(schema, op)}
                 for path, ops in schema["paths"].items() for method, op in ops.items()]
    return html(request, "docs.html", {"endpoints": endpoints, "page": "docs"})


def _body_fields(schema: dict[str, Any], op: dict[str, Any]) -> list[dict[str, Any]]:
    ref = (op.get("requestBody", {}).get("content", {}).get("application/json", {})
           .get("schema", {}).get("$ref", ""))
    if not ref:
        return []
    model = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    return [{"name": name, "default": prop.get("default"), "description":
             prop.get("description", ""), "bounds": {k: prop[k] for k in (
                 "minimum", "maximum", "exclusiveMinimum", "maxLength", "enum") if k in prop}}
            for name, prop in model.get("properties", {}).items()]
