"""Run the planner on the user's catalog and keep the last result on disk.

``plan(job)`` resolves the model, loads the catalog (seeded from the bundled snapshot on first
use), GPU specs and provider terms, reads the clock, and calls ``core.planner.plan_offers``.
``save_last_plan``/``find_saved_plan`` keep the last plan document as JSON beside the catalog
(``$TUNEPLAN_HOME`` or the per-user data dir) so ``tuneplan launch PLAN_ID`` can find it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tuneplan.core.catalog.offers import Offer
from tuneplan.core.job.strategy import Job
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.plan import PlanAssumptions, PlanResult, plan_offers
from tuneplan.errors import InvalidValueError

LAST_PLAN_FILE = "last_plan.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogInfo:
    """Where the offers came from: newest fetch time and the sources with their ages."""

    fetched_at: datetime | None
    sources: tuple[dict[str, Any], ...]


def _fabric_rates(providers: Sequence[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in providers:
        rate = p.multinode_fabric_bytes_per_s
        if rate:
            out[p.name] = rate
    return out


def plan(job: Job, *, offers: Sequence[Offer] | None = None,
         assumptions: PlanAssumptions | None = None, now: datetime | None = None,
         model: ModelSpec | None = None) -> PlanResult:
    """Plans for ``job`` over ``offers`` (default: the whole current catalog). ``model``, when
    given, is used instead of resolving ``job.model`` (the web app resolves it without paths)."""
    from tuneplan.adapters.bundled import load_gpu_specs, load_providers
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.adapters.store import load_catalog

    model = model if model is not None else resolve_model(job.model)
    specs = {spec.name: spec for spec in load_gpu_specs()}
    providers = load_providers()
    found = list(offers) if offers is not None else load_catalog()
    return plan_offers(model, job, found, specs, {p.name: p for p in providers},
                       now=now or datetime.now(UTC),
                       inter_node_bytes_per_s=_fabric_rates(providers), assumptions=assumptions)


def timed_plan(job: Job, **kwargs: Any) -> tuple[PlanResult, float]:
    """``plan`` and the seconds of compute it took (catalog load excluded when offers given)."""
    start = time.perf_counter()
    result = plan(job, **kwargs)
    return result, time.perf_counter() - start


def catalog_info(now: datetime | None = None, *, path: str | Path | None = None) -> CatalogInfo:
    """Age and sources of the current catalog (``catalog status``'s figures); ``path`` is the
    catalog file (default: the user's)."""
    from tuneplan.adapters.store import CatalogStore

    with CatalogStore.open(path) as store:
        status = store.status(now)
    sources = tuple({"source": s.source, "fetched_at": s.fetched_at, "offers": s.offers,
                     "age_s": s.age_s, "stale": s.stale} for s in status)
    newest = max((s.fetched_at for s in status), default=None)
    return CatalogInfo(fetched_at=newest, sources=sources)


def _plain(value: Any) -> Any:
    """JSON for what the document holds beside plain values: Decimal money, datetimes."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _home() -> Path:
    from tuneplan.adapters.store import default_path

    return default_path().parent


def save_last_plan(document: dict[str, Any]) -> Path:
    """Write the plan document as JSON (money as strings); returns the file's path."""
    path = _home() / LAST_PLAN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, default=_plain), encoding="utf-8")
    tmp.replace(path)  # atomic: a crash never leaves half a plan behind
    return path


def find_saved_plan(plan_id: str) -> dict[str, Any]:
    """The plan with this id from the last saved result; InvalidValueError when absent."""
    path = _home() / LAST_PLAN_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidValueError(f"no saved plan at {path}: run `tuneplan plan` first") from exc
    for entry in document.get("plans", []):
        if entry.get("id") == plan_id:
            return {"job": document.get("job"), **entry}
    raise InvalidValueError(f"no plan {plan_id!r} in the last result ({path}); "
                            "run `tuneplan plan` again")
