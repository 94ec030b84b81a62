"""CLI commands for speed and money: ``tuneplan throughput`` and ``tuneplan cost``.

Thin: job flags go through the shared parser (``tuneplan.service.jobflags``, the same flags and
``--job`` file as ``tuneplan memory``) into a ``Strategy``; resolve the model, GPU, offer
and provider through the adapters, call ``core.compute.throughput``; ``cost`` is the use case
``tuneplan.service.costing`` (the planner's own pricing). Present.
``register(app)`` adds both commands to the main Typer app.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tuneplan.core.compute.throughput import (
    Throughput,
    compute_job_from_strategy,
    estimate_throughput,
    model_shape_from_spec,
)
from tuneplan.errors import InvalidValueError
from tuneplan.service.jobflags import JOB_FLAGS_HELP
from tuneplan.units import HOUR_S, format_duration, parse_count, parse_duration, parse_size

Opt = typer.Option
_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
_EPILOG = (JOB_FLAGS_HELP + " Speed: --gpu NAME, --avg-tokens N (real tokens per unpacked "
           "sequence), --tokens 50M, --epochs N.")
ModelArg = Annotated[str, typer.Argument(help="Bundled name, HF id, folder or config.json.")]
JsonFlag = Annotated[bool, Opt("--json", help="Print one JSON document on stdout.")]
Fabric = Annotated[str, Opt("--fabric", help="Inside a node: auto, nvlink or pcie.")]


def job_flags(args: list[str], gpus: int | None = None) -> tuple[dict[str, Any], Any]:
    """(raw flags, Strategy) from the shared job-flag parser; ``gpus`` fills ``--gpus``
    when the flags leave it out (cost: the offer's GPU count)."""
    from tuneplan.service.jobflags import default_sharding, parse_job_args, strategy_from_flags

    flags = parse_job_args(args)
    if gpus is not None and "gpus" not in flags:
        flags["gpus"] = str(gpus)
    flags = default_sharding(flags)
    return flags, strategy_from_flags(flags)


def _throughput(model_name: str, gpu: Any, flags: dict[str, Any], strategy: Any, fabric: str,
                inter_node_bytes_per_s: float | None = None) -> tuple[Any, Throughput, Any]:
    from tuneplan.adapters.hub import resolve_model

    avg = flags.get("avg-tokens")
    job = compute_job_from_strategy(strategy, avg_tokens=int(avg) if avg else None,
                                    intra_node_link=fabric,
                                    inter_node_bytes_per_s=inter_node_bytes_per_s)
    shape = model_shape_from_spec(resolve_model(model_name))
    tokens = parse_count(str(flags["tokens"])) if flags.get("tokens") else None
    epochs = _positive(flags.get("epochs", 1), "epochs")
    from tuneplan.adapters.calibration import calibration_for  # saved probes (issue 9)

    result = estimate_throughput(shape, job, gpu, tokens=tokens, epochs=epochs,
                                 assumptions=calibration_for(gpu).throughput)
    return shape, result, job


def _positive(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(f"--{name}: {value!r} is not a number") from exc
    if not number > 0:
        raise InvalidValueError(f"--{name} must be above 0, got {value!r}")
    return number


def throughput_command(ctx: typer.Context, model: ModelArg, fabric: Fabric = "auto",
                       as_json: JsonFlag = False) -> None:
    """Tokens per second, step time, MFU, communication and hours of a training job."""
    from tuneplan.adapters.bundled import resolve_gpu_spec

    flags, strategy = job_flags(list(ctx.args))
    if not flags.get("gpu"):
        raise InvalidValueError("throughput needs --gpu NAME (see `tuneplan gpus`)")
    gpu = resolve_gpu_spec(str(flags["gpu"]))
    _, result, _ = _throughput(model, gpu, flags, strategy, fabric)
    if as_json:
        from tuneplan.cli.app import emit_json

        emit_json(result.as_dict())
        return
    _print_throughput(result)


def _print_throughput(result: Throughput) -> None:
    table = Table(title="Throughput")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("tokens/s (job)", f"{result.tokens_per_second:,.0f}")
    table.add_row("tokens/s per GPU", f"{result.tokens_per_second_per_gpu:,.0f}")
    table.add_row("step", format_duration(result.step_seconds))
    table.add_row("MFU", f"{100 * result.mfu:.1f} %")
    table.add_row("communication per step", f"{result.comm_seconds_per_step:.3f} s")
    if result.hours is not None:
        table.add_row("training time", format_duration(result.hours * HOUR_S))
    for term in result.step:
        table.add_row(f"  {term.path}", f"{term.value:.4f} s")
    Console().print(table)
    for note in result.notes:
        Console().print(f"note: {note}")


_PLAN_ID = re.compile(r"^[0-9a-f]{12}$")


def cost_command(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(
        help="A plan id from the last `tuneplan plan` (12 hex digits), or a model (bundled "
             "name, HF id, folder or config.json) with --offer.")],
    offer: Annotated[str | None, Opt("--offer", help="An offer id from `tuneplan offers "
                                                     "--json` (with a MODEL).")] = None,
    spot: Annotated[bool, Opt("--spot", help="Price on spot, with interruptions.")] = False,
    checkpoint_every: Annotated[str, Opt("--checkpoint-every", help="30m, 2h or auto")] = "auto",
    interruptions_per_hour: Annotated[float | None, Opt("--interruptions-per-hour")] = None,
    storage_idle_days: Annotated[float, Opt("--storage-idle-days")] = 0.0,
    dataset_size: Annotated[str | None, Opt("--dataset-size", help="e.g. 2GB")] = None,
    fabric: Fabric = "auto", as_json: JsonFlag = False,
) -> None:
    """Total cost of a job on one offer: billing, start-up, storage, egress, and spot.
    `tuneplan cost PLAN_ID` re-prices a plan of the last `tuneplan plan` exactly as it printed."""
    from tuneplan.core.planner.costing import CostOptions
    from tuneplan.service.costing import CostRequest, cost_on_offer, cost_saved_plan

    request = CostRequest(
        spot=spot, storage_idle_days=storage_idle_days, fabric=fabric,
        options=CostOptions(
            checkpoint_every_s=(None if checkpoint_every in (None, "auto")
                                else parse_duration(checkpoint_every)),
            interruptions_per_hour=interruptions_per_hour,
            dataset_bytes=parse_size(dataset_size) if dataset_size else None))
    if offer is None:
        if not _PLAN_ID.match(model):
            raise InvalidValueError("cost needs a PLAN_ID from `tuneplan plan`, or a MODEL "
                                    "with --offer OFFER_ID")
        if ctx.args:
            raise InvalidValueError(f"job flags ({' '.join(ctx.args)}) cannot change a saved "
                                    "plan: price it as it is, or give a MODEL with --offer")
        document = cost_saved_plan(model, request)
    else:
        from tuneplan.adapters.store import CatalogStore

        with CatalogStore.open() as store:
            found = store.offer(offer)
        if found is None:
            raise InvalidValueError(f"no offer with id {offer!r}: see `tuneplan offers --json`")
        flags, strategy = job_flags(list(ctx.args), gpus=found.gpu_count)
        document = cost_on_offer(model, offer, flags, strategy, request)
    if as_json:
        from tuneplan.cli.app import emit_json

        emit_json(document)
        return
    _print_cost(document)


def _usd(value: Decimal | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _print_cost(document: dict[str, Any]) -> None:
    nodes = document.get("nodes", 1)
    table = Table(title=f"Cost on {document['offer']['provider']} {document['offer']['gpu']} "
                        f"x{document['offer']['gpu_count']}"
                        + (f" x {nodes} nodes" if nodes > 1 else "")
                        + (f" (plan {document['plan_id']})" if document.get("plan_id") else ""))
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("wall time (on-demand)", format_duration(document["hours"] * HOUR_S))
    table.add_row("total cost", _usd(document["cost"]))
    table.add_row("  compute (billed)", _usd(document["compute_cost"]))
    table.add_row("  storage", _usd(document["storage_cost"]))
    table.add_row("  egress", _usd(document["egress_cost"]))
    spot = document["spot"]
    if spot:
        table.add_row("spot expected", _usd(spot["expected_cost"]))
        table.add_row("spot P50 / P90", f"{_usd(spot['p50_cost'])} / {_usd(spot['p90_cost'])}")
        table.add_row("interruptions expected", f"{spot['interruptions_expected']:.2f}")
    Console().print(table)
    for warning in document["warnings"]:
        Console().print(f"warning: {warning}")


def register(app: typer.Typer) -> None:
    """Add ``throughput`` and ``cost`` to ``app``."""
    app.command("throughput", context_settings=_CONTEXT, epilog=_EPILOG)(throughput_command)
    app.command("cost", context_settings=_CONTEXT, epilog=_EPILOG)(cost_command)
