"""Plans and fit reports as Rich tables (the CLI's presentation of ``service.plan_report``'s
results): figures are formatted here and nowhere else; nothing is computed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from tuneplan.adapters.plans import CatalogInfo
from tuneplan.cli.options import safe
from tuneplan.core.planner.fit import FitReport
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


def render_plans(result: PlanResult, catalog: CatalogInfo, top: int, now: datetime,
                 console: Console) -> None:
    table = Table(title=f"{safe(result.model)}: top {min(top, len(result.plans))} of "
                        f"{len(result.plans)} plans by {result.job.objective.value}")
    for name in ("#", "id", "provider", "instance", "GPUs", "mem/GPU GiB", "settings",
                 "tok/s", "hours", "on-demand", "spot exp/P90", "billing", "storage"):
        table.add_column(name, justify="right" if name in ("#", "tok/s", "hours") else "left",
                         overflow="fold")
    for rank, p in enumerate(result.plans[:top], start=1):
        gpus = f"{p.strategy.gpus}x {p.gpu.name}" + (
            f" x{p.strategy.nodes}" if p.strategy.nodes > 1 else "")
        table.add_row(
            str(rank), p.id, safe(p.offer.provider),
            safe(f"{p.offer.instance_type} ({p.offer.region})"),
            gpus, f"{p.candidate.device_total_bytes / GiB:.1f}/{p.capacity_bytes / GiB:.0f}",
            _settings(p), f"{p.candidate.throughput.tokens_per_second:,.0f}",
            f"{p.hours:.2f}", _usd(p.cost_usd), _spot_text(p), _billing(p), safe(p.storage))
    console.print(table)
    fixed = fixed_values(result.job)
    if fixed:
        console.print("fixed by you (every plan keeps it; the search varied the rest): "
                      + ", ".join(f"{name.replace('_', '-')} {getattr(v, 'value', v)}"
                                  for name, v in fixed.items()))
    _print_front(result, console)
    _print_catalog(catalog, now, console)
    for rank, p in enumerate(result.plans[:top], start=1):
        console.print(f"[bold]#{rank} {p.id}[/bold] why: " + safe("; ".join(p.why[1:] or p.why)))
        for warning in p.warnings:
            console.print(f"   warning: {safe(warning)}")
    if result.rejected:
        console.print(f"{len(result.rejected)} offers rejected (see --json), e.g. "
                      f"{safe(result.rejected[0].offer.gpu)}: {safe(result.rejected[0].reason)}")


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


def render_fit(report: FitReport, console: Console) -> None:
    table = Table(title=f"{report.gpu}: {report.capacity_bytes / GiB:.1f} GiB, "
                        f"{report.limit_bytes / GiB:.1f} GiB usable")
    for name in ("method", "peak at job settings", "fits", "largest micro-batch",
                 "largest seq len (mb 1)"):
        table.add_column(name)
    for m in report.methods:
        peak = "-" if m.peak_bytes is None else f"{m.peak_bytes / GiB:.1f} GiB"
        table.add_row(m.method.value, peak if not m.refusal else m.refusal,
                      "yes" if m.fits else "no", str(m.largest_batch), str(m.largest_seq_len))
    console.print(table)
    for s in report.suggestions:
        host = (f", host RAM {s.host_ram_bytes / GiB:,.0f} GiB"
                if s.strategy.offload.value != "none" else "")
        console.print(f"{'fits' if s.fits else 'too big'}: {s.change} -> peak "
                      f"{s.peak_bytes / GiB:.1f} GiB{host}")
