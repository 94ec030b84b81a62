"""Refresh the catalog from live sources, one atomic snapshot per source.

Sources are fetched and parsed concurrently (threads, one shared ``httpx.Client``), each
fully in memory; the calling thread then writes each with one ``store.replace_source``
transaction as it arrives (the SQLite connection never leaves that thread). A source that
fails (network, HTTP status, timeout, unreadable payload, no valid offers, mostly rejected
rows, a crash in its parser or during the write) keeps its previous snapshot exactly, yields
a one-line reason, and never stops the others. A source that needs a missing key (or library)
is skipped, not failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime
from functools import partial

import httpx

from tuneplan.adapters.importers import (
    aws,
    azure,
    gpuhunt,
    gpuhunt_online,
    lambda_cloud,
    runpod,
    skypilot_live,
    snapshot,
    vastai,
)
from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import HttpCache, SourceSkipped
from tuneplan.adapters.store import CatalogStore
from tuneplan.errors import CatalogError, InvalidValueError

#: A source whose rows are more than half rejected is treated as broken (a unit or schema
#: change upstream), and its previous snapshot is kept.
MAX_REJECTED_SHARE = 0.5
#: Sources fetched at the same time (each is a few requests; the client pools connections).
MAX_WORKERS = 8
#: ``--source`` word for every source, the opt-in ones included.
ALL = "all"

Fetcher = Callable[..., ImportResult]


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSource:
    """One refreshable store source: its name, the group ``--source`` also accepts, its fetch.

    ``opt_in`` sources run only when named (the AWS offer file is hundreds of MB per region),
    or with ``all``. ``cacheable`` sources take ``cache=`` (conditional GETs of public files);
    the others POST, or send a key whose answer should not be kept on disk.
    """

    name: str
    group: str
    fetch: Fetcher
    needs_key: str | None = None
    opt_in: bool = False
    supersedes: tuple[str, ...] = ()   # store sources this one replaces when it succeeds
    cacheable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceOutcome:
    """What happened to one source. ``status``: ok, failed or skipped; ``message``: one line."""

    source: str
    status: str
    message: str
    offers_written: int = 0
    unknown_gpu_names: tuple[str, ...] = ()
    rejected_rows: int = 0
    duration_s: float = 0.0

    @property
    def failed(self) -> bool:
        """True when the source failed (its previous snapshot was kept)."""
        return self.status == "failed"


def live_sources() -> tuple[LiveSource, ...]:
    """Every live source, in refresh order (SkyPilot clouds last: they are the most files)."""
    own = (
        LiveSource(name=azure.SOURCE, group=azure.SOURCE, fetch=azure.fetch, cacheable=True),
        LiveSource(name=aws.SOURCE, group=aws.SOURCE, fetch=aws.fetch, opt_in=True,
                   cacheable=True),
        LiveSource(name=runpod.SOURCE, group=runpod.SOURCE, fetch=runpod.fetch),
        LiveSource(name=vastai.SOURCE, group=vastai.SOURCE, fetch=vastai.fetch,
                   supersedes=(gpuhunt_online.source_name("vastai"),)),
        LiveSource(name=lambda_cloud.SOURCE, group=lambda_cloud.SOURCE, fetch=lambda_cloud.fetch,
                   needs_key=lambda_cloud.KEY_ENV),
    )
    # One source per gpuhunt provider (published independently); each retires the single
    # "gpuhunt" source that earlier versions wrote from the all-provider v2 archive.
    hunted = tuple(
        LiveSource(name=gpuhunt.source_name(provider), group=gpuhunt.SOURCE,
                   fetch=partial(gpuhunt.fetch, provider=provider),
                   supersedes=(gpuhunt.SOURCE,), cacheable=True)
        for provider in gpuhunt.PROVIDERS)
    # gpuhunt's online providers, run only when named (or with ``all``). gpuhunt/vastai and
    # "vastai" read the same marketplace: each retires the other, so the one refreshed last is
    # current, and when both are chosen only gpuhunt's runs.
    online = tuple(
        LiveSource(name=gpuhunt_online.source_name(provider), group=gpuhunt.SOURCE,
                   fetch=partial(gpuhunt_online.fetch, provider=provider), opt_in=True,
                   needs_key=gpuhunt_online.PROVIDERS[provider].key_env,
                   supersedes=(vastai.SOURCE,) if provider == "vastai" else ())
        for provider in gpuhunt_online.PROVIDERS)
    clouds = tuple(
        LiveSource(name=skypilot_live.source_name(cloud), group=skypilot_live.SOURCE,
                   fetch=partial(skypilot_live.fetch, cloud=cloud),
                   supersedes=_bundled_sources_of(cloud), cacheable=True)
        for cloud in skypilot_live.CLOUDS)
    return own + hunted + online + clouds


def select_sources(names: Iterable[str] | None,
                   available: tuple[LiveSource, ...] | None = None) -> tuple[LiveSource, ...]:
    """The sources named (a source, a group such as ``skypilot``, ``all``; each name may be a
    comma-separated list); when ``names`` is None, every source that is not opt-in.

    Raises InvalidValueError (exit 2) naming the valid choices for an unknown or empty name.
    """
    available = available if available is not None else live_sources()
    if names is None:
        return tuple(s for s in available if not s.opt_in)
    words = [word.strip() for name in names for word in name.split(",")]
    if not words or not all(words):
        raise InvalidValueError("--source names an empty source: choose from "
                                + ", ".join(valid_source_names(available)))
    chosen: dict[str, LiveSource] = {}
    for name in words:
        key = name.lower()
        matched = [s for s in available if key in (s.name, s.group, ALL)]
        if not matched:
            raise InvalidValueError(f"unknown source {name!r}: choose from "
                                    + ", ".join(valid_source_names(available)))
        chosen.update((s.name, s) for s in matched)
    # A source and one that replaces it would write the same offers twice: the opt-in
    # replacement (named, or taken by ``all``) runs, the default source it replaces does not.
    replaced = {old for s in chosen.values() if s.opt_in for old in s.supersedes}
    return tuple(s for s in chosen.values() if s.name not in replaced)


def valid_source_names(available: tuple[LiveSource, ...] | None = None) -> list[str]:
    """``all``, groups, then every individual source name."""
    available = available if available is not None else live_sources()
    groups = dict.fromkeys(s.group for s in available)
    return [ALL, *groups, *(s.name for s in available if s.name not in groups)]


def refresh(store: CatalogStore, sources: Iterable[str] | None = None,
            client: httpx.Client | None = None, *,
            available: tuple[LiveSource, ...] | None = None,
            on_progress: Callable[[LiveSource, SourceOutcome | None], None] | None = None,
            cache: HttpCache | None = None, max_workers: int = MAX_WORKERS,
            ) -> list[SourceOutcome]:
    """Refresh ``sources`` (names or groups; all but opt-in when None) into ``store``.

    Up to ``max_workers`` sources are fetched at once; each is written, all or nothing, in
    this thread as soon as it is parsed. Outcomes come back in ``select_sources`` order.
    ``on_progress(source, None)`` is called when a source starts (from a worker thread),
    ``(source, outcome)`` when it is done (from this thread): it must be thread-safe.
    ``cache`` makes the GETs of cacheable sources conditional (``network.HttpCache``).
    Raises InvalidValueError for an unknown source name, before anything is fetched.
    """
    chosen = select_sources(sources, available)
    own_client = client is None
    client = client or httpx.Client(follow_redirects=True)
    outcomes: dict[str, SourceOutcome] = {}
    try:
        workers = max(1, min(max_workers, len(chosen)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="refresh") as pool:
            futures = {pool.submit(_fetch_one, source, client, cache, on_progress): source
                       for source in chosen}
            for future in as_completed(futures):
                source = futures[future]
                outcome = _write_one(store, source, future.result())
                outcomes[source.name] = outcome
                if on_progress:
                    on_progress(source, outcome)
        return [outcomes[source.name] for source in chosen]
    finally:
        if own_client:
            client.close()


def _bundled_sources_of(cloud: str) -> tuple[str, ...]:
    """The bundled snapshot sources a live SkyPilot catalog of ``cloud`` replaces."""
    own = f"{snapshot.SOURCE_PREFIX}{cloud}"
    return (own, f"{own}-v7") if cloud == "runpod" else (own,)


@dataclass(frozen=True, slots=True)
class _Fetched:
    """A parsed source waiting to be written."""

    result: ImportResult
    stamp: datetime
    started: float


def refresh_one(store: CatalogStore, source: LiveSource, client: httpx.Client, *,
                cache: HttpCache | None = None) -> SourceOutcome:
    """Fetch, check and write one source; never raises (every failure becomes an outcome)."""
    return _write_one(store, source, _fetch_one(source, client, cache, None))


def _fetch_one(source: LiveSource, client: httpx.Client, cache: HttpCache | None,
               on_progress: Callable[[LiveSource, SourceOutcome | None], None] | None,
               ) -> _Fetched | SourceOutcome:
    """Fetch and check one source (any thread); never raises."""
    started = time.monotonic()
    stamp = utc_now()
    try:
        if on_progress:
            on_progress(source, None)
        extra = {"cache": cache} if cache is not None and source.cacheable else {}
        result = source.fetch(client, fetched_at=stamp, **extra)
    except SourceSkipped as exc:
        return _outcome(source, "skipped", str(exc), started)
    except Exception as exc:  # a crash in one importer must not stop the others
        return _outcome(source, "failed", _reason(source, exc), started)
    problem = _implausible(result)
    if problem:
        return _outcome(source, "failed", f"{source.name}: {problem}; previous snapshot kept",
                        started, result)
    return _Fetched(result, stamp, started)


def _write_one(store: CatalogStore, source: LiveSource,
               fetched: _Fetched | SourceOutcome) -> SourceOutcome:
    """Write one fetched source (the store's thread); never raises."""
    if isinstance(fetched, SourceOutcome):
        return fetched
    result, stamp, started = fetched.result, fetched.stamp, fetched.started
    try:
        written = store.replace_source(source.name, result.offers, _fetched_at(result, stamp),
                                       retires=source.supersedes)
    except Exception as exc:  # replace_source rolled back: the previous snapshot is intact
        return _outcome(source, "failed", _reason(source, exc, writing=True), started, result)
    message = f"{source.name}: {written} offers written" + _warnings(result)
    return _outcome(source, "ok", message, started, result, written)


def _implausible(result: ImportResult) -> str | None:
    """Why a parsed result must not replace the previous snapshot, or None."""
    rejected, valid = result.total_rejected, len(result.offers)
    if valid == 0:
        return (f"no valid offers ({rejected} rows rejected, "
                f"{len(result.unknown_gpu_names)} unknown GPU names)")
    if rejected > MAX_REJECTED_SHARE * (rejected + valid):
        return f"{rejected} of {rejected + valid} rows rejected (first: {result.rejected_rows[0]})"
    return None


def _fetched_at(result: ImportResult, stamp: datetime) -> datetime:
    return max((offer.fetched_at for offer in result.offers), default=stamp)


def _reason(source: LiveSource, exc: Exception, *, writing: bool = False) -> str:
    what = "writing failed" if writing else "failed"
    detail = str(exc).splitlines()[0] if str(exc) else ""
    kind = "" if isinstance(exc, CatalogError) else f"{type(exc).__name__}: "
    return f"{source.name}: {what}: {kind}{detail[:300]}; previous snapshot kept"


def _warnings(result: ImportResult) -> str:
    parts = []
    if result.total_rejected:
        parts.append(f"{result.total_rejected} rows rejected")
    if result.unknown_gpu_names:
        names = ", ".join(result.unknown_gpu_names[:5])
        more = len(result.unknown_gpu_names) - 5
        parts.append(f"unknown GPUs: {names}" + (f" (+{more} more)" if more > 0 else ""))
    return f" ({'; '.join(parts)})" if parts else ""


def _outcome(source: LiveSource, status: str, message: str, started: float,
             result: ImportResult | None = None, written: int = 0) -> SourceOutcome:
    return SourceOutcome(
        source=source.name, status=status, message=message, offers_written=written,
        unknown_gpu_names=result.unknown_gpu_names if result else (),
        rejected_rows=result.total_rejected if result else 0,
        duration_s=round(time.monotonic() - started, 3),
    )
