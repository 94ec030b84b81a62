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
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tuneplan.cli.options import FormatOpt, OutputFormat, WideOpt, output_format
from tuneplan.cli.tables import Column, print_table
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
    from tuneplan.adapters.store import PricePoint, SourceStatus
    from tuneplan.core.catalog.hardware import GpuSpec, MemoryFigure
    from tuneplan.core.catalog.providers import Provider

catalog_app = typer.Typer(help="The offer catalog: status, import, remove, history (and "
                               "refresh).",
                          no_args_is_help=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _console() -> Console:
    from tuneplan.cli.options import make_console

    return make_console()


def _safe(text: object) -> str:
    from tuneplan.cli.options import safe

    return safe(text)


def _emit(document: object) -> None:
    from tuneplan.cli.options import emit_json

    emit_json(document)


def _gpu_columns() -> tuple[Column[GpuSpec], ...]:
    return (
        Column("gpu", lambda s: s.name),
        Column("memory", lambda s: s.memory_label, right=True),
        Column("driver total", lambda s: _memory_cell(s.driver_memory), priority=6,
               right=True),
        Column("usable", lambda s: _memory_cell(s.usable_memory), right=True),
        Column("type", lambda s: s.memory_type or "?", priority=4),
        Column("bandwidth", lambda s: _rate(s.memory_bandwidth_bytes_per_s, GB, "GB/s"),
               priority=1, right=True),
        Column("BF16 TFLOP/s", lambda s: _rate(s.bf16_flops_per_s, TERA), priority=2,
               right=True),
        Column("FP8 TFLOP/s", lambda s: _rate(s.fp8_flops_per_s, TERA), priority=5,
               right=True),
        Column("link", lambda s: s.interconnect or "PCIe only", priority=3),
        Column("PCIe", lambda s: str(s.pcie_gen or "?"), priority=7, right=True),
        Column("TDP", lambda s: f"{s.tdp_w} W" if s.tdp_w else "?", priority=8, right=True),
    )


def gpus_command(
    min_memory: Annotated[str | None, typer.Option(
        "--min-memory", help="Only GPUs with at least this much memory per GPU (80GB, 80GiB).")
    ] = None,
    as_json: JsonFlag = False, fmt: FormatOpt = None, wide: WideOpt = False,
) -> None:
    """GPU specifications: memory (exact bytes), bandwidth, dense TFLOP/s, links, TDP."""
    from tuneplan.service.catalog import gpu_specs, gpus_document

    chosen = output_format(fmt, as_json, wide=wide)
    specs = gpu_specs(min_memory)
    if chosen is OutputFormat.JSON:
        _emit(gpus_document(specs))
        return
    print_table(_gpu_columns(), specs, chosen, _console(), wide=wide,
                title=f"GPUs ({len(specs)}); dense peak rates, '-' = not published; "
                      "usable = CUDA-visible total, what a plan's whole-device peak is "
                      "compared with (* = by rule: assumed, or derived from a reported "
                      "driver total; see --json for sources)")


def _memory_cell(figure: MemoryFigure) -> str:
    return format_bytes(figure.bytes) + ("" if figure.basis == "reported" else "*")


def _rate(value: float | None, scale: float, unit: str = "") -> str:
    return "-" if value is None else f"{value / scale:,.0f}{' ' + unit if unit else ''}"


def _provider_columns() -> tuple[Column[Provider], ...]:
    return (
        Column("provider", lambda p: p.name),
        Column("billing", lambda p: _seconds(p.billing_granularity_s), right=True),
        Column("minimum", lambda p: _seconds(p.billing_minimum_s), priority=3, right=True),
        Column("spot", lambda p: _yes(p.spot_available)),
        Column("notice", lambda p: _seconds(p.spot_notice_s), priority=4, right=True),
        Column("storage $/GB-mo", lambda p: _money(p.storage_price_usd_per_gb_month),
               priority=1, right=True),
        Column("egress $/GB", lambda p: _money(p.egress_usd_per_gb), priority=2, right=True),
        Column("ssh", lambda p: _yes(p.ssh), priority=5),
        Column("docker", lambda p: _yes(p.docker), priority=6),
        Column("jupyter", lambda p: _yes(p.jupyter), priority=7),
    )


def providers_command(as_json: JsonFlag = False, fmt: FormatOpt = None,
                      wide: WideOpt = False) -> None:
    """Provider features: billing, spot notice, storage, egress, access, multi-node fabric."""
    from tuneplan.service.catalog import providers as bundled_providers
    from tuneplan.service.catalog import providers_document

    chosen = output_format(fmt, as_json, wide=wide)
    providers = bundled_providers()
    if chosen is OutputFormat.JSON:
        _emit(providers_document(providers))
        return
    print_table(_provider_columns(), providers, chosen, _console(), wide=wide,
                title=f"Providers ({len(providers)}); '?' = unknown, never guessed")


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
    as_csv: Annotated[bool, typer.Option(
        "--csv", help="Print CSV on stdout (= --format csv): the --json record fields.")] = False,
    fmt: FormatOpt = None, wide: WideOpt = False,
) -> None:
    """Rentable GPU offers from the catalog, cheapest first; prices per instance and per GPU."""
    from tuneplan.service.catalog import find_offers, offer_filter, offers_document

    chosen = output_format(fmt, as_json, wide=wide, as_csv=as_csv)
    query = offer_filter(gpu=gpu, min_gpu_memory=min_gpu_memory, count=count,
                         provider=provider, region=region, spot=spot, max_price=max_price)
    found = find_offers(query, sort)
    offers, statuses = found.offers, found.statuses
    if limit is not None:
        offers = offers[:limit]
    if chosen is OutputFormat.JSON:
        _emit(offers_document(offers))
    elif chosen is OutputFormat.CSV:
        _write_csv(offers)
    else:
        _print_offers(offers, statuses, limit, _console(), chosen, wide=wide, spot=spot)


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


