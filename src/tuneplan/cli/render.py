"""Plans and fit reports as tables (the CLI's presentation of ``service.plan_report``'s
results): figures are formatted here and nowhere else, each cell once in a column list
(``PLAN_COLUMNS``, ``FIT_COLUMNS``) that ``cli.tables`` fits to the terminal or writes as CSV or
Markdown; nothing is computed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from rich.console import Console

from tuneplan.adapters.plans import CatalogInfo
from tuneplan.cli.options import OutputFormat, safe
from tuneplan.cli.tables import Column, print_table
from tuneplan.core.planner.fit import FitReport, MethodFit
from tuneplan.core.planner.plan import Plan, PlanResult, fixed_values
from tuneplan.service.plan_report import spot_part
from tuneplan.units import HOUR_S, GiB, format_duration


def _usd(value: Any) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _settings(p: Plan) -> str:
    s = p.strategy
    parts = [s.method.value]
    if s.method.is_lora:
        parts.append(f"r{s.lora_rank}")
    parts.append(f"mb{s.batch_size}")
    if s.world_size > 1:
        parts.append(s.sharding.value)
    if s.offload.value != "none":
        parts.append(f"offload {s.offload.value}")
    parts.append("ckpt" if s.checkpointing.value != "none" else "no-ckpt")
    return " ".join(parts)


def _spot_text(p: Plan) -> str:
    part = spot_part(p)
    if part is None:
        return "-"
    p90 = part.get("p90_usd")
    return f"{_usd(part['expected_usd'])} / {_usd(p90) if p90 is not None else '?'}"


def _billing(p: Plan) -> str:
    if p.on_demand is None:
        return "?"
    step = p.on_demand.billing["granularity_s"]
    return {1: "per second", 60: "per minute", HOUR_S: "per hour"}.get(step, f"per {step} s")


#: A plan table row: its rank in the printed list and the plan.
PlanRow = tuple[int, Plan]


def _gpus(p: Plan) -> str:
    return f"{p.strategy.gpus}x {p.gpu.name}" + (
        f" x{p.strategy.nodes}" if p.strategy.nodes > 1 else "")


def _memory(p: Plan) -> str:
    return f"{p.candidate.device_total_bytes / GiB:.1f}/{p.capacity_bytes / GiB:.1f}"


#: The plan table, every cell computed here once (terminal table, CSV and Markdown alike).
#: Priority 0 is always shown (the id ``cost`` and ``launch`` take, and what a plan is chosen
#: on); the others are left out, highest number first, when the terminal is narrow.
def plan_columns(spot: bool) -> tuple[Column[PlanRow], ...]:
    """The plan table; when spot may win (``--spot``) its expected cost decides the rank,
    so the spot column is a decision column too."""
    return tuple(replace(c, priority=0) if spot and c.header == "spot exp/P90" else c
                 for c in PLAN_COLUMNS)


PLAN_COLUMNS: tuple[Column[PlanRow], ...] = (
    Column("#", lambda r: str(r[0]), right=True),
    Column("id", lambda r: r[1].id),
    Column("provider", lambda r: r[1].offer.provider, priority=1),
    Column("instance", lambda r: f"{r[1].offer.instance_type} ({r[1].offer.region})",
           priority=5, wrap=True),
    Column("GPUs", lambda r: _gpus(r[1]), wrap=True),
    Column("mem/GPU GiB", lambda r: _memory(r[1])),
    Column("settings", lambda r: _settings(r[1]), priority=4, wrap=True),
    Column("tok/s", lambda r: f"{r[1].candidate.throughput.tokens_per_second:,.0f}",
           priority=3, right=True),
    Column("hours", lambda r: f"{r[1].hours:.2f}", right=True),
    Column("on-demand", lambda r: _usd(r[1].cost_usd), right=True),
    Column("spot exp/P90", lambda r: _spot_text(r[1]), priority=2),
    Column("billing", lambda r: _billing(r[1]), priority=6),
    Column("storage", lambda r: r[1].storage, priority=7, wrap=True),
)


def render_plans(result: PlanResult, catalog: CatalogInfo, top: int, now: datetime,
                 console: Console, fmt: OutputFormat = OutputFormat.TABLE,
                 wide: bool = False) -> None:
    """The plan table; in the terminal, followed by the Pareto front, the catalog's age and
    each plan's why and warnings (CSV and Markdown are the table alone)."""
    rows = list(enumerate(result.plans[:top], start=1))
    print_table(plan_columns(result.job.spot is True), rows, fmt, console, wide=wide,
                title=f"{result.model}: top {len(rows)} of {len(result.plans)} plans by "
                      f"{result.job.objective.value}")
    if fmt is not OutputFormat.TABLE:
        return
    console.print(f"mem/GPU GiB: whole-device peak (CUDA context and allocator reserve "
                  f"included) / usable (CUDA-visible total, less than the card's nominal "
                  f"size); a plan fits at peak <= usable x {result.assumptions.memory_margin:.0%}")
    fixed = fixed_values(result.job)
    if fixed:
        console.print("fixed by you (every plan keeps it; the search varied the rest): "
                      + ", ".join(f"{name.replace('_', '-')} {getattr(v, 'value', v)}"
                                  for name, v in fixed.items()))
    for note in result.notes:
        console.print("note: " + safe(note))
    _print_front(result, console)
    _print_catalog(catalog, now, console)
    for rank, p in rows:
        console.print(f"[bold]#{rank} {p.id}[/bold] why: " + safe("; ".join(p.why[1:] or p.why)))
        console.print("   time: " + _time_text(p))
        for warning in p.warnings:
            console.print(f"   warning: {safe(warning)}")
    for rank, p in result.best_of_other_node_counts(top):
        console.print(_other_nodes_text(rank, p, len(result.plans)))
    if result.rejected:
        console.print(f"{len(result.rejected)} offers rejected (see --json), e.g. "
                      f"{safe(result.rejected[0].offer.gpu)}: {safe(result.rejected[0].reason)}")


