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

from tuneplan.cli.options import (
    FormatOpt,
    JsonFlag,
    ModelArg,
    OutputFormat,
    WideOpt,
    emit_json,
    job_flags,
    make_console,
    output_format,
)
from tuneplan.service.jobs import JobRequest

TopOpt = Annotated[int, typer.Option("--top", min=1, max=1000,
                                     help="How many ranked plans to show.")]


@job_flags("plan")
def plan_command(model: ModelArg, request: JobRequest, top: TopOpt = 10,
                 as_json: JsonFlag = False, fmt: FormatOpt = None, wide: WideOpt = False
                 ) -> None:
    """Ranked plans over the whole catalog: memory fit, time, cost, why and warnings."""
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.adapters.plans import catalog_info
    from tuneplan.cli.render import render_infeasible, render_plans
    from tuneplan.service.planning import plan_and_keep, raise_if_infeasible

    chosen = output_format(fmt, as_json, wide=wide)
    job = request.job()
    now = datetime.now(UTC)
    result, document = plan_and_keep(job, resolve_model(job.model), top, now=now)
    if chosen is OutputFormat.JSON:
        emit_json(document)
    elif result.plans:
        render_plans(result, catalog_info(now), top, now, make_console(), chosen, wide)
    else:
        render_infeasible(result, make_console())
    raise_if_infeasible(result)


@job_flags("fit")
def fit_command(model: ModelArg, request: JobRequest, as_json: JsonFlag = False,
                fmt: FormatOpt = None, wide: WideOpt = False) -> None:
    """Largest micro-batch and sequence per method on one GPU, and changes that make it fit."""
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.cli.render import render_fit
    from tuneplan.service.planning import fit_document, fit_job

    chosen = output_format(fmt, as_json, wide=wide)
    spec = resolve_model(model)
    report = fit_job(request.job(), spec)
    if chosen is OutputFormat.JSON:
        emit_json(fit_document(spec, report))
        return
    render_fit(report, make_console(), chosen, wide)


def register(app: typer.Typer) -> None:
    """Add ``plan`` and ``fit`` to ``app``."""
    app.command("plan")(plan_command)
    app.command("fit")(fit_command)
