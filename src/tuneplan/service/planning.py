"""Planning use cases both faces share: plan a job over the catalog (and keep the result for
``launch``/``cost``), explain an impossible job, and the fit solver on one GPU.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tuneplan.core.catalog.offers import Offer
from tuneplan.core.job.strategy import Job
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.fit import FitReport
from tuneplan.core.planner.plan import PlanResult
from tuneplan.errors import InfeasibleJobError, InvalidValueError


def plan_job(job: Job, model: ModelSpec, *, store_path: str | Path | None = None,
             now: datetime | None = None) -> PlanResult:
    """Ranked plans for ``job`` over the catalog at ``store_path`` (default: the user's)."""
    return plan_job_stamped(job, model, store_path=store_path, now=now)[0]


def plan_job_stamped(job: Job, model: ModelSpec, *, store_path: str | Path | None = None,
                     now: datetime | None = None) -> tuple[PlanResult, tuple[str, int]]:
    """``plan_job`` and the stamp of the catalog it planned over (``CatalogStore.stamp``)."""
    from tuneplan.adapters.plans import plan

    stamp, offers = current_offers(store_path)
    return plan(job, model=model, offers=offers, now=now or datetime.now(UTC)), stamp


_CURRENT: dict[str, tuple[tuple[str, int], list[Offer]]] = {}


def current_offers(store_path: str | Path | None = None
                   ) -> tuple[tuple[str, int], list[Offer]]:
    """(stamp, every current offer) of the catalog at ``store_path``: read once and kept while
    the stamp holds, so a process that plans many times (a server's planning worker) reads the
    ~4,700 offers once per catalog change, not once per plan. Callers must not mutate the list.
    """
    from tuneplan.adapters.store import CatalogStore

    with CatalogStore.open(store_path) as store:
        key = str(store.path)
        kept = _CURRENT.get(key)
        if kept is not None and kept[0] == store.stamp():
            return kept
        page = store.offer_page()
    if len(_CURRENT) >= 4:  # a process plans over one catalog, a test over a few
        _CURRENT.clear()
    _CURRENT[key] = (page.stamp, page.offers)
    return _CURRENT[key]


def plan_json(result: PlanResult, top: int, *, store_path: str | Path | None = None,
              now: datetime | None = None) -> dict[str, Any]:
    """``tuneplan plan --json`` (and ``/api/plan``) for a result."""
    from tuneplan.adapters.plans import catalog_info
    from tuneplan.service.plan_report import plan_document

    return plan_document(result, catalog_info(now, path=store_path), top)


def plan_and_keep(job: Job, model: ModelSpec, top: int, *, now: datetime | None = None
                  ) -> tuple[PlanResult, dict[str, Any]]:
    """The CLI's ``plan``: plans, their document, the document saved for ``launch``/``cost``;
    InfeasibleJobError (with the fit solver's cheapest changes) when nothing fits."""
    from tuneplan.adapters.plans import save_last_plan

    now = now or datetime.now(UTC)
    result = plan_job(job, model, now=now)
    if not result.plans:
        raise InfeasibleJobError(infeasible_message(job, result, model))
    document = plan_json(result, top, now=now)
    save_last_plan(document)
    return result, document


def infeasible_message(job: Job, result: PlanResult, model: ModelSpec) -> str:
    """Why nothing fits, and the fit solver's cheapest changes on the largest card tried."""
    from tuneplan.adapters.bundled import load_gpu_spec
    from tuneplan.core.planner.fit import describe_suggestions, fit
    from tuneplan.core.planner.search import StrategySearch

    if not result.rejected:
        return (f"no offer passes the job's filters ({result.considered} considered); "
                "loosen --provider/--region/--gpu/--max-gpus")
    worst = max(result.rejected, key=lambda r: r.offer.gpu_memory_bytes)
    gpu = load_gpu_spec(worst.offer.gpu)
    search = StrategySearch(model=model, base=job.strategy,
                            tokens=job.tokens_per_epoch, epochs=job.epochs)
    report = fit(search, gpu)  # changes may break --max-gpus: that is a change too
    hint = describe_suggestions(report) or "no single change makes it fit"
    return (f"no plan: {len(result.rejected)} offers rejected, e.g. {worst.offer.gpu_count}x "
            f"{gpu.name}: {worst.reason}. Changes on {gpu.name}: {hint}")


def fit_job(job: Job, model: ModelSpec) -> FitReport:
    """The fit solver on ``job.gpu``: largest micro-batch and sequence per method, and the
    cheapest changes that make the job fit."""
    from tuneplan.adapters.bundled import resolve_gpu_spec
    from tuneplan.core.planner.fit import fit
    from tuneplan.core.planner.search import StrategySearch

    if not job.gpu:
        raise InvalidValueError("fit needs --gpu NAME (see `tuneplan gpus`)")
    gpu = resolve_gpu_spec(job.gpu)
    search = StrategySearch(model=model, base=job.strategy,
                            tokens=job.tokens_per_epoch, epochs=job.epochs)
    return fit(search, gpu, max_gpus=job.max_gpus or 64)


def fit_document(model: ModelSpec, report: FitReport) -> dict[str, Any]:
    """``tuneplan fit --json``."""
    return {"model": model.name, **report.as_dict()}
