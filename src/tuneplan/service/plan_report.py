"""Present a PlanResult or a FitReport: the JSON document of CLI.md and the Rich tables.

Presentation only: numbers come from ``core.planner.plan`` / ``core.planner.fit`` and are not
recomputed;
money stays Decimal until printed. Used by ``cli_plan`` (and the web app later).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from tuneplan.adapters.plans import CatalogInfo
from tuneplan.core.catalog.offers import offer_record
from tuneplan.core.planner.fit import FitReport
from tuneplan.core.planner.plan import Plan, PlanResult
from tuneplan.units import HOUR_S, GiB, format_duration


def _spot_part(p: Plan) -> dict[str, Any] | None:
    if p.spot_usd is None:
        return None
    out: dict[str, Any] = {"expected_usd": p.spot_usd, "expected_hours": p.spot_hours}
    if p.spot is not None and p.spot.spot is not None:
        s = p.spot.spot
        out |= {"expected_usd": s.expected_cost, "p50_usd": s.p50_cost, "p90_usd": s.p90_cost,
                "p90_hours": s.p90_hours,
                "checkpoint_interval_minutes": s.checkpoint_interval_minutes,
                "interruptions_expected": s.interruptions_expected,
                "interruptions_per_hour": s.interruptions_per_hour}
    return out


def plan_entry(p: Plan, result: PlanResult) -> dict[str, Any]:
    """One plan as CLI.md's ``plans[]`` entry."""
    c, t = p.candidate, p.candidate.throughput
    offer = offer_record(p.offer)
    if result.job.spot is False:  # --no-spot: spot prices are not part of the answer
        offer |= {"spot_price_per_hour": None, "spot_price_per_gpu_hour": None}
    cost: dict[str, Any] = {
        "hours": p.hours, "on_demand_usd": p.cost_usd, "spot": _spot_part(p),
        "uses_spot": p.uses_spot, "ranked_usd": p.best_cost, "storage_note": p.storage}
    if p.on_demand is not None:
        cost |= {"on_demand_usd": p.on_demand.cost, "compute_usd": p.on_demand.compute_cost,
                 "storage_usd": p.on_demand.storage_cost, "egress_usd": p.on_demand.egress_cost,
                 "billing": p.on_demand.billing}
    return {
        "id": p.id, "offer": offer,
        "strategy": {**p.strategy.as_dict(), "link": p.link},
        "memory": {"device_total_bytes": c.device_total_bytes,
                   "capacity_bytes": p.capacity_bytes,
                   "headroom_bytes": p.capacity_bytes - c.device_total_bytes,
                   "allocated_peak_bytes": c.memory.allocated_peak_bytes,
                   "reserved_peak_bytes": c.memory.reserved_peak_bytes,
                   "host_ram_bytes": c.host_ram_bytes, "peak_phase": c.memory.peak_phase,
                   "exact_for_gpu": c.exact, "trainable_params": c.memory.trainable_params,
                   "total_params": c.memory.total_params},
        "throughput": {"tokens_per_second": t.tokens_per_second,
                       "tokens_per_second_per_gpu": t.tokens_per_second_per_gpu,
                       "step_seconds": t.step_seconds, "mfu": t.mfu, "training_hours": t.hours},
        "cost": cost, "pareto": p.id in result.pareto_ids,
        "why": list(p.why), "warnings": list(p.warnings),
    }


def plan_document(result: PlanResult, catalog: CatalogInfo, top: int) -> dict[str, Any]:
    """The ``tuneplan plan --json`` document (CLI.md keys first)."""
    return {
        "job": result.job.as_dict(),
        "catalog": {"fetched_at": catalog.fetched_at, "sources": list(catalog.sources)},
        "plans": [plan_entry(p, result) for p in result.plans[:top]],
        "pareto_front": list(result.pareto_ids),
        "rejected": [{"offer_id": r.offer.id, "provider": r.offer.provider,
                      "instance_type": r.offer.instance_type, "gpu": r.offer.gpu,
                      "gpu_count": r.offer.gpu_count, "region": r.offer.region,
                      "reason": r.reason} for r in result.rejected],
        "model": result.model, "objective": result.job.objective.value,
        "considered_offers": result.considered, "feasible_plans": len(result.plans),
        "assumptions": result.assumptions.describe(),
    }


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
    part = _spot_part(p)
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
    table = Table(title=f"{result.model}: top {min(top, len(result.plans))} of "
                        f"{len(result.plans)} plans by {result.job.objective.value}")
    for name in ("#", "id", "provider", "instance", "GPUs", "mem/GPU GiB", "settings",
                 "tok/s", "hours", "on-demand", "spot exp/P90", "billing", "storage"):
        table.add_column(name, justify="right" if name in ("#", "tok/s", "hours") else "left",
                         overflow="fold")
    for rank, p in enumerate(result.plans[:top], start=1):
        gpus = f"{p.strategy.gpus}x {p.gpu.name}" + (
            f" x{p.strategy.nodes}" if p.strategy.nodes > 1 else "")
        table.add_row(
            str(rank), p.id, p.offer.provider, f"{p.offer.instance_type} ({p.offer.region})",
            gpus, f"{p.candidate.device_total_bytes / GiB:.1f}/{p.capacity_bytes / GiB:.0f}",
            _settings(p), f"{p.candidate.throughput.tokens_per_second:,.0f}",
            f"{p.hours:.2f}", _usd(p.cost_usd), _spot_text(p), _billing(p), p.storage)
    console.print(table)
    _print_front(result, console)
    _print_catalog(catalog, now, console)
    for rank, p in enumerate(result.plans[:top], start=1):
        console.print(f"[bold]#{rank} {p.id}[/bold] why: " + "; ".join(p.why[1:] or p.why))
        for warning in p.warnings:
            console.print(f"   warning: {warning}")
    if result.rejected:
        console.print(f"{len(result.rejected)} offers rejected (see --json), e.g. "
                      f"{result.rejected[0].offer.gpu}: {result.rejected[0].reason}")


def _print_front(result: PlanResult, console: Console) -> None:
    by_id = {p.id: p for p in result.plans}
    points = [by_id[i] for i in result.pareto_ids if i in by_id]
    text = ", ".join(f"{_usd(p.best_cost)} in {format_duration(p.hours * HOUR_S)} "
                     f"({p.strategy.world_size}x {p.gpu.name}, {p.offer.provider})"
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
                  + (f"; stale: {', '.join(stale)}" if stale else ""))


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