def _other_nodes_text(rank: int, p: Plan, count: int) -> str:
    """The best plan on a node count the table does not show, with its largest per-GPU
    terms (``--json``'s ``best_of_other_node_counts`` has them all)."""
    s, c = p.strategy, p.candidate
    head = (f"best on {s.nodes} node{'s' if s.nodes > 1 else ''}: #{rank} of {count} "
            f"{p.id} {s.gpus}x {safe(p.offer.gpu)} x {s.nodes} ({safe(p.offer.provider)}, "
            f"{s.sharding.value}, offload {s.offload.value}) {_usd(p.best_cost)}; "
            f"{c.device_total_bytes / GiB:.1f} GiB per GPU")
    if not c.exact:
        return head
    terms = sorted(c.memory.breakdown, key=lambda t: -int(t.value))[:6]
    return head + ": " + ", ".join(f"{t.path} {int(t.value) / GiB:.1f}" for t in terms)


def _time_text(p: Plan) -> str:
    """``2.31 h of training, assumed (model error -9..+18 %): 2.10-2.74 h``."""
    t = p.candidate.throughput
    if t.hours is None:
        return t.time_basis.text()
    low, high = t.time_basis.duration_range(t.hours)
    return (f"{format_duration(t.hours * HOUR_S)} of training, {t.time_basis.text()}: "
            f"{format_duration(low * HOUR_S)}-{format_duration(high * HOUR_S)}")


def render_infeasible(result: PlanResult, console: Console) -> None:
    """An impossible job: the binding constraints, then what relaxing each gives."""
    why = result.infeasible
    console.print(f"{safe(result.model)}: no plan ({result.considered} offers considered, "
                  f"{len(result.rejected)} rejected)")
    if why is None:
        return
    for b in why.binding:
        console.print(f"binding {safe(b.constraint)}: {safe(b.detail)}")
    for r in why.relaxations:
        console.print(f"  relax {safe(r.constraint)}: {safe(r.text())}")
    if not why.relaxations and any(b.constraint != "estimate" for b in why.binding):
        console.print("  no single change the planner tried gives a plan")
    if result.relaxed:
        first = result.relaxed[0].plan.id
        console.print(f"the relaxations' plans are saved: `tuneplan cost {first}` or "
                      f"`tuneplan launch {first}` (any plan id above)")


