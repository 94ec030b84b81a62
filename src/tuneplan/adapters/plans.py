"""Run the planner on the user's catalog and keep the last result on disk.

``plan(job)`` resolves the model, loads the catalog (seeded from the bundled snapshot on first
use), GPU specs and provider terms, reads the clock, and calls ``core.planner.plan_offers``.
``save_last_plan``/``find_saved_plan`` keep the last plan document as JSON beside the catalog
(``$TUNEPLAN_HOME`` or the per-user data dir) so ``tuneplan launch PLAN_ID`` and ``tuneplan
cost PLAN_ID`` can find it; ``saved_plan_from_entry`` reads an entry back as a typed
``SavedPlan``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from tuneplan.core.catalog.offers import Offer, offer_from_record
from tuneplan.core.job.strategy import Job, Strategy
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.plan import PlanAssumptions, PlanResult, plan_offers
from tuneplan.core.planner.record import SavedPlan
from tuneplan.errors import InvalidValueError

LAST_PLAN_FILE = "last_plan.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogInfo:
    """Where the offers came from: newest fetch time and the sources with their ages."""

    fetched_at: datetime | None
    sources: tuple[dict[str, Any], ...]


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
                       now=now or datetime.now(UTC), assumptions=assumptions)


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


def find_saved_plan(plan_id: str) -> SavedPlan:
    """The plan with this id from the last saved result; InvalidValueError when absent."""
    path = _home() / LAST_PLAN_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidValueError(f"no saved plan at {path}: run `tuneplan plan` first") from exc
    # the ranked plans, then the plans an impossible job's relaxations quote (each entry of
    # ``relaxation_plans`` carries the job it meets, which wins over the document's)
    kept = document if isinstance(document, dict) else {}
    entries = [e for key in ("plans", "relaxation_plans")
               for e in (kept.get(key) or [] if isinstance(kept.get(key), list) else [])]
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == plan_id:
            return saved_plan_from_entry(
                {"job": document.get("job"), "model": document.get("model"), **entry})
    raise InvalidValueError(f"no plan {plan_id!r} in the last result ({path}); "
                            "run `tuneplan plan` again")


def _text_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidValueError(f"plan {where} is not a list of lines")
    return tuple(value)


#: The largest checkpoint a plan file may state: 2^60 bytes (an exbibyte), far above any
#: model's and small enough to stay exact as a float.
MAX_CHECKPOINT_BYTES = 2**60


def saved_plan_from_entry(entry: Mapping[str, Any]) -> SavedPlan:
    """A ``tuneplan plan --json`` entry (``plans[i]`` with the document's ``job`` and
    ``model``) back as a typed ``SavedPlan``: the job and strategy through their ``from_dict``,
    the offer through ``offer_from_record``. Raises InvalidValueError naming the bad part."""
    problems: list[str] = []

    def part(path: str, kind: Any, name: str) -> Any:
        node: Any = entry
        for key in path.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        if node is None or isinstance(node, bool) or not isinstance(node, kind):
            problems.append(f"{path} is missing or not {name}")
            return None
        return node

    plan_id = part("id", str, "text")
    job_raw, strategy_raw, offer_raw = (part(key, dict, "a mapping")
                                        for key in ("job", "strategy", "offer"))
    step_s = part("throughput.step_seconds", (float, int), "a number")
    total = part("memory.total_params", int, "a whole number")
    trainable = part("memory.trainable_params", int, "a whole number")
    if problems:
        raise InvalidValueError("plan cannot be read: " + "; ".join(problems))
    strategy_fields = dict(strategy_raw)
    link = str(strategy_fields.pop("link", ""))
    job = Job.from_dict(job_raw)
    strategy = Strategy.from_dict(strategy_fields)
    offer = offer_from_record(offer_raw)
    raw_cost = entry.get("cost")
    cost: Mapping[str, Any] = raw_cost if isinstance(raw_cost, Mapping) else {}
    raw_spot = cost.get("spot")
    spot: Mapping[str, Any] = raw_spot if isinstance(raw_spot, Mapping) else {}
    minutes = _number(spot.get("checkpoint_interval_minutes"))
    model = entry.get("model")
    raw_memory = entry.get("memory")
    ckpt = raw_memory.get("checkpoint_bytes") if isinstance(raw_memory, Mapping) else None
    if ckpt is not None and (isinstance(ckpt, bool) or not isinstance(ckpt, int)
                             or not 0 < ckpt <= MAX_CHECKPOINT_BYTES):
        raise InvalidValueError("plan cannot be read: memory.checkpoint_bytes is not a "
                                f"whole number of bytes from 1 to {MAX_CHECKPOINT_BYTES:,}")
    return SavedPlan(
        id=plan_id, model_id=model if isinstance(model, str) and model else job.model,
        job=job, strategy=strategy, offer=offer, link=link, step_s=float(step_s),
        total_params=total, trainable_params=trainable,
        hours=_number(cost.get("hours")), on_demand_usd=_usd(cost.get("on_demand_usd")),
        spot_usd=_usd(spot.get("expected_usd")), uses_spot=cost.get("uses_spot") is True,
        spot_interval_s=minutes * 60 if minutes else None,
        why=_text_list(entry.get("why", []), "why"),
        warnings=_text_list(entry.get("warnings", []), "warnings"), checkpoint_bytes=ckpt)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _usd(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return Decimal(str(value))
    except ArithmeticError:
        raise InvalidValueError(f"plan cost {value!r} is not an amount") from None
