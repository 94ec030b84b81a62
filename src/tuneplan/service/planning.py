"""Planning use cases both faces share: plan a job over the catalog (and keep the result for
``launch``/``cost``), the one line for an impossible job (the why and the changes are the
planner's own, ``core.planner.infeasible``), and the fit solver on one GPU.
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
    from tuneplan.adapters.calibration import calibrated_for_job
    from tuneplan.adapters.plans import plan

    stamp, offers = current_offers(store_path)
    return plan(job, model=model, offers=offers, now=now or datetime.now(UTC),
                assumptions=calibrated_for_job(job, store_path)), stamp


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
    """The CLI's ``plan``: plans and their document, saved for ``launch``/``cost`` when there
    is a plan. An impossible job gives its document too (``feasible: false``, the binding
    constraints and relaxations), saved when a relaxation quotes a plan (its
    ``relaxation_plans``, found by id like ordinary plans); the face decides how to end
    (``infeasible_message``)."""
    from tuneplan.adapters.plans import save_last_plan

    now = now or datetime.now(UTC)
    result = plan_job(job, model, now=now)
    document = plan_json(result, top, now=now)
    if result.plans or result.relaxed:
        save_last_plan(document)
    return result, document


def infeasible_message(result: PlanResult) -> str:
    """One line for an impossible job: the binding constraints and the first relaxation."""
    if result.infeasible is None:
        return "no plan"
    return f"no plan: {result.infeasible.summary()}"


def raise_if_infeasible(result: PlanResult) -> None:
    """InfeasibleJobError (exit 2) with ``infeasible_message`` when ``result`` has no plan."""
    if not result.plans:
        raise InfeasibleJobError(infeasible_message(result))


def fit_job(job: Job, model: ModelSpec, *, store_path: str | Path | None = None) -> FitReport:
    """The fit solver on ``job.gpu`` with its saved probe calibration applied (memory and
    speed): largest micro-batch and sequence per method, and the changes that make the job
    fit (one-GPU ones first; more GPUs labelled with the nodes one offer of that GPU in the
    catalog holds)."""
    from tuneplan.adapters.bundled import resolve_gpu_spec
    from tuneplan.core.planner.fit import fit
    from tuneplan.core.planner.search import StrategySearch

    if not job.gpu:
        raise InvalidValueError("fit needs --gpu NAME (see `tuneplan gpus`)")
    gpu = resolve_gpu_spec(job.gpu)
    from tuneplan.adapters.calibration import calibration_for

    cal = calibration_for(gpu, store_path)  # the saved probe of this GPU, if any
    search = StrategySearch(model=model, base=job.strategy,
                            tokens=job.tokens_per_epoch, epochs=job.epochs,
                            memory_assumptions=cal.memory, throughput_assumptions=cal.throughput)
    per_node, basis = node_gpus(gpu.name, store_path=store_path)
    return fit(search, gpu, max_gpus=job.max_gpus or 64, node_gpus=per_node,
               node_gpus_basis=basis)


#: GPUs per node assumed when the catalog lists no offer of a GPU type (an 8-GPU board).
DEFAULT_NODE_GPUS = 8


def node_gpus(gpu: str, *, store_path: str | Path | None = None) -> tuple[int, str]:
    """The most GPUs of type ``gpu`` one offer in the catalog holds (one node) and where that
    comes from; ``DEFAULT_NODE_GPUS`` when the catalog lists none or cannot be read."""
    from tuneplan.adapters.store import load_catalog
    from tuneplan.errors import TuneplanError

    try:
        counts = [o.gpu_count for o in load_catalog(path=store_path) if o.gpu == gpu]
    except TuneplanError as exc:
        return DEFAULT_NODE_GPUS, f"assumed (catalog unreadable: {exc})"
    if not counts:
        return DEFAULT_NODE_GPUS, f"assumed (no {gpu} offer in the catalog)"
    return max(counts), f"catalog: largest {gpu} offer of {len(counts)}"


def fit_document(model: ModelSpec, report: FitReport) -> dict[str, Any]:
    """``tuneplan fit --json``."""
    return {"model": model.name, **report.as_dict()}