def _print_front(result: PlanResult, console: Console) -> None:
    by_id = {p.id: p for p in result.plans}
    points = [by_id[i] for i in result.pareto_ids if i in by_id]
    text = ", ".join(f"{_usd(p.best_cost)} in {format_duration(p.best_hours * HOUR_S)} "
                     f"({p.strategy.world_size}x {p.gpu.name}, {safe(p.offer.provider)})"
                     for p in points[:8])
    console.print(f"Pareto front (cost vs time): {text}")


def _print_catalog(catalog: CatalogInfo, now: datetime, console: Console) -> None:
    if catalog.fetched_at is None:
        console.print("catalog: no sources")
        return
    age = format_duration((now - catalog.fetched_at).total_seconds())
    stale = [s["source"] for s in catalog.sources if s["stale"]]
    console.print(f"catalog: {len(catalog.sources)} sources, newest fetched "
                  f"{catalog.fetched_at:%Y-%m-%d %H:%M} UTC ({age} ago)"
                  + (f"; stale: {safe(', '.join(stale))}" if stale else ""))


#: The fit table: one row per method.
FIT_COLUMNS: tuple[Column[MethodFit], ...] = (
    Column("method", lambda m: m.method.value),
    Column("peak at job settings", lambda m: m.refusal or (
        "-" if m.peak_bytes is None else f"{m.peak_bytes / GiB:.1f} GiB" + (
            "" if m.step_peak_bytes is None else
            f" loading-bound (step {m.step_peak_bytes / GiB:.1f} GiB)")), wrap=True),
    Column("fits", lambda m: "yes" if m.fits else "no"),
    Column("largest micro-batch", lambda m: str(m.largest_batch), priority=1, right=True),
    Column("largest seq len (mb 1)", lambda m: str(m.largest_seq_len), priority=2, right=True),
)


def render_fit(report: FitReport, console: Console, fmt: OutputFormat = OutputFormat.TABLE,
               wide: bool = False) -> None:
    """The fit table; in the terminal, followed by the changes that make the job fit."""
    basis = report.usable.basis if report.usable is not None else "?"
    print_table(FIT_COLUMNS, report.methods, fmt, console, wide=wide,
                title=f"{report.gpu}: {report.capacity_bytes / GiB:.1f} GiB usable of "
                      f"{report.nominal_bytes / GiB:g} GiB ({basis}); a peak fits at <= "
                      f"{report.limit_bytes / GiB:.1f} GiB (usable x {report.margin:.0%})")
    if fmt is not OutputFormat.TABLE:
        return
    if report.precision is not None:
        console.print(f"precision: {report.precision.chosen.value}"
                      + ("" if report.precision.chosen is report.precision.requested
                         else f" (asked {report.precision.requested.value})")
                      + f": {safe(report.precision.why)}")
        for m in report.methods:
            if m.layout:
                console.print(f"   {m.method.value}: {safe(m.layout)}")
    for note in report.notes:
        if report.precision is None or not note.startswith("no BF16"):
            console.print(f"note: {safe(note)}")
    if report.time_basis is not None and any(s.tokens_per_second for s in report.suggestions):
        console.print(f"tok/s below: {report.time_basis.text()}")
    for s in report.suggestions:
        host = (f", host RAM {s.host_ram_bytes / GiB:,.0f} GiB"
                if s.strategy.offload.value != "none" else "")
        speed = "" if s.tokens_per_second is None else f", {s.tokens_per_second:,.0f} tok/s"
        if s.speed_vs_job is not None:
            speed += f" ({s.speed_vs_job:.0%} of the job's estimate)"
        console.print(f"{'fits' if s.fits else 'too big'} ({safe(s.scope)}): {safe(s.change)} "
                      f"-> peak {s.peak_bytes / GiB:.1f} GiB{host}{speed}")
