"""gpuhunt's online providers (a cloud API queried at refresh time), run over our HTTP.

gpuhunt 0.1.34 serves some providers from no published catalog: its provider class asks the
cloud's API when queried. Each such class sends its requests with the ``requests`` library to
a base URL held in a module constant (``gpuhunt/providers/vastai.py: bundles_url``,
``gpuhunt/providers/vultr.py: API_URL``). Here, for the time of one query, that module's
``requests`` is replaced by a stand-in that sends every request through
``network.fetch_bytes`` (timeouts, retries with backoff, one-line errors that never echo a
header), and the constant by ``base_url`` when one is given (a local replay server in tests).
What the provider makes of the answers (GPU names, per-GPU memory, spot variants, skipped
plans) is gpuhunt's; its ``CatalogItem`` objects become offers exactly as the offline
catalog's do (``gpuhunt._offers``), and every plan it skips with a warning is a rejected row.

The providers listed are those with a response shape replayed in the tests: vast.ai's offer
search (``POST bundles/``: every rentable offer on the marketplace; no key), Vultr's plan
lists (``GET /plans-metal`` and ``/plans``: public; the account-specific availability of VDM
plans needs a key and is not asked for) and DigitalOcean's droplet sizes (``GET /v2/sizes``,
with the token of ``DIGITAL_OCEAN_API_KEY`` in the Authorization header; skipped without it).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from types import ModuleType
from typing import Any

import httpx

from tuneplan.adapters.importers import gpuhunt
from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import FetchError, api_key, fetch_bytes
from tuneplan.adapters.importers.validation import PayloadError


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineProvider:
    """One gpuhunt online provider: its module, class, base-URL constant and default URL."""

    name: str
    module: str
    cls: str
    url_constant: str
    default_url: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    key_env: str | None = None     # the API key's variable (gpuhunt's own name), if one is needed
    url_kwarg: str | None = None   # the class takes its base URL as this argument instead


#: gpuhunt 0.1.34 online providers wired here, by gpuhunt provider name.
PROVIDERS: dict[str, OnlineProvider] = {
    # vastai.py: ``bundles_url``; VastAIProvider() asks for community and datacenter offers.
    "vastai": OnlineProvider(name="vastai", module="gpuhunt.providers.vastai",
                             cls="VastAIProvider", url_constant="bundles_url",
                             default_url="https://console.vast.ai/api/v0/bundles/"),
    # vultr.py: ``API_URL``; without a key only the public plan lists are read.
    "vultr": OnlineProvider(name="vultr", module="gpuhunt.providers.vultr",
                            cls="VultrProvider", url_constant="API_URL",
                            default_url="https://api.vultr.com/v2",
                            kwargs=(("api_key", None),)),
    # digitalocean.py: ``GET <api_url>/v2/sizes`` needs a token (DigitalOceanProvider.from_env
    # reads DIGITAL_OCEAN_API_KEY); ``STANDARD_CLOUD_API_URL`` is the default ``api_url``.
    "digitalocean": OnlineProvider(name="digitalocean", module="gpuhunt.providers.digitalocean",
                                   cls="DigitalOceanProvider",
                                   url_constant="STANDARD_CLOUD_API_URL",
                                   default_url="https://api.digitalocean.com",
                                   key_env="DIGITAL_OCEAN_API_KEY", url_kwarg="api_url"),
}
#: A provider module's ``requests`` and URL constant are process-wide: one query at a time.
_LOCK = threading.Lock()


class _Response:
    """What gpuhunt's provider code reads from a ``requests.Response``: the status (always a
    success here: ``fetch_bytes`` raises for any other) and the JSON body."""

    status_code = 200

    def __init__(self, body: bytes, where: str) -> None:
        self.content = body
        self._where = where

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def raise_for_status(self) -> None:
        return None

    def json(self) -> Any:
        try:
            return json.loads(self.content)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FetchError(f"unreadable JSON from {self._where} "
                             f"({len(self.content)} bytes): {exc}") from exc


class _Requests:
    """Stand-in for the ``requests`` module inside one gpuhunt provider module: ``request``,
    ``get`` and ``post`` go through ``fetch_bytes`` on our client. ``RequestException`` is
    ``FetchError``, so a provider that catches request failures catches ours."""

    RequestException = FetchError

    def __init__(self, client: httpx.Client, provider: str) -> None:
        self._client = client
        self._provider = provider

    def request(self, method: str, url: str, *, json: Any = None,
                headers: dict[str, str] | None = None, params: Any = None,
                **_ignored: Any) -> _Response:
        # ``timeout`` and other requests-only options are ignored: ours apply.
        extra: dict[str, Any] = {}
        if json is not None:
            extra["json"] = json
        if headers:
            extra["headers"] = dict(headers)
        if params:
            extra["params"] = params
        return _Response(fetch_bytes(self._client, method.upper(), url, **extra),
                         f"gpuhunt {self._provider}")

    def get(self, url: str, **kwargs: Any) -> _Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> _Response:
        return self.request("POST", url, **kwargs)


class _Warnings(logging.Handler):
    """The plans or offers a provider module skips (it logs one warning each)."""

    def __init__(self, provider: str) -> None:
        super().__init__(logging.WARNING)
        self.provider = provider
        self.rows: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.rows.append((f"gpuhunt {self.provider}", record.getMessage()[:200]))


def source_name(provider: str) -> str:
    """Store source of one gpuhunt online provider: ``gpuhunt/<provider>``."""
    return gpuhunt.source_name(provider)


def fetch(client: httpx.Client, *, provider: str, base_url: str | None = None,
          fetched_at: datetime | None = None) -> ImportResult:
    """Query one gpuhunt online provider through ``client`` and turn its items into offers.

    SourceSkipped when the gpuhunt library (extra ``tuneplan[catalog]``) is not installed;
    FetchError for a failed request; PayloadError when gpuhunt cannot read the answer.
    """
    spec = PROVIDERS[provider]
    kwargs = dict(spec.kwargs)
    if spec.key_env:
        kwargs["api_key"] = api_key(spec.key_env, source_name(provider))
    gpuhunt.require_library()
    from gpuhunt import QueryFilter

    module = importlib.import_module(spec.module)
    url = ((base_url or spec.default_url).rstrip("/")
           + ("/" if spec.default_url.endswith("/") else ""))
    patches: dict[str, Any] = {"requests": _Requests(client, provider)}
    if spec.url_kwarg:
        kwargs[spec.url_kwarg] = url
    else:
        patches[spec.url_constant] = url
    with _LOCK, _patched(module, **patches), _captured(spec.module, provider) as warnings:
        try:
            items = getattr(module, spec.cls)(**kwargs).get(QueryFilter(),
                                                            balance_resources=False)
        except FetchError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PayloadError(f"gpuhunt {provider}: unreadable answer "
                               f"({type(exc).__name__}: {str(exc)[:120]})") from exc
    kept, fractional = _whole_gpus(provider, _per_gpu_memory(provider, list(items)))
    if provider == "vastai":  # gpuhunt names an offer by its id alone: say what it is
        for item in kept:
            item.instance_name = f"{item.gpu_count}x {item.gpu_name} #{item.instance_name}"
    return gpuhunt.items_to_offers(provider, kept, [*warnings.rows, *fractional],
                                   fetched_at or utc_now())


def _whole_gpus(provider: str, items: list[Any]) -> tuple[list[Any], list[tuple[str, str]]]:
    """Items without the vGPU slices gpuhunt lists as one GPU with part of its memory (Vultr
    ``vcg-a100-1c-6g-4vram``: 4 GB of an 80 GB A100; gpuhunt ``vultr.get_gpu_memory`` gives
    the full card's GB)."""
    if provider != "vultr":
        return items, []
    from gpuhunt.providers.vultr import get_gpu_memory

    kept: list[Any] = []
    rejected: list[tuple[str, str]] = []
    for item in items:
        full = get_gpu_memory(item.gpu_name) if item.gpu_count and item.gpu_name else None
        if full and item.gpu_memory is not None and float(item.gpu_memory) < full:
            rejected.append((f"gpuhunt vultr {item.instance_name}",
                             f"fractional GPU: {item.gpu_memory:g} GB of a {full} GB "
                             f"{item.gpu_name}: not supported"))
        else:
            kept.append(item)
    return kept, rejected


def _per_gpu_memory(provider: str, items: list[Any]) -> list[Any]:
    """gpuhunt's DigitalOcean items carry the droplet's total VRAM as ``gpu_memory``
    (``digitalocean._make_offers`` copies ``gpu_info.vram.amount``: 640 for
    ``gpu-h100x8-640gb``), where every other provider gives it per GPU; divide it here, or
    an 8x H100 would read as a 640 GiB card."""
    if provider == "digitalocean":
        for item in items:
            if item.gpu_count and item.gpu_count > 1 and item.gpu_memory:
                item.gpu_memory = float(item.gpu_memory) / item.gpu_count
    return items


@contextlib.contextmanager
def _patched(module: ModuleType, **values: Any) -> Iterator[None]:
    before = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in before.items():
            setattr(module, name, value)


@contextlib.contextmanager
def _captured(logger_name: str, provider: str) -> Iterator[_Warnings]:
    """Route the provider module's skip warnings here, not to the terminal."""
    logger = logging.getLogger(logger_name)
    handler, propagate = _Warnings(provider), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
