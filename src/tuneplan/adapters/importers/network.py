"""HTTP plumbing shared by the live importers: timeouts, bounded retries, conditional GETs.

Every failure (connection, timeout, HTTP status, unreadable JSON) becomes one ``FetchError``
line naming the URL without its query string, so a refresh can report it and keep the
previous snapshot. No error text echoes a header or a query: API keys travel in headers
(``api_key`` reads them from the environment; absent, a source raises ``SourceSkipped``).

Retries (``RetryPolicy``): a transport error (connection refused or reset, timeout, a body
cut short), HTTP 429 and the transient 5xx statuses are retried with exponential backoff and
jitter, at most ``attempts`` tries in all; a ``Retry-After`` header (delay-seconds or an
HTTP-date, RFC 9110 section 10.2.3) on a 429 or 503 is honoured, capped at
``max_retry_after_s``. The POSTs sent here are read-only queries (RunPod's GraphQL
``gpuTypes``, vast.ai's offer search), so retrying them is as safe as retrying a GET.
Conditional requests (``HttpCache``): a GET with a cache sends the
``ETag``/``Last-Modified`` of the last good body as ``If-None-Match``/``If-Modified-Since``
(RFC 9110 section 13.1), and a 304 answer returns that body from disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx

from tuneplan.errors import CatalogError

#: Seconds to wait for connect/read on every request (the whole fetch is bounded by pages).
TIMEOUT_S = 30.0
#: A paginated source that never ends is a bug or an attack; stop and fail instead.
MAX_PAGES = 500
USER_AGENT = "tuneplan-catalog-refresh (+https://github.com/tuneplan)"
#: Statuses worth another try: throttled, and the 5xx a server or proxy sends while it is
#: overloaded or restarting (501 Not Implemented and 505 will not change on a retry).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 507, 508, 520, 521, 522, 523, 524})
#: Longest ``Retry-After`` wait honoured, in seconds; a server asking more gets this.
MAX_RETRY_WAIT_S = 10.0


class FetchError(CatalogError):
    """A source could not be downloaded or its body could not be read."""


class SourceSkipped(CatalogError):
    """A source that cannot run here (e.g. its API key is not set); not a failure."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how long to retry. ``sleep``, ``jitter`` (a number in [0, 1)) and ``now``
    are injectable so tests neither wait nor depend on the clock.

    The n-th retry (n = 1, 2, ...) waits ``min(max_backoff_s, base_backoff_s * 2**(n-1))``
    scaled by ``0.5 + jitter() / 2`` ("equal jitter": never less than half the step, so
    clients that failed together spread out), unless the answer carried ``Retry-After``.
    """

    attempts: int = 4
    base_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = MAX_RETRY_WAIT_S
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random
    now: Callable[[], datetime] = _utc_now

    def backoff_s(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1-based) when the server named no delay."""
        step = min(self.max_backoff_s, self.base_backoff_s * 2 ** (retry - 1))
        return float(step * (0.5 + min(max(self.jitter(), 0.0), 1.0) / 2))

    def retry_after_s(self, header: str | None) -> float | None:
        """Seconds a ``Retry-After`` value asks for, capped; None when absent or unreadable."""
        text = (header or "").strip()
        if not text:
            return None
        if text.isdigit():
            wait = float(text[:12])
        else:
            try:
                when = parsedate_to_datetime(text)
            except (TypeError, ValueError, IndexError):
                return None
            if when.tzinfo is None:  # an HTTP-date is always GMT
                when = when.replace(tzinfo=UTC)
            wait = (when - self.now()).total_seconds()
        return min(max(wait, 0.0), self.max_retry_after_s)


