"""``tuneplan plan`` and ``tuneplan fit``: ranked plans over the catalog, and the fit solver.

Thin: job flags go through ``tuneplan.service.jobflags`` (plus the planner's own flags below), the
work is ``adapters.plans`` / ``core.planner.plan`` / ``core.planner.fit``, presentation
``plan_report``.
An impossible job still prints its answer (the binding constraints and what relaxing each
gives; ``--json``: the document with ``feasible: false``) and exits 2.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from tuneplan.cli.options import JsonFlag, ModelArg, emit_json, job_flags
from tuneplan.service.jobs import JobRequest

TopOpt = Annotated[int, typer.Option("--top", min=1, max=1000,
                                     help="How many ranked plans to show.")]


@job_flags("plan")
def plan_command(model: ModelArg, request: JobRequest, top: TopOpt = 10,
                 as_json: JsonFlag = False) -> None:
    """Ranked plans over the whole catalog: memory fit, time, cost, why and warnings."""
    from rich.console import Console

    from tuneplan.adapters.hub import resolve_model
    from tuneplan.adapters.plans import catalog_info
    from tuneplan.cli.render import render_infeasible, render_plans
    from tuneplan.service.planning import plan_and_keep, raise_if_infeasible

    job = request.job()
    now = datetime.now(UTC)
    result, document = plan_and_keep(job, resolve_model(job.model), top, now=now)
    if as_json:
        emit_json(document)
    elif result.plans:
        render_plans(result, catalog_info(now), top, now, Console(width=200))
    else:
        render_infeasible(result, Console(width=200))
    raise_if_infeasible(result)


@job_flags("fit")
def fit_command(model: ModelArg, request: JobRequest, as_json: JsonFlag = False) -> None:
    """Largest micro-batch and sequence per method on one GPU, and changes that make it fit."""
    from rich.console import Console

    from tuneplan.adapters.hub import resolve_model
    from tuneplan.cli.render import render_fit
    from tuneplan.service.planning import fit_document, fit_job

    spec = resolve_model(model)
    report = fit_job(request.job(), spec)
    if as_json:
        emit_json(fit_document(spec, report))
        return
    render_fit(report, Console())


def register(app: typer.Typer) -> None:
    """Add ``plan`` and ``fit`` to ``app``."""
    app.command("plan")(plan_command)
    app.command("fit")(fit_command)