def _offer_columns(spot: bool) -> tuple[Column[Offer], ...]:
    """The offer table; with ``--spot`` the spot prices are decision columns too."""
    spot_priority = 0 if spot else 4
    return (
        Column("id", lambda o: o.id),
        Column("provider", lambda o: o.provider),
        Column("instance", lambda o: o.instance_type or "(GPU only)", priority=6, wrap=True),
        Column("GPU x n", lambda o: f"{o.gpu} x{o.gpu_count}", wrap=True),
        Column("mem/GPU", lambda o: format_bytes(o.gpu_memory_bytes), priority=2, right=True),
        Column("region", lambda o: o.zone or o.region, priority=3, wrap=True),
        Column("$/h", lambda o: _money(o.price_per_hour), right=True),
        Column("$/GPU-h", lambda o: _money(o.price_per_gpu_hour), priority=1, right=True),
        Column("spot $/h", lambda o: _money(o.spot_price_per_hour), priority=spot_priority,
               right=True),
        Column("spot $/GPU-h", lambda o: _money(o.spot_price_per_gpu_hour),
               priority=spot_priority + 1, right=True),
        Column("source", lambda o: o.source, priority=7, wrap=True),
    )


def _print_offers(offers: list[Offer], statuses: list[SourceStatus], limit: int | None,
                  console: Console, fmt: OutputFormat = OutputFormat.TABLE, *,
                  wide: bool = False, spot: bool = False) -> None:
    """The offer table (at most 40 rows unless ``--limit``); in the terminal, followed by
    the catalog's age."""
    shown = offers if limit is not None else offers[:40]
    print_table(_offer_columns(spot), shown, fmt, console, wide=wide,
                title=f"{len(offers)} offers" + (f" (first {len(shown)})"
                                                 if len(shown) < len(offers) else ""))
    if fmt is not OutputFormat.TABLE:
        return
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


_SOURCE_COLUMNS: tuple[Column[dict[str, Any]], ...] = (
    Column("source", lambda s: s["source"], wrap=True),
    Column("fetched at (UTC)", lambda s: f"{s['fetched_at']:%Y-%m-%d %H:%M}"),
    Column("age", lambda s: f"{s['age_s'] / DAY_S:.1f} d", right=True),
    Column("offers", lambda s: str(s["offers"]), right=True),
    Column("snapshots", lambda s: str(s["snapshots"]), priority=1, right=True),
    Column("note", lambda s: "stale" if s["stale"] else "",
           style=lambda s: "yellow" if s["stale"] else None),
)


@catalog_app.command("status")
def catalog_status_command(as_json: JsonFlag = False, fmt: FormatOpt = None,
                           wide: WideOpt = False) -> None:
    """Age and offer count of each source; warns when a source is older than 7 days."""
    from tuneplan.service.catalog import catalog_document

    chosen = output_format(fmt, as_json, wide=wide)
    document = catalog_document()
    if chosen is OutputFormat.JSON:
        _emit(document)
        return
    console = _console()
    print_table(_SOURCE_COLUMNS, document["sources"], chosen, console, wide=wide,
                title=f"Catalog {document['path']}")
    stale = [s["source"] for s in document["sources"] if s["stale"]]
    if stale and chosen is OutputFormat.TABLE:
        console.print(f"[yellow]warning:[/] {len(stale)} sources older than "
                      f"{_stale_after_days()} days "
                      f"({_safe(', '.join(stale))}): run `tuneplan catalog refresh`",
                      soft_wrap=True)


_HISTORY_COLUMNS: tuple[Column[PricePoint], ...] = (
    Column("fetched at (UTC)", lambda p: f"{p.fetched_at:%Y-%m-%d %H:%M}"),
    Column("gpu", lambda p: p.gpu),
    Column("source", lambda p: p.source, priority=1, wrap=True),
    Column("offers", lambda p: str(p.offers), priority=2, right=True),
    Column("on-demand", lambda p: _money(p.min_price_per_gpu_hour), right=True),
    Column("spot", lambda p: _money(p.min_spot_price_per_gpu_hour), right=True),
)


@catalog_app.command("history")
def catalog_history_command(
    gpu: Annotated[str, typer.Argument(help="GPU family or name (as --gpu of `offers`).")],
    as_json: JsonFlag = False, fmt: FormatOpt = None, wide: WideOpt = False,
) -> None:
    """Cheapest price per GPU-hour of a GPU in every stored snapshot, oldest first."""
    from tuneplan.adapters.store import CatalogStore

    chosen = output_format(fmt, as_json, wide=wide)
    with CatalogStore.open() as store:
        points = store.history(gpu)
    if chosen is OutputFormat.JSON:
        _emit([asdict(p) for p in points])
        return
    print_table(_HISTORY_COLUMNS, points, chosen, _console(), wide=wide,
                title=f"Price history of {gpu} (USD per GPU-hour, cheapest per snapshot)")


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
