"""CLI commands for speed and money: ``tuneplan throughput`` and ``tuneplan cost``.

Thin: read the job flags into the memory model's ``Strategy``, resolve the model, GPU, offer
and provider through the adapters, call ``core.compute`` / ``core.cost``, present.
``register(app)`` adds both commands to the main Typer app.
"""

from __future__ import annotations

import re
from dataclasses import replace
from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tuneplan.core.compute import (
    Throughput,
    compute_job_from_strategy,
    estimate_throughput,
    model_shape_from_spec,
)
from tuneplan.core.compute_step import STATE_BYTES, trainable_params
from tuneplan.core.cost import Billing, CostAssumptions, CostInputs, checkpoint_bytes, estimate_cost
from tuneplan.errors import InvalidValueError
from tuneplan.units import HOUR_S, format_duration, parse_count, parse_duration, parse_size

Opt = typer.Option
JsonFlag = Annotated[bool, Opt("--json", help="Print one JSON document on stdout.")]
Method = Annotated[str, Opt("--method", help="full, freeze, lora, dora, qlora, lora8bit, ...")]
Rank = Annotated[int, Opt("--lora-rank")]
Targets = Annotated[str, Opt("--lora-targets", help="all-linear or q_proj,v_proj,...")]
TrainableLayers = Annotated[int, Opt("--trainable-layers")]
TrainableModules = Annotated[str, Opt("--trainable-modules")]
Precision = Annotated[str, Opt("--precision")]
OptimizerFlag = Annotated[str, Opt("--optimizer")]
Batch = Annotated[int, Opt("--batch-size")]
Accum = Annotated[int, Opt("--grad-accum")]
SeqLen = Annotated[int, Opt("--seq-len")]
AvgTokens = Annotated[int | None, Opt("--avg-tokens", help="real tokens per unpacked sequence")]
Packing = Annotated[bool, Opt("--packing/--no-packing")]
Checkpointing = Annotated[bool, Opt("--gradient-checkpointing/--no-gradient-checkpointing")]
OffloadActs = Annotated[bool, Opt("--offload-activations")]
AttentionFlag = Annotated[str, Opt("--attention")]
Compile = Annotated[bool, Opt("--compile")]
TaskFlag = Annotated[str, Opt("--task")]
Gpus = Annotated[int | None, Opt("--gpus", help="GPUs per node (cost: the offer's count)")]
Nodes = Annotated[int, Opt("--nodes")]
ShardingFlag = Annotated[str | None, Opt("--sharding", help="default ddp (1 GPU) else zero3")]
OffloadFlag = Annotated[str, Opt("--offload")]
RecipeFlag = Annotated[str, Opt("--recipe")]
QuantFlag = Annotated[str, Opt("--quant")]
Tokens = Annotated[str | None, Opt("--tokens", help="training tokens per epoch: 50M, 1.2B")]
Epochs = Annotated[float, Opt("--epochs")]
Fabric = Annotated[str, Opt("--fabric", help="inside a node: auto, nvlink or pcie")]


def _strategy(flags: dict[str, Any]) -> Any:
    """The memory model's Strategy from the job flags (each value checked by its enum)."""
    from tuneplan.core import job as j
    from tuneplan.core.methods import Method as MethodEnum
    from tuneplan.core.methods import Quant
    from tuneplan.core.recipes import Recipe

    gpus, nodes = flags["gpus"] or 1, flags["nodes"]
    sharding = flags["sharding"] or ("ddp" if gpus * nodes == 1 else "zero3")
    checkpointing = ("offload" if flags["offload_activations"]
                     else "full" if flags["gradient_checkpointing"] else "none")
    try:
        return j.Strategy(
            method=MethodEnum(flags["method"]), recipe=Recipe(flags["recipe"]),
            precision=j.Precision(flags["precision"]), optimizer=j.Optimizer(flags["optimizer"]),
            lora_rank=flags["lora_rank"],
            lora_targets=tuple(t.strip() for t in flags["lora_targets"].split(",") if t.strip()),
            trainable_modules=tuple(t for t in flags["trainable_modules"].split(",") if t),
            trainable_layers=flags["trainable_layers"], quant=Quant(flags["quant"]),
            batch_size=flags["batch_size"], grad_accum=flags["grad_accum"],
            seq_len=flags["seq_len"], packing=flags["packing"],
            checkpointing=j.Checkpointing(checkpointing), attention=j.Attention(flags["attention"]),
            compile=flags["compile"], task=j.Task(flags["task"]), gpus=gpus, nodes=nodes,
            sharding=j.Sharding(sharding), offload=j.Offload(flags["offload"]))
    except ValueError as exc:
        raise InvalidValueError(f"bad job flag: {exc}") from exc


