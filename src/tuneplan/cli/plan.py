"""``tuneplan plan`` and ``tuneplan fit``: ranked plans over the catalog, and the fit solver.

Thin: job flags go through ``tuneplan.service.jobflags`` (plus the planner's own flags below), the
work is ``adapters.plans`` / ``core.planner.plan`` / ``core.planner.fit``, presentation
``plan_report``.
An impossible job exits 2 with the fit solver's cheapest changes in its one-line message.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tuneplan.errors import InfeasibleJobError, InvalidValueError
from tuneplan.service.jobflags import JOB_FLAGS_HELP

if TYPE_CHECKING:
    from tuneplan.core.job.strategy import Job

_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
ModelArg = Annotated[str, typer.Argument(help="Bundled name, HF id, folder or config.json.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
PLAN_FLAGS_HELP = (
    "Planner flags: --budget USD, --deadline 12h, --provider aws,runpod, --region us-,eu-, "
    "--gpu NAME, --spot (spot may win) / --no-spot (no spot prices), --max-gpus N, "
    "--multi-node/--no-multi-node, --min-interconnect pcie|nvlink|nvswitch, --top N, "
    "--objective cost|time|pareto, --tokens 50M | --dataset-rows N --avg-tokens T, --epochs. "
    + JOB_FLAGS_HELP)
_VALUE = {"budget", "deadline", "provider", "providers", "region", "regions", "max-gpus",
          "min-interconnect", "top", "objective"}
_BOOL = {"spot", "multi-node"}


def split_planner_args(args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """(planner flags, the rest for ``parse_job_args``)."""
    mine: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        name, _, inline = args[i][2:].partition("=") if args[i].startswith("--") else ("", "", "")
        if name in _VALUE:
            if not inline and i + 1 >= len(args):
                raise InvalidValueError(f"--{name} needs a value")
            mine[name] = inline or args[i + 1]
            i += 1 if inline else 2
        elif name in _BOOL or (name.startswith("no-") and name[3:] in _BOOL):
            mine[name.removeprefix("no-")] = not name.startswith("no-")
            i += 1
        else:
            rest.append(args[i])
            i += 1
    return mine, rest


def _words(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return tuple(x.strip() for x in str(value).split(",") if x.strip())


def job_from_args(model: str, args: Sequence[str]) -> tuple[Job, dict[str, Any]]:
    """(Job, planner-only settings such as ``top``) from the command's extra arguments."""
    from tuneplan.core.job.strategy import Interconnect, Job, Objective
    from tuneplan.service.jobflags import parse_job_args, strategy_from_flags
    from tuneplan.units import parse_count, parse_duration, parse_usd

    mine, rest = split_planner_args(args)
    flags = parse_job_args(rest)
    planner = {k: flags.pop(k) for k in list(flags) if k in _VALUE or k in _BOOL} | mine
    strategy = strategy_from_flags(flags)
    get: Any = planner.get
    try:
        job = Job(
            model=model, strategy=strategy,
            tokens=parse_count(str(flags["tokens"])) if "tokens" in flags else None,
            dataset_rows=parse_count(str(flags["dataset-rows"])) if "dataset-rows" in flags
            else None,
            avg_tokens=parse_count(str(flags["avg-tokens"])) if "avg-tokens" in flags else None,
            epochs=float(flags.get("epochs", 1)),
            budget_usd=parse_usd(get("budget")) if get("budget") is not None else None,
            deadline_s=parse_duration(str(get("deadline"))) if get("deadline") else None,
            providers=_words(get("provider") or get("providers") or ()),
            regions=_words(get("region") or get("regions") or ()),
            gpu=str(flags["gpu"]) if flags.get("gpu") else None,
            spot=get("spot"), max_gpus=int(get("max-gpus")) if get("max-gpus") else None,
            multi_node=bool(get("multi-node", False)),
            min_interconnect=Interconnect(str(get("min-interconnect", "any"))),
            objective=Objective(str(get("objective", "cost"))))
    except ValueError as exc:
        raise InvalidValueError(f"bad planner flag: {exc}") from exc
    return job, {"top": int(get("top", 10))}


def plan_command(ctx: typer.Context, model: ModelArg, as_json: JsonOpt = False) -> None:
    """Ranked plans over the whole catalog: memory fit, time, cost, why and warnings."""
    from rich.console import Console

    from tuneplan.adapters.hub import resolve_model
    from tuneplan.adapters.plans import catalog_info, plan, save_last_plan
    from tuneplan.service.plan_report import plan_document, render_plans

    job, extra = job_from_args(model, ctx.args)
    now = datetime.now(UTC)
    spec = resolve_model(job.model)
    result = plan(job, now=now, model=spec)
    if not result.plans:
        raise InfeasibleJobError(_infeasible_message(job, result, spec))
    info = catalog_info(now)
    document = plan_document(result, info, extra["top"])
    save_last_plan(document)
    if as_json:
        from tuneplan.cli.app import emit_json

        emit_json(document)
        return
    render_plans(result, info, extra["top"], now, Console(width=200))


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


def fit_command(ctx: typer.Context, model: ModelArg, as_json: JsonOpt = False) -> None:
    """Largest micro-batch and sequence per method on one GPU, and changes that make it fit."""
    from rich.console import Console

    from tuneplan.adapters.bundled import resolve_gpu_spec
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.planner.fit import fit
    from tuneplan.core.planner.search import StrategySearch
    from tuneplan.service.plan_report import render_fit

    job, _ = job_from_args(model, ctx.args)
    if not job.gpu:
        raise InvalidValueError("fit needs --gpu NAME (see `tuneplan gpus`)")
    gpu = resolve_gpu_spec(job.gpu)
    search = StrategySearch(model=resolve_model(model), base=job.strategy,
                            tokens=job.tokens_per_epoch, epochs=job.epochs)
    report = fit(search, gpu, max_gpus=job.max_gpus or 64)
    if as_json:
        from tuneplan.cli.app import emit_json

        emit_json({"model": search.model.name, **report.as_dict()})
        return
    render_fit(report, Console())


def register(app: typer.Typer) -> None:
    """Add ``plan`` and ``fit`` to ``app``."""
    app.command("plan", context_settings=_CONTEXT, epilog=PLAN_FLAGS_HELP)(plan_command)
    app.command("fit", context_settings=_CONTEXT, epilog=PLAN_FLAGS_HELP)(fit_command)
