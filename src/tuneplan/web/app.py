"""The FastAPI app of ``tuneplan serve``: pages, their JSON twins, limits and error mapping.

``create_app`` wires routers, templates (Jinja2, autoescaped), static files served from the
package, a request-size limit, security headers, and the exception mapping (bad input → 422
naming the field, catalog trouble → 503). No computing here.
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

from tuneplan.errors import BadInputError, CatalogError, TuneplanError
from tuneplan.service.jsondoc import dumps
from tuneplan.web.inputs import MAX_BODY_BYTES, FieldError

if TYPE_CHECKING:
    from tuneplan.web.capacity import PlanPool
    from tuneplan.web.inputs import HubGate

HERE = Path(__file__).parent
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class TuneplanJSON(JSONResponse):
    """JSON exactly as the CLI prints it: Decimals as strings (money stays exact), times ISO."""

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, by header or by counting."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]],
                 limit: int = MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.limit:
            await _too_large(self.limit, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:
            await _too_large(self.limit, send)


class _BodyTooLarge(Exception):
    pass


async def _too_large(limit: int, send: Send) -> None:
    body = json.dumps({"detail": [{"loc": ["body"], "msg": f"request larger than {limit:,} "
                                   "bytes", "type": "too_large"}]}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def create_app(store_path: str | Path | None = None, *, allow_hub: bool = False,
               allowed_hosts: list[str] | None = None, plan_pool: PlanPool | None = None,
               hub_gate: HubGate | None = None) -> FastAPI:
    """The web app. ``store_path`` is the catalog file (default: the CLI's catalog).

    ``allow_hub``: hub ids not in the local cache are fetched from the hub (bounded by
    ``hub_gate``, default ``inputs.HubGate()``: per-address rate, concurrency, timeout, byte
    cap); off by default, so a request never makes the server reach the network.
    ``allowed_hosts`` (``tuneplan serve`` passes the bound host and the localhost names): other
    Host headers get 400, and a POST whose Origin names another host gets 403 (cross-site form
    posts); None checks neither. ``plan_pool`` runs the planner (default: one process per CPU,
    a bounded queue, results kept by canonical request and catalog stamp).
    """
    from tuneplan import __version__
    from tuneplan.service.catalog import CatalogWatch
    from tuneplan.web.api import router as api_router
    from tuneplan.web.capacity import OFFER_CACHE_BYTES, OFFER_CACHE_ENTRIES, LruCache
    from tuneplan.web.capacity import PlanPool as DefaultPool
    from tuneplan.web.inputs import HubGate as DefaultGate
    from tuneplan.web.pages import router as page_router

    watch = CatalogWatch(store_path)
    pool = plan_pool or DefaultPool()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        pool.close()
        watch.close()

    # FastAPI's own /docs pages load Swagger UI from a CDN; ours (pages.api_docs) is served
    # from the package and reads the same OpenAPI document (/openapi.json).
    app = FastAPI(title="tuneplan", version=__version__, docs_url=None, redoc_url=None,
                  lifespan=lifespan,
                  description="Plan LLM fine-tuning jobs on rented GPUs. Every page has a "
                              "JSON twin under /api that mirrors the CLI's --json output.")
    app.state.store_path = None if store_path is None else Path(store_path)
    app.state.allow_hub = allow_hub
    app.state.hub_gate = hub_gate or DefaultGate()
    app.state.catalog_watch = watch
    app.state.offers_cache = LruCache(OFFER_CACHE_ENTRIES, OFFER_CACHE_BYTES,
                                      lambda found: len(found.body))
    app.state.plan_pool = pool
    app.state.templates = Jinja2Templates(directory=str(HERE / "templates"))
    app.state.templates.env.autoescape = True  # every .html is escaped; also any other name
    app.state.plans = OrderedDict()  # plan results for detail pages (bounded in pages)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.include_router(api_router)
    app.include_router(page_router)
    app.add_middleware(BodyLimit)
    app.add_middleware(SecurityHeaders)
    if allowed_hosts is not None:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        hosts = list(allowed_hosts)
        app.add_middleware(SameOrigin, hosts=hosts)
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(TuneplanError, _tuneplan_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    return app


class SameOrigin:
    """Refuse a POST whose Origin (or, without one, Referer) names a host not in ``hosts``
    (403, the one error shape). Plain ASGI: no per-request task, unlike ``app.middleware``."""

    def __init__(self, app: ASGIApp, hosts: list[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from urllib.parse import urlsplit

        if scope["type"] == "http" and scope.get("method") == "POST":
            request = Request(scope)
            source = request.headers.get("origin") or request.headers.get("referer")
            if source and urlsplit(source).hostname not in self.hosts:
                refusal = error_response(request, 403, [{
                    "loc": ["header", "origin"], "msg": "cross-site POST refused",
                    "type": "cross_site"}])
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SecurityHeaders:
    """CSP, nosniff and no-referrer on every response that does not set its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("Content-Security-Policy", _CSP)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("Referrer-Policy", "no-referrer")
            await send(message)

        await self.app(scope, receive, with_headers)


def problems_of(exc: Exception) -> list[dict[str, Any]]:
    """FastAPI-style ``detail`` items (loc, msg, type) for any bad-input exception."""
    if isinstance(exc, RequestValidationError):
        return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")),
                 "type": str(e.get("type", ""))} for e in exc.errors()]
    if isinstance(exc, FieldError):
        return [{"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}]
    flag = getattr(exc, "flag", None)  # service.jobflags.JobFlagError names its flag
    if isinstance(flag, str):
        return [{"loc": ["body", flag.replace("-", "_")], "msg": str(exc), "type": "value_error"}]
    return [{"loc": ["body"], "msg": str(exc), "type": type(exc).__name__}]


def error_response(request: Request, status: int, problems: list[dict[str, Any]]) -> Response:
    """JSON for /api, an HTML page (escaped) for the pages."""
    if request.url.path.startswith("/api"):
        return TuneplanJSON({"detail": problems}, status_code=status)
    templates: Jinja2Templates = request.app.state.templates
    return templates.TemplateResponse(request, "error.html", {"problems": problems,
                                                              "status": status},
                                      status_code=status)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    return error_response(request, 422, problems_of(exc))


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """404, 405, 413, ... in the one error shape: ``detail`` is a list of (loc, msg, type)."""
    if isinstance(exc.detail, list):
        problems = exc.detail
    else:
        problems = [{"loc": [], "msg": str(exc.detail)[:200],
                     "type": f"http_{exc.status_code}"}]
    response = error_response(request, exc.status_code, problems)
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


async def _tuneplan_error(request: Request, exc: TuneplanError) -> Response:
    from tuneplan.web.capacity import RateLimitedError, ServerBusyError

    if isinstance(exc, ServerBusyError):  # 503 busy / 429 rate-limited, with Retry-After
        kind = "rate_limited" if isinstance(exc, RateLimitedError) else "busy"
        response = error_response(request, exc.status, [{"loc": [], "msg": str(exc),
                                                         "type": kind}])
        response.headers["Retry-After"] = str(exc.retry_after_s)
        return response
    if isinstance(exc, BadInputError):
        return error_response(request, 422, problems_of(exc))
    status = 503 if isinstance(exc, CatalogError) else 500
    return error_response(request, status, [{"loc": [], "msg": " ".join(str(exc).split()),
                                             "type": type(exc).__name__}])


def html(request: Request, name: str, context: dict[str, Any], status: int = 200
         ) -> HTMLResponse:
    """Render a template with the request in its context."""
    templates: Jinja2Templates = request.app.state.templates
    response: HTMLResponse = templates.TemplateResponse(request, name, context,
                                                        status_code=status)
    return response
