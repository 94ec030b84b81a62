"""HTTP plumbing shared by the live importers: GET/POST with a timeout, status and body checks.

Every failure (connection, timeout, HTTP status, unreadable JSON) becomes one ``FetchError``
line naming the URL, so a refresh can report it and keep the previous snapshot. Sources that
need a key read it here from the environment; absent, they raise ``SourceSkipped``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx

from tuneplan.errors import CatalogError

#: Seconds to wait for connect/read on every request (the whole fetch is bounded by pages).
TIMEOUT_S = 30.0
#: A paginated source that never ends is a bug or an attack; stop and fail instead.
MAX_PAGES = 500
USER_AGENT = "tuneplan-catalog-refresh (+https://github.com/tuneplan)"
#: Throttled (HTTP 429) requests are retried this many times, waiting Retry-After (capped).
RETRIES_ON_429 = 3
MAX_RETRY_WAIT_S = 10.0


class FetchError(CatalogError):
    """A source could not be downloaded or its body could not be read."""


class SourceSkipped(CatalogError):
    """A source that cannot run here (e.g. its API key is not set); not a failure."""


def api_key(env_name: str, source: str) -> str:
    """The API key of a source from the environment, or ``SourceSkipped`` saying which variable."""
    value = os.environ.get(env_name, "").strip()
    if not value:
        raise SourceSkipped(f"{source}: skipped, set {env_name} to an API key to include it")
    return value


def fetch_bytes(client: httpx.Client, method: str, url: str, **kwargs: Any) -> bytes:
    """Send one request and return the body; any transport error or non-2xx is a FetchError."""
    headers = {"User-Agent": USER_AGENT, **kwargs.pop("headers", {})}
    for attempt in range(RETRIES_ON_429 + 1):
        try:
            response = client.request(method, url, headers=headers, timeout=TIMEOUT_S, **kwargs)
        except httpx.TimeoutException as exc:
            raise FetchError(f"timeout after {TIMEOUT_S:g} s fetching {_short(url)}") from exc
        except httpx.HTTPError as exc:
            raise FetchError(f"network error fetching {_short(url)}: {exc}") from exc
        if response.status_code != 429 or attempt == RETRIES_ON_429:
            break
        time.sleep(_retry_wait_s(response.headers.get("Retry-After")))
    if response.status_code >= 400:
        raise FetchError(f"HTTP {response.status_code} from {_short(url)}")
    return response.content


def _retry_wait_s(header: str | None) -> float:
    try:
        wait = float(header) if header else 1.0
    except ValueError:
        wait = 1.0
    return min(max(wait, 0.0), MAX_RETRY_WAIT_S)


def fetch_json(client: httpx.Client, method: str, url: str, **kwargs: Any) -> Any:
    """Send one request and decode its JSON body (truncated or invalid JSON is a FetchError)."""
    body = fetch_bytes(client, method, url, **kwargs)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FetchError(f"unreadable JSON from {_short(url)} ({len(body)} bytes): {exc}") from exc


def fetch_text(client: httpx.Client, url: str, **kwargs: Any) -> str:
    """GET a text body (CSV) decoded as UTF-8; undecodable bytes are a FetchError."""
    body = fetch_bytes(client, "GET", url, **kwargs)
    try:
        return body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FetchError(f"body of {_short(url)} is not UTF-8 text: {exc}") from exc


def _short(url: str) -> str:
    # Query strings can be long (OData filters) and may carry keys; the path says enough.
    return url.split("?", 1)[0]

