"""Refresh the catalog from live sources, one atomic snapshot per source.

Each source is fetched and parsed fully in memory, then written with one
``store.replace_source`` transaction. A source that fails (network, HTTP status, timeout,
unreadable payload, no valid offers, mostly rejected rows, a crash in its parser or during
the write) keeps its previous snapshot exactly, yields a one-line reason, and never stops the
others. A key-less source that needs a key is skipped, not failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import partial

import httpx

from tuneplan.adapters.importers import (
    aws,
    azure,
    gpuhunt,
    lambda_cloud,
    runpod,
    skypilot_live,
    snapshot,
    vastai,
)
from tuneplan.adapters.importers.base import ImportResult, utc_now
from tuneplan.adapters.importers.network import SourceSkipped
from tuneplan.adapters.store import CatalogStore
from tuneplan.errors import CatalogError, InvalidValueError

#: A source whose rows are more than half rejected is treated as broken (a unit or schema
#: change upstream), and its previous snapshot is kept.
MAX_REJECTED_SHARE = 0.5

Fetcher = Callable[..., ImportResult]


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSource:
    """One refreshable store source: its name, the group ``--source`` also accepts, its fetch.

    ``opt_in`` sources run only when named (the AWS offer file is hundreds of MB per region).
    """

    name: str
    group: str
    fetch: Fetcher
    needs_key: str | None = None
    opt_in: bool = False
    supersedes: tuple[str, ...] = ()   # store sources this one replaces when it succeeds


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
        LiveSource(name=azure.SOURCE, group=azure.SOURCE, fetch=azure.fetch),
        LiveSource(name=aws.SOURCE, group=aws.SOURCE, fetch=aws.fetch, opt_in=True),
        LiveSource(name=runpod.SOURCE, group=runpod.SOURCE, fetch=runpod.fetch),
        LiveSource(name=vastai.SOURCE, group=vastai.SOURCE, fetch=vastai.fetch),
        LiveSource(name=gpuhunt.SOURCE, group=gpuhunt.SOURCE, fetch=gpuhunt.fetch),
        LiveSource(name=lambda_cloud.SOURCE, group=lambda_cloud.SOURCE, fetch=lambda_cloud.fetch,
                   needs_key=lambda_cloud.KEY_ENV),
    )
    clouds = tuple(
        LiveSource(name=skypilot_live.source_name(cloud), group=skypilot_live.SOURCE,
                   fetch=partial(skypilot_live.fetch, cloud=cloud),
                   supersedes=_bundled_sources_of(cloud))
        for cloud in skypilot_live.CLOUDS)
    return own + clouds


def select_sources(names: Iterable[str] | None,
                   available: tuple[LiveSource, ...] | None = None) -> tuple[LiveSource, ...]:
    """The sources named (a source or a group such as ``skypilot``); when ``names`` is None,
    every source that is not opt-in.

    Raises InvalidValueError (exit 2) naming the valid choices for an unknown name.
    """
    available = available if available is not None else live_sources()
    if names is None:
        return tuple(s for s in available if not s.opt_in)
    chosen: dict[str, LiveSource] = {}
    for name in names:
        key = name.strip().lower()
        matched = [s for s in available if key in (s.name, s.group)]
        if not matched:
            raise InvalidValueError(f"unknown source {name!r}: choose from "
                                    + ", ".join(valid_source_names(available)))
        chosen.update((s.name, s) for s in matched)
    return tuple(chosen.values())


def valid_source_names(available: tuple[LiveSource, ...] | None = None) -> list[str]:
    """Groups first, then every individual source name."""
    available = available if available is not None else live_sources()
    groups = dict.fromkeys(s.group for s in available)
    return [*groups, *(s.name for s in available if s.name not in groups)]


def refresh(store: CatalogStore, sources: Iterable[str] | None = None,
            client: httpx.Client | None = None, *,
            available: tuple[LiveSource, ...] | None = None,
            on_progress: Callable[[LiveSource, SourceOutcome | None], None] | None = None,
            ) -> list[SourceOutcome]:
    """Refresh ``sources`` (names or groups; all when None) into ``store``, one at a time.

    ``on_progress(source, None)`` is called before a source, ``(source, outcome)`` after.
    Raises InvalidValueError for an unknown source name, before anything is fetched.
    """
    chosen = select_sources(sources, available)
    own_client = client is None
    client = client or httpx.Client(follow_redirects=True)
    try:
        outcomes = []
        for source in chosen:
            if on_progress:
                on_progress(source, None)
            outcome = refresh_one(store, source, client)
            outcomes.append(outcome)
            if on_progress:
                on_progress(source, outcome)
        return outcomes
    finally:
        if own_client:
            client.close()


def _bundled_sources_of(cloud: str) -> tuple[str, ...]:
    """The bundled snapshot sources a live SkyPilot catalog of ``cloud`` replaces."""
    own = f"{snapshot.SOURCE_PREFIX}{cloud}"
    return (own, f"{own}-v7") if cloud == "runpod" else (own,)


def refresh_one(store: CatalogStore, source: LiveSource, client: httpx.Client) -> SourceOutcome:
    """Fetch, check and write one source; never raises (every failure becomes an outcome)."""
    started = time.monotonic()
    stamp = utc_now()
    try:
        result = source.fetch(client, fetched_at=stamp)
    except SourceSkipped as exc:
        return _outcome(source, "skipped", str(exc), started)
    except Exception as exc:  # a crash in one importer must not stop the others
        return _outcome(source, "failed", _reason(source, exc), started)
    problem = _implausible(result)
    if problem:
        return _outcome(source, "failed", f"{source.name}: {problem}; previous snapshot kept",
                        started, result)
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