def _throughput(model_name: str, gpu_name: str, flags: dict[str, Any],
                inter_node_bytes_per_s: float | None = None) -> tuple[Any, Throughput, Any]:
    from tuneplan.adapters.bundled import load_gpu_spec
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.gpu_names import normalise_gpu_name

    strategy = _strategy(flags)
    job = compute_job_from_strategy(strategy, avg_tokens=flags["avg_tokens"],
                                    intra_node_link=flags["fabric"],
                                    inter_node_bytes_per_s=inter_node_bytes_per_s)
    shape = model_shape_from_spec(resolve_model(model_name))
    gpu = load_gpu_spec(normalise_gpu_name(gpu_name))
    tokens = parse_count(flags["tokens"]) if flags["tokens"] else None
    result = estimate_throughput(shape, job, gpu, tokens=tokens, epochs=flags["epochs"])
    return shape, result, job


def throughput_command(
    model: Annotated[str, typer.Argument(help="bundled name, HF id, folder or config.json")],
    gpu: Annotated[str, Opt("--gpu", help="a GPU from `tuneplan gpus`")],
    method: Method = "lora", lora_rank: Rank = 16, lora_targets: Targets = "all-linear",
    trainable_layers: TrainableLayers = 0, trainable_modules: TrainableModules = "",
    quant: QuantFlag = "nf4", precision: Precision = "bf16-mixed",
    optimizer: OptimizerFlag = "adamw", batch_size: Batch = 1, grad_accum: Accum = 1,
    seq_len: SeqLen = 2048, avg_tokens: AvgTokens = None, packing: Packing = False,
    gradient_checkpointing: Checkpointing = True, offload_activations: OffloadActs = False,
    attention: AttentionFlag = "sdpa", compile: Compile = False, task: TaskFlag = "causal-lm",
    gpus: Gpus = None, nodes: Nodes = 1, sharding: ShardingFlag = None,
    offload: OffloadFlag = "none", recipe: RecipeFlag = "hf", tokens: Tokens = None,
    epochs: Epochs = 1.0, fabric: Fabric = "auto", as_json: JsonFlag = False,
) -> None:
    """Tokens per second, step time, MFU, communication and hours of a training job."""
    flags = dict(locals())
    _, result, _ = _throughput(model, gpu, flags)
    if as_json:
        from tuneplan.cli import emit_json

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


_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*(Gbps|Gb/s|Tbps|Tb/s)", re.IGNORECASE)


def fabric_bytes_per_s(text: str | None) -> float | None:
    """Largest node fabric rate named in a provider's text (``3200 Gbps`` -> 4e11 B/s)."""
    rates = [float(n) * (1e12 if u.lower().startswith("t") else 1e9) / 8
             for n, u in _RATE.findall(text or "")]
    return max(rates) if rates else None


def _offer_and_provider(offer_id: str) -> tuple[Any, Any]:
    from tuneplan.adapters.bundled import load_providers
    from tuneplan.adapters.store import CatalogStore
    from tuneplan.core.providers import provider_matches

    with CatalogStore.open() as store:
        found = [offer for offer in store.offers() if offer.id == offer_id]
    if not found:
        raise InvalidValueError(f"no offer with id {offer_id!r}: see `tuneplan offers --json`")
    offer = found[0]
    provider = next((p for p in load_providers() if provider_matches(p.name, offer.provider)),
                    None)
    return offer, provider


