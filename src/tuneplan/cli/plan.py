"""``tuneplan plan`` and ``tuneplan fit``: ranked plans over the catalog, and the fit solver.

Thin: job flags go through ``tuneplan.service.jobflags`` (plus the planner's own flags below), the
work is ``adapters.plans`` / ``core.planner.plan`` / ``core.planner.fit``, presentation
``plan_report``.
An impossible job exits 2 with the fit solver's cheapest changes in its one-line message.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from tuneplan.cli.options import JsonFlag, ModelArg, emit_json, job_flags
from tuneplan.errors import InfeasibleJobError, InvalidValueError
from tuneplan.service.jobs import JobRequest

TopOpt = Annotated[int, typer.Option("--top", min=1, max=1000,
                                     help="How many ranked plans to show.")]


@job_flags("plan")
def plan_command(model: ModelArg, request: JobRequest, top: TopOpt = 10,
                 as_json: JsonFlag = False) -> None:
    """Ranked plans over the whole catalog: memory fit, time, cost, why and warnings."""
    from rich.console import Console

    from tuneplan.adapters.hub import resolve_model
    from tuneplan.adapters.plans import catalog_info, plan, save_last_plan
    from tuneplan.service.plan_report import plan_document, render_plans

    job = request.job()
    now = datetime.now(UTC)
    spec = resolve_model(job.model)
    result = plan(job, now=now, model=spec)
    if not result.plans:
        raise InfeasibleJobError(_infeasible_message(job, result, spec))
    info = catalog_info(now)
    document = plan_document(result, info, top)
    save_last_plan(document)
    if as_json:
        emit_json(document)
        return
    render_plans(result, info, top, now, Console(width=200))


def _infeasible_message(job: Any, result: Any, model: Any) -> str:
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


@job_flags("fit")
def fit_command(model: ModelArg, request: JobRequest, as_json: JsonFlag = False) -> None:
    """Largest micro-batch and sequence per method on one GPU, and changes that make it fit."""
    from rich.console import Console

    from tuneplan.adapters.bundled import resolve_gpu_spec
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.planner.fit import fit
    from tuneplan.core.planner.search import StrategySearch
    from tuneplan.service.plan_report import render_fit

    job = request.job()
    if not job.gpu:
        raise InvalidValueError("fit needs --gpu NAME (see `tuneplan gpus`)")
    gpu = resolve_gpu_spec(job.gpu)
    search = StrategySearch(model=resolve_model(model), base=job.strategy,
                            tokens=job.tokens_per_epoch, epochs=job.epochs)
    report = fit(search, gpu, max_gpus=job.max_gpus or 64)
    if as_json:
        emit_json({"model": search.model.name, **report.as_dict()})
        return
    render_fit(report, Console())


def register(app: typer.Typer) -> None:
    """Add ``plan`` and ``fit`` to ``app``."""
    app.command("plan")(plan_command)
    app.command("fit")(fit_command)
