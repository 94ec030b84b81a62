"""CLI commands for hardware and the offer catalog: gpus, providers, offers, catalog *.

Thin: parse flags, call ``adapters.store``/``adapters.bundled`` and the core filter, present.
``register(app)`` adds them to the main Typer app; ``catalog_app`` is the ``catalog`` group
(other modules add ``catalog refresh`` to it).
"""

from __future__ import annotations

import csv
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from tuneplan.core.catalog.offers import (
    OFFER_RECORD_FIELDS,
    Offer,
    OfferSort,
    offer_record,
)
from tuneplan.errors import InvalidValueError
from tuneplan.units import (
    DAY_S,
    GB,
    TERA,
    format_bytes,
    format_duration,
    format_usd,
)

if TYPE_CHECKING:
    from tuneplan.adapters.store import SourceStatus
    from tuneplan.core.catalog.hardware import MemoryFigure

catalog_app = typer.Typer(help="The offer catalog: status, import, remove, history (and "
                               "refresh).",
                          no_args_is_help=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _console() -> Console:
    from tuneplan.cli.options import console

    return console


def _safe(text: object) -> str:
    from tuneplan.cli.options import safe

    return safe(text)


def _emit(document: object) -> None:
    from tuneplan.cli.options import emit_json

    emit_json(document)


def gpus_command(
    min_memory: Annotated[str | None, typer.Option(
        "--min-memory", help="Only GPUs with at least this much memory per GPU (80GB, 80GiB).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """GPU specifications: memory (exact bytes), bandwidth, dense TFLOP/s, links, TDP."""
    from tuneplan.service.catalog import gpu_specs, gpus_document

    specs = gpu_specs(min_memory)
    if as_json:
        _emit(gpus_document(specs))
        return
    table = Table(title=f"GPUs ({len(specs)}); dense peak rates, '-' = not published; "
                        "usable = CUDA-visible total, what a plan's whole-device peak is "
                        "compared with (* = by rule: assumed, or derived from a reported "
                        "driver total; see --json for sources)")
    for column in ("gpu", "memory", "driver total", "usable", "type", "bandwidth",
                   "BF16 TFLOP/s", "FP8 TFLOP/s", "link", "PCIe", "TDP"):
        table.add_column(column, justify="left" if column in ("gpu", "type", "link") else "right")
    for s in specs:
        table.add_row(
            s.name, s.memory_label, _memory_cell(s.driver_memory),
            _memory_cell(s.usable_memory), s.memory_type or "?",
            _rate(s.memory_bandwidth_bytes_per_s, GB, "GB/s"), _rate(s.bf16_flops_per_s, TERA),
            _rate(s.fp8_flops_per_s, TERA), s.interconnect or "PCIe only",
            str(s.pcie_gen or "?"), f"{s.tdp_w} W" if s.tdp_w else "?")
    _console().print(table)


def _memory_cell(figure: MemoryFigure) -> str:
    return format_bytes(figure.bytes) + ("" if figure.basis == "reported" else "*")


def _rate(value: float | None, scale: float, unit: str = "") -> str:
    return "-" if value is None else f"{value / scale:,.0f}{' ' + unit if unit else ''}"


def providers_command(as_json: JsonFlag = False) -> None:
    """Provider features: billing, spot notice, storage, egress, access, multi-node fabric."""
    from tuneplan.service.catalog import providers as bundled_providers
    from tuneplan.service.catalog import providers_document

    providers = bundled_providers()
    if as_json:
        _emit(providers_document(providers))
        return
    table = Table(title=f"Providers ({len(providers)}); '?' = unknown, never guessed")
    for column in ("provider", "billing", "minimum", "spot", "notice", "storage $/GB-mo",
                   "egress $/GB", "ssh", "docker", "jupyter"):
        table.add_column(column)
    for p in providers:
        table.add_row(p.name, _seconds(p.billing_granularity_s), _seconds(p.billing_minimum_s),
                      _yes(p.spot_available), _seconds(p.spot_notice_s),
                      _money(p.storage_price_usd_per_gb_month), _money(p.egress_usd_per_gb),
                      _yes(p.ssh), _yes(p.docker), _yes(p.jupyter))
    _console().print(table)


def _seconds(value: int | None) -> str:
    return "?" if value is None else f"{value} s"


def _yes(value: bool | None) -> str:
    return "?" if value is None else "yes" if value else "no"


def _money(value: Decimal | None, digits: int = 3) -> str:
    return "?" if value is None else format_usd(value, digits)


def offers_command(
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="GPU family or name, word-prefix match: H100 = H100 PCIe, SXM5 and NVL; "
                      "'A100 80' = both 80 GB A100s; A10 = only the A10.")] = None,
    min_gpu_memory: Annotated[str | None, typer.Option(
        "--min-gpu-memory", help="Memory per GPU at least this (80GB = 80·10^9 B, 80GiB).")] = None,
    count: Annotated[int | None, typer.Option("--count", help="GPUs per instance, exactly.")
                     ] = None,
    provider: Annotated[str | None, typer.Option(
        "--provider", help="Comma list of providers (aws,runpod,lambda,oci,vast,...).")] = None,
    region: Annotated[str | None, typer.Option("--region", help="Region or zone prefix (us-).")
                      ] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Only offers with a spot price; filter "
                                                      "and sort by it.")] = False,
    max_price: Annotated[str | None, typer.Option(
        "--max-price", help="Max USD per hour for the whole instance (at the price used).")
    ] = None,
    sort: Annotated[OfferSort, typer.Option("--sort", help="price (instance), price-per-gpu, "
                                                           "or memory (total, descending).")
                    ] = OfferSort.PRICE,
    limit: Annotated[int | None, typer.Option("--limit", help="Show at most N offers "
                                                              "(table default 40).")] = None,
    as_json: JsonFlag = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV on stdout.")] = False,
) -> None:
    """Rentable GPU offers from the catalog, cheapest first; prices per instance and per GPU."""
    from tuneplan.service.catalog import find_offers, offer_filter, offers_document

    query = offer_filter(gpu=gpu, min_gpu_memory=min_gpu_memory, count=count,
                         provider=provider, region=region, spot=spot, max_price=max_price)
    found = find_offers(query, sort)
    offers, statuses = found.offers, found.statuses
    if limit is not None:
        offers = offers[:limit]
    if as_json:
        _emit(offers_document(offers))
    elif as_csv:
        _write_csv(offers)
    else:
        _print_offers(offers, statuses, limit)


def _write_csv(offers: list[Offer]) -> None:
    records = [offer_record(o) for o in offers]
    writer = csv.DictWriter(sys.stdout, fieldnames=OFFER_RECORD_FIELDS, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: _csv_value(v) for k, v in record.items()})


def _csv_value(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    return "" if value is None else value


def _print_offers(offers: list[Offer], statuses: list[SourceStatus], limit: int | None) -> None:
    shown = offers if limit is not None else offers[:40]
    table = Table(title=f"{len(offers)} offers" + (f" (first {len(shown)})"
                                                   if len(shown) < len(offers) else ""))
    for column in ("id", "provider", "instance", "GPU x n", "mem/GPU", "region", "$/h",
                   "$/GPU-h", "spot $/h", "spot $/GPU-h", "source"):
        table.add_column(column, justify="right" if "$" in column or "mem" in column else "left")
    for o in shown:
        table.add_row(o.id, _safe(o.provider), _safe(o.instance_type or "(GPU only)"),
                      f"{_safe(o.gpu)} x{o.gpu_count}", format_bytes(o.gpu_memory_bytes),
                      _safe(o.zone or o.region),
                      _money(o.price_per_hour), _money(o.price_per_gpu_hour),
                      _money(o.spot_price_per_hour), _money(o.spot_price_per_gpu_hour),
                      _safe(o.source))
    console = _console()
    console.print(table)
    console.print(_age_line(statuses), soft_wrap=True)
    if any(o.attachable for o in shown):
        console.print("(GPU only) = GCP GPU price without its host VM: add the VM's price.")


def _stale_after_days() -> int:
    from tuneplan.adapters.store import STALE_AFTER_S

    return STALE_AFTER_S // DAY_S


def _age_line(statuses: list[SourceStatus]) -> str:
    if not statuses:
        return "catalog is empty: run `tuneplan catalog refresh`"
    oldest = max(statuses, key=lambda s: s.age_s)
    stale = [s.source for s in statuses if s.stale]
    line = (f"catalog: {len(statuses)} sources, oldest {_safe(oldest.source)} fetched "
            f"{oldest.fetched_at:%Y-%m-%d %H:%M} UTC ({format_duration(oldest.age_s)} ago)")
    if stale:
        line += (f"; [yellow]{len(stale)} older than {_stale_after_days()} days: "
                 "run `tuneplan catalog refresh`[/]")
    return line


@catalog_app.command("status")
def catalog_status_command(as_json: JsonFlag = False) -> None:
    """Age and offer count of each source; warns when a source is older than 7 days."""
    from tuneplan.service.catalog import catalog_document

    document = catalog_document()
    if as_json:
        _emit(document)
        return
    table = Table(title=f"Catalog {_safe(document['path'])}")
    for column in ("source", "fetched at (UTC)", "age", "offers", "snapshots", "note"):
        table.add_column(column)
    for s in document["sources"]:
        table.add_row(_safe(s["source"]), f"{s['fetched_at']:%Y-%m-%d %H:%M}",
                      f"{s['age_s'] / DAY_S:.1f} d", str(s["offers"]), str(s["snapshots"]),
                      "[yellow]stale[/]" if s["stale"] else "")
    _console().print(table)
    stale = [s["source"] for s in document["sources"] if s["stale"]]
    if stale:
        _console().print(f"[yellow]warning:[/] {len(stale)} sources older than "
                         f"{_stale_after_days()} days "
                         f"({_safe(', '.join(stale))}): run `tuneplan catalog refresh`",
                         soft_wrap=True)


@catalog_app.command("history")
def catalog_history_command(
    gpu: Annotated[str, typer.Argument(help="GPU family or name (as --gpu of `offers`).")],
    as_json: JsonFlag = False,
) -> None:
    """Cheapest price per GPU-hour of a GPU in every stored snapshot, oldest first."""
    from tuneplan.adapters.store import CatalogStore

    with CatalogStore.open() as store:
        points = store.history(gpu)
    if as_json:
        _emit([asdict(p) for p in points])
        return
    table = Table(title=f"Price history of {_safe(gpu)} (USD per GPU-hour, cheapest per snapshot)")
    for column in ("fetched at (UTC)", "gpu", "source", "offers", "on-demand", "spot"):
        table.add_column(column)
    for p in points:
        table.add_row(f"{p.fetched_at:%Y-%m-%d %H:%M}", _safe(p.gpu), _safe(p.source),
                      str(p.offers),
                      _money(p.min_price_per_gpu_hour), _money(p.min_spot_price_per_gpu_hour))
    _console().print(table)


@catalog_app.command("import")
def catalog_import_command(
    file: Annotated[Path, typer.Argument(help="CSV: provider,gpu,gpu_count,region,"
                                              "price_per_hour[,spot_price_per_hour,...]")],
    as_json: JsonFlag = False,
) -> None:
    """Add your own prices (negotiated, reserved, on-prem). All rows or nothing is written."""
    from tuneplan.adapters.importers.user_csv import MAX_FILE_CHARS, parse_user_csv
    from tuneplan.adapters.store import CatalogStore

    try:
        if file.stat().st_size > MAX_FILE_CHARS:
            raise InvalidValueError(f"{file}: {file.stat().st_size:,} bytes, more than "
                                    f"{MAX_FILE_CHARS:,}")
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidValueError(f"cannot read {file}: {exc}") from exc
    source = f"user-import:{file.name}"
    fetched_at = datetime.now(UTC)
    result = parse_user_csv(text, source, fetched_at)
    problems = [*result.rejected_rows,
                *(f"unknown GPU {n[:40]!r}" for n in result.unknown_gpu_names)]
    if problems or not result.offers:
        detail = "; ".join(problems[:10]) or "no rows"
        raise InvalidValueError(f"{file}: nothing imported ({result.total_rejected} bad rows, "
                                f"{len(result.unknown_gpu_names)} unknown GPUs): {detail}")
    with CatalogStore.open() as store:
        written = store.replace_source(source, result.offers, fetched_at)
    if as_json:
        _emit({"source": source, "offers": written, "fetched_at": fetched_at})
    else:
        _console().print(f"imported {written} offers as source {_safe(source)}")


@catalog_app.command("remove")
def catalog_remove_command(
    source: Annotated[str, typer.Argument(help="Source name as `catalog status` shows it "
                                               "(user-import:prices.csv, runpod, ...).")],
    as_json: JsonFlag = False,
) -> None:
    """Delete a source: all its snapshots and offers, in one transaction (e.g. a bad import)."""
    from tuneplan.adapters.store import CatalogStore

    with CatalogStore.open() as store:
        offers, snapshots = store.remove_source(source)
    if as_json:
        _emit({"source": source, "offers_removed": offers, "snapshots_removed": snapshots})
    else:
        _console().print(f"removed source {_safe(source)}: {offers} offers in "
                         f"{snapshots} snapshots")


def register(app: typer.Typer) -> None:
    """Add gpus, providers, offers and the catalog group to ``app``."""
    app.command("gpus")(gpus_command)
    app.command("providers")(providers_command)
    app.command("offers")(offers_command)
    app.add_typer(catalog_app, name="catalog")
