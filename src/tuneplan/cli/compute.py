"""CLI commands for speed and money: ``tuneplan throughput`` and ``tuneplan cost``.

Thin: job flags go through the shared parser (``tuneplan.service.jobflags``, the same flags and
``--job`` file as ``tuneplan memory``) into a ``Strategy``; resolve the model, GPU, offer
and provider through the adapters, call ``core.compute.throughput`` / ``core.cost.estimate``,
present.
``register(app)`` adds both commands to the main Typer app.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tuneplan.cli.options import JsonFlag, ModelArg, emit_json, job_flags, safe
from tuneplan.core.compute.communication import NodeLinks
from tuneplan.core.compute.step import trainable_params
from tuneplan.core.compute.throughput import (
    Throughput,
    estimate_throughput,
    model_shape_from_spec,
)
from tuneplan.core.cost.estimate import (
    Billing,
    CostAssumptions,
    CostInputs,
    checkpoint_bytes,
    estimate_cost,
)
from tuneplan.errors import InvalidValueError
from tuneplan.service.jobs import JobRequest
from tuneplan.units import HOUR_S, format_duration, parse_duration, parse_size

Opt = typer.Option
Fabric = Annotated[str, Opt("--fabric", help="Inside a node: auto, nvlink or pcie.")]


def _throughput(model_name: str, gpu: Any, job: Any, fabric: str,
                inter_node_bytes_per_s: float | None = None) -> tuple[Any, Throughput, Any]:
    from tuneplan.adapters.calibration import calibration_for  # saved probes (issue 9)
    from tuneplan.adapters.hub import resolve_model

    links = NodeLinks(intra=fabric, inter_node_bytes_per_s=inter_node_bytes_per_s)
    shape = model_shape_from_spec(resolve_model(model_name))
    result = estimate_throughput(shape, job.strategy, gpu, avg_tokens=job.avg_tokens,
                                 links=links, tokens=job.tokens_per_epoch, epochs=job.epochs,
                                 assumptions=calibration_for(gpu).throughput)
    return shape, result, job.strategy


@job_flags("throughput")
def throughput_command(model: ModelArg, request: JobRequest, fabric: Fabric = "auto",
                       as_json: JsonFlag = False) -> None:
    """Tokens per second, step time, MFU, communication and hours of a training job."""
    from tuneplan.adapters.bundled import resolve_gpu_spec

    job = request.job()
    if not job.gpu:
        raise InvalidValueError("throughput needs --gpu NAME (see `tuneplan gpus`)")
    gpu = resolve_gpu_spec(job.gpu)
    _, result, _ = _throughput(model, gpu, job, fabric)
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
    for term in result.step:
        table.add_row(f"  {term.path}", f"{term.value:.4f} s")
    Console().print(table)
    for note in result.notes:
        Console().print(f"note: {safe(note)}")


def _offer_and_provider(offer_id: str) -> tuple[Any, Any]:
    from tuneplan.adapters.bundled import load_providers
    from tuneplan.adapters.store import CatalogStore
    from tuneplan.core.catalog.providers import provider_matches

    with CatalogStore.open() as store:
        offer = store.offer(offer_id)
    if offer is None:
        raise InvalidValueError(f"no offer with id {offer_id!r}: see `tuneplan offers --json`")
    provider = next((p for p in load_providers() if provider_matches(p.name, offer.provider)),
                    None)
    return offer, provider


def _cost_inputs(shape: Any, result: Throughput, strategy: Any, offer: Any, provider: Any,
                 options: dict[str, Any], a: CostAssumptions) -> CostInputs:
    if result.hours is None:
        raise InvalidValueError("cost needs the training length: add --tokens (e.g. 50M)")
    with_opt, without = checkpoint_bytes(
        method=strategy.method, precision=strategy.precision, optimizer=strategy.optimizer,
        total_params=shape.total_params, trainable_params=trainable_params(shape, strategy))
    dataset = (parse_size(options["dataset_size"]) if options["dataset_size"]
               else round(options["tokens"] * a.dataset_bytes_per_token))
    every = options["checkpoint_every"]
    granularity = provider.billing_granularity_s if provider else None
    minimum = provider.billing_minimum_s if provider else None
    notes = [f"billing granularity unknown: per {a.default_billing_granularity_s} s assumed"
             ] if granularity is None else []
    if options["spot"] and provider and provider.spot_interruption_data:
        notes.append(f"{provider.name} interruption data (not a rate): "
                     f"{provider.spot_interruption_data}")
    return CostInputs(
        train_s=result.hours * HOUR_S, price_per_hour=offer.price_per_hour,
        spot_price_per_hour=offer.spot_price_per_hour,
        billing=Billing(
            granularity_s=granularity or a.default_billing_granularity_s,
            minimum_s=minimum if minimum is not None else a.default_billing_minimum_s,
            source=(f"{provider.name}: {provider.billing_granularity_raw}; minimum "
                    f"{provider.billing_minimum_raw}") if provider else "provider unknown"),
        model_bytes=shape.total_params * 2, dataset_bytes=dataset,
        checkpoint_bytes_with_optimizer=with_opt, checkpoint_bytes_without_optimizer=without,
        artifact_bytes=without,
        storage_usd_per_gb_month=provider.storage_price_usd_per_gb_month if provider else None,
        egress_usd_per_gb=provider.egress_usd_per_gb if provider else None,
        spot=options["spot"],
        checkpoint_every_s=None if every in (None, "auto") else parse_duration(every),
        interruptions_per_hour=options["interruptions_per_hour"],
        notice_s=provider.spot_notice_s if provider else None, notes=tuple(notes))


@job_flags("cost")
def cost_command(
    model: ModelArg, request: JobRequest,
    offer: Annotated[str, Opt("--offer", help="An offer id from `tuneplan offers --json`.")],
    spot: Annotated[bool, Opt("--spot", help="Price on spot, with interruptions.")] = False,
    checkpoint_every: Annotated[str, Opt("--checkpoint-every", help="30m, 2h or auto")] = "auto",
    interruptions_per_hour: Annotated[float | None, Opt("--interruptions-per-hour")] = None,
    storage_idle_days: Annotated[float, Opt("--storage-idle-days")] = 0.0,
    dataset_size: Annotated[str | None, Opt("--dataset-size", help="e.g. 2GB")] = None,
    fabric: Fabric = "auto", as_json: JsonFlag = False,
) -> None:
    """Total cost of a job on one offer: billing, start-up, storage, egress, and spot."""
    from tuneplan.adapters.bundled import load_gpu_spec

    found, provider = _offer_and_provider(offer)
    job = request.job(defaults={"gpus": found.gpu_count})
    inter = provider.multinode_fabric_bytes_per_s if provider else None
    shape, result, speed = _throughput(model, load_gpu_spec(found.gpu), job, fabric, inter)
    options = {"spot": spot, "checkpoint_every": checkpoint_every, "dataset_size": dataset_size,
               "interruptions_per_hour": interruptions_per_hour,
               "tokens": job.tokens_per_epoch or 0}
    a = replace(CostAssumptions(), storage_idle_days=storage_idle_days)
    estimate = estimate_cost(_cost_inputs(shape, result, speed, found, provider, options, a),
                             a)
    document = estimate.as_dict()
    document["offer"] = {"id": found.id, "provider": found.provider, "gpu": found.gpu,
                         "gpu_count": found.gpu_count, "region": found.region}
    document["throughput"] = {"tokens_per_second": result.tokens_per_second,
                              "training_hours": result.hours}
    if as_json:
        emit_json(document)
        return
    _print_cost(document)


def _usd(value: Decimal | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _print_cost(document: dict[str, Any]) -> None:
    table = Table(title=f"Cost on {safe(document['offer']['provider'])} "
                        f"{safe(document['offer']['gpu'])} "
                        f"x{document['offer']['gpu_count']}")
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
        Console().print(f"warning: {safe(warning)}")


def register(app: typer.Typer) -> None:
    """Add ``throughput`` and ``cost`` to ``app``."""
    app.command("throughput")(throughput_command)
    app.command("cost")(cost_command)
