"""CLI commands for speed and money: ``tuneplan throughput`` and ``tuneplan cost``.

Thin: job flags go through the shared parser (``tuneplan.service.jobflags``, the same flags and
``--job`` file as ``tuneplan memory``) into a ``Strategy``; resolve the model, GPU, offer
and provider through the adapters, call ``core.compute.throughput`` / ``core.cost.estimate``,
present.
``register(app)`` adds both commands to the main Typer app.
"""

from __future__ import annotations

import re
import sys
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

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
    plain,
    safe,
)
from tuneplan.cli.tables import Column, print_table
from tuneplan.errors import InvalidValueError
from tuneplan.service.jobs import JobRequest
from tuneplan.units import HOUR_S, format_duration, parse_duration, parse_size

if TYPE_CHECKING:
    from tuneplan.core.compute.throughput import Throughput

Opt = typer.Option
Fabric = Annotated[str, Opt("--fabric", help="Inside a node: auto, nvlink or pcie.")]


@job_flags("throughput")
def throughput_command(model: ModelArg, request: JobRequest, fabric: Fabric = "auto",
                       as_json: JsonFlag = False) -> None:
    """Tokens per second, step time, MFU, communication and hours of a training job."""
    from tuneplan.service.speed import throughput_for

    result = throughput_for(request.job(), fabric=fabric)
    if as_json:
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
    basis = result.time_basis
    low, high = basis.speed_range(result.tokens_per_second)
    table.add_row("time basis", basis.text())
    table.add_row("tokens/s (job) range", f"{low:,.0f}-{high:,.0f}")
    if result.hours is not None:
        short, long = basis.duration_range(result.hours * HOUR_S)
        table.add_row("training time range",
                      f"{format_duration(short)}-{format_duration(long)}")
    for term in result.step:
        table.add_row(f"  {term.path}", f"{term.value:.4f} s")
    console = make_console()
    console.print(table)
    for note in result.notes:
        console.print(f"note: {safe(note)}")


_PLAN_ID = re.compile(r"^[0-9a-f]{12}$")


@job_flags("cost")
def cost_command(
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
    fabric: Fabric = "auto", as_json: JsonFlag = False, fmt: FormatOpt = None,
    wide: WideOpt = False, *, request: JobRequest,
) -> None:
    """Total cost of a job on one offer: billing, start-up, storage, egress, and spot.
    `tuneplan cost PLAN_ID` re-prices a plan of the last `tuneplan plan` exactly as it printed."""
    from tuneplan.core.planner.costing import CostOptions
    from tuneplan.service.costing import (
        CostRequest,
        cost_on_offer,
        cost_saved_plan,
        find_offer,
    )

    chosen = output_format(fmt, as_json, wide=wide)
    pricing = CostRequest(
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
        if request.values or request.job_file is not None:
            given = " ".join(f"--{name}" for name in request.values) or "--job"
            raise InvalidValueError(f"job flags ({given}) cannot change a saved plan: price "
                                    "it as it is, or give a MODEL with --offer")
        document = cost_saved_plan(model, pricing)
    else:
        found = find_offer(offer)
        job = request.job(defaults={"gpus": found.gpu_count})
        document = cost_on_offer(job, found, pricing)
    if chosen is OutputFormat.JSON:
        emit_json(document)
        return
    _print_cost(document, chosen, wide)


def _usd(value: Decimal | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


#: The cost table: (figure, value) rows.
_COST_COLUMNS: tuple[Column[tuple[str, str]], ...] = (
    Column("figure", lambda r: r[0]),
    Column("value", lambda r: r[1], right=True),
)


def _print_cost(document: dict[str, Any], fmt: OutputFormat = OutputFormat.TABLE,
                wide: bool = False) -> None:
    """The cost table; its warnings follow it (on stderr with CSV or Markdown, so stdout is
    the table alone)."""
    nodes = document.get("nodes", 1)
    rows = [("wall time (on-demand)", format_duration(document["hours"] * HOUR_S)),
            ("total cost", _usd(document["cost"])),
            ("  compute (billed)", _usd(document["compute_cost"])),
            ("  storage", _usd(document["storage_cost"])),
            ("  egress", _usd(document["egress_cost"]))]
    spot = document["spot"]
    if spot:
        rows += [("spot expected", _usd(spot["expected_cost"])),
                 ("spot P50 / P90", f"{_usd(spot['p50_cost'])} / {_usd(spot['p90_cost'])}"),
                 ("interruptions expected", f"{spot['interruptions_expected']:.2f}")]
    console = make_console()
    print_table(_COST_COLUMNS, rows, fmt, console, wide=wide,
                title=f"Cost on {document['offer']['provider']} {document['offer']['gpu']} "
                      f"x{document['offer']['gpu_count']}"
                      + (f" x {nodes} nodes" if nodes > 1 else "")
                      + (f" (plan {document['plan_id']})" if document.get("plan_id") else ""))
    for warning in document["warnings"]:
        if fmt is OutputFormat.TABLE:
            console.print(f"warning: {safe(warning)}")
        else:
            sys.stderr.write(f"warning: {plain(' '.join(str(warning).split()))}\n")


def register(app: typer.Typer) -> None:
    """Add ``throughput`` and ``cost`` to ``app``."""
    app.command("throughput")(throughput_command)
    app.command("cost")(cost_command)