def _cost_inputs(shape: Any, result: Throughput, job: Any, offer: Any, provider: Any,
                 flags: dict[str, Any], a: CostAssumptions) -> CostInputs:
    if result.hours is None:
        raise InvalidValueError("cost needs the training length: add --tokens (e.g. 50M)")
    full = job.method == "full"
    trainable = trainable_params(shape, job)
    state = STATE_BYTES.get(job.optimizer, 8) + (4 if full and "mixed" in job.precision else 0)
    with_opt, without = checkpoint_bytes(
        total_params=shape.total_params, trainable_params=trainable, full=full,
        weight_bytes=2 if full else 4, optimizer_bytes_per_param=state)
    tokens = parse_count(flags["tokens"])
    dataset = (parse_size(flags["dataset_size"]) if flags["dataset_size"]
               else round(tokens * a.dataset_bytes_per_token))
    every = flags["checkpoint_every"]
    granularity = provider.billing_granularity_s if provider else None
    minimum = provider.billing_minimum_s if provider else None
    notes = [f"billing granularity unknown: per {a.default_billing_granularity_s} s assumed"
             ] if granularity is None else []
    if flags["spot"] and provider and provider.spot_interruption_data:
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
        spot=flags["spot"],
        checkpoint_every_s=None if every in (None, "auto") else parse_duration(every),
        interruptions_per_hour=flags["interruptions_per_hour"],
        notice_s=provider.spot_notice_s if provider else None, notes=tuple(notes))


def cost_command(
    model: Annotated[str, typer.Argument(help="bundled name, HF id, folder or config.json")],
    offer: Annotated[str, Opt("--offer", help="an offer id from `tuneplan offers --json`")],
    method: Method = "lora", lora_rank: Rank = 16, lora_targets: Targets = "all-linear",
    trainable_layers: TrainableLayers = 0, trainable_modules: TrainableModules = "",
    quant: QuantFlag = "nf4", precision: Precision = "bf16-mixed",
    optimizer: OptimizerFlag = "adamw", batch_size: Batch = 1, grad_accum: Accum = 1,
    seq_len: SeqLen = 2048, avg_tokens: AvgTokens = None, packing: Packing = False,
    gradient_checkpointing: Checkpointing = True, offload_activations: OffloadActs = False,
    attention: AttentionFlag = "sdpa", compile: Compile = False, task: TaskFlag = "causal-lm",
    gpus: Gpus = None, nodes: Nodes = 1, sharding: ShardingFlag = None,
    offload: OffloadFlag = "none", recipe: RecipeFlag = "hf", tokens: Tokens = None,
    epochs: Epochs = 1.0, fabric: Fabric = "auto",
    spot: Annotated[bool, Opt("--spot", help="price on spot with interruptions")] = False,
    checkpoint_every: Annotated[str, Opt("--checkpoint-every", help="30m, 2h or auto")] = "auto",
    interruptions_per_hour: Annotated[float | None, Opt("--interruptions-per-hour")] = None,
    storage_idle_days: Annotated[float, Opt("--storage-idle-days")] = 0.0,
    dataset_size: Annotated[str | None, Opt("--dataset-size", help="e.g. 2GB")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Total cost of a job on one offer: billing, start-up, storage, egress, and spot."""
    flags = dict(locals())
    found, provider = _offer_and_provider(offer)
    flags["gpus"] = gpus or found.gpu_count
    inter = fabric_bytes_per_s(provider.multinode_interconnect if provider else None)
    shape, result, job = _throughput(model, found.gpu, flags, inter)
    a = replace(CostAssumptions(), storage_idle_days=storage_idle_days)
    estimate = estimate_cost(_cost_inputs(shape, result, job, found, provider, flags, a), a)
    document = estimate.as_dict()
    document["offer"] = {"id": found.id, "provider": found.provider, "gpu": found.gpu,
                         "gpu_count": found.gpu_count, "region": found.region}
    document["throughput"] = {"tokens_per_second": result.tokens_per_second,
                              "training_hours": result.hours}
    if as_json:
        from tuneplan.cli import emit_json

        emit_json(document)
        return
    _print_cost(document)


def _usd(value: Decimal | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _print_cost(document: dict[str, Any]) -> None:
    table = Table(title=f"Cost on {document['offer']['provider']} {document['offer']['gpu']} "
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
        Console().print(f"warning: {warning}")


def register(app: typer.Typer) -> None:
    """Add ``throughput`` and ``cost`` to ``app``."""
    app.command("throughput")(throughput_command)
    app.command("cost")(cost_command)