#: The policy used when a caller passes none; tests may replace it (monkeypatch).
DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True, slots=True)
class HttpCache:
    """The last good body of each GET URL with its validators, one pair of files per URL.

    ``directory`` comes from ``adapters.store.default_cache_dir`` (the adapter that owns the
    per-user paths). Writes are atomic (temp file + rename); a cache that cannot be written
    or read is no cache, never a failed fetch.
    """

    directory: Path

    def _paths(self, url: str) -> tuple[Path, Path]:
        key = hashlib.sha256(url.encode("utf-8")).hexdigest()
        return self.directory / f"{key}.body", self.directory / f"{key}.json"

    def validators(self, url: str) -> dict[str, str]:
        """Conditional request headers for ``url`` (empty when nothing usable is cached)."""
        body, meta = self._paths(url)
        try:
            saved = json.loads(meta.read_text(encoding="utf-8"))
            if not body.is_file() or saved.get("url") != url:
                return {}
        except (OSError, ValueError, AttributeError):
            return {}
        headers = {}
        if isinstance(saved.get("etag"), str):
            headers["If-None-Match"] = saved["etag"]
        if isinstance(saved.get("last_modified"), str):
            headers["If-Modified-Since"] = saved["last_modified"]
        return headers

    def body(self, url: str) -> bytes | None:
        """The cached body of ``url``, or None."""
        try:
            return self._paths(url)[0].read_bytes()
        except OSError:
            return None

    def store(self, url: str, response: httpx.Response) -> None:
        """Keep ``response``'s body when it carries a validator; without one, forget ``url``
        (an older body must never answer a later 304)."""
        etag, modified = response.headers.get("ETag"), response.headers.get("Last-Modified")
        body, meta = self._paths(url)
        if not etag and not modified:
            for path in (meta, body):
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
            return
        with contextlib.suppress(OSError):
            self.directory.mkdir(parents=True, exist_ok=True)
            _write_atomic(body, response.content)
            _write_atomic(meta, json.dumps({"url": url, "etag": etag,
                                            "last_modified": modified}).encode("utf-8"))


def _write_atomic(path: Path, data: bytes) -> None:
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def api_key(env_name: str, source: str) -> str:
    """The API key of a source from the environment, or ``SourceSkipped`` saying which variable."""
    value = os.environ.get(env_name, "").strip()
    if not value:
        raise SourceSkipped(f"{source}: skipped, set {env_name} to an API key to include it")
    return value


def fetch_bytes(client: httpx.Client, method: str, url: str, *, cache: HttpCache | None = None,
                retry: RetryPolicy | None = None, **kwargs: Any) -> bytes:
    """Send one request (retried per ``retry``) and return the body; a GET with ``cache`` is
    conditional and a 304 returns the cached body. Every failure is one FetchError line."""
    policy = retry or DEFAULT_RETRY
    headers = {"User-Agent": USER_AGENT, **kwargs.pop("headers", {})}
    conditional = cache is not None and method.upper() == "GET"
    try:
        full_url = str(_request_url(url, kwargs.get("params")))
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise FetchError(f"invalid URL {_short(str(url))[:120]!r}: {_one_line(exc, url)}") from exc
    if conditional and cache is not None:
        headers.update(cache.validators(full_url))
    where = _short(url)
    attempts = max(1, policy.attempts)
    for attempt in range(1, attempts + 1):
        wait: float | None = None
        try:
            response = client.request(method, url, headers=headers, timeout=TIMEOUT_S, **kwargs)
        except httpx.TimeoutException as exc:
            failure = f"timeout after {TIMEOUT_S:g} s fetching {where}"
            cause: Exception = exc
        except httpx.TransportError as exc:
            failure = f"network error fetching {where}: {_one_line(exc, url)}"
            cause = exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # redirects, bad encoding: final
            raise FetchError(f"error fetching {where}: {_one_line(exc, url)}") from exc
        else:
            if response.status_code not in RETRY_STATUSES:
                return _body(response, full_url, where, cache if conditional else None)
            failure = f"HTTP {response.status_code} from {where}"
            cause = FetchError(failure)
            if response.status_code in (429, 503):
                wait = policy.retry_after_s(response.headers.get("Retry-After"))
        if attempt == attempts:
            tries = f" ({attempts} attempts)" if attempts > 1 else ""
            raise FetchError(failure + tries) from cause
        policy.sleep(wait if wait is not None else policy.backoff_s(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _request_url(url: str, params: Any) -> httpx.URL:
    """The URL the client sends (its query merged with ``params``, as httpx does)."""
    merged = httpx.URL(url)
    return merged.copy_merge_params(params) if params else merged


def _body(response: httpx.Response, full_url: str, where: str,
          cache: HttpCache | None) -> bytes:
    if response.status_code == 304 and cache is not None:
        cached = cache.body(full_url)
        if cached is None:
            raise FetchError(f"HTTP 304 from {where} but no cached copy is left")
        return cached
    if response.status_code >= 300:
        raise FetchError(f"HTTP {response.status_code} from {where}")
    if cache is not None:
        cache.store(full_url, response)
    return response.content


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


_URL_QUERY = re.compile(r"(\w+://[^\s?'\"]*)\?[^\s'\"]*")


def _one_line(exc: Exception, url: str) -> str:
    """An error's text on one line, at most 200 chars, with no URL query in it (a query may
    carry a key): ``url``'s query is cut wherever it appears, and so is any other URL's."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    query = str(url).split("?", 1)[1] if "?" in str(url) else ""
    if query:
        text = text.replace(query, "…")
    return _URL_QUERY.sub(r"\1", text)[:200]
