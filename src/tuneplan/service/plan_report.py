"""Present a PlanResult or a FitReport: the JSON documents of docs/CLI.md.

Presentation only: numbers come from ``core.planner.plan`` / ``core.planner.fit`` and are not
recomputed;
money stays Decimal until printed. Used by ``cli_plan`` (and the web app later).
"""

from __future__ import annotations

from typing import Any

from tuneplan.adapters.plans import CatalogInfo
from tuneplan.core.catalog.offers import offer_record
from tuneplan.core.job.strategy import Job
from tuneplan.core.planner.plan import Plan, PlanResult, fixed_values
from tuneplan.core.planner.search import memory_limit


def spot_part(p: Plan) -> dict[str, Any] | None:
    """The plan's spot figures: ``expected_usd`` is the plan's own ``spot_usd`` (what ranking,
    the table and the why-line use); P50/P90 come from the detailed Monte Carlo."""
    if p.spot_usd is None:
        return None
    out: dict[str, Any] = {"expected_usd": p.spot_usd, "expected_hours": p.spot_hours}
    if p.spot is not None and p.spot.spot is not None:
        s = p.spot.spot
        out |= {"p50_usd": s.p50_cost, "p90_usd": s.p90_cost,
                "simulated_mean_usd": s.simulated_mean_cost,
                "p90_hours": s.p90_hours,
                "checkpoint_interval_minutes": s.checkpoint_interval_minutes,
                "interruptions_expected": s.interruptions_expected,
                "interruptions_per_hour": s.interruptions_per_hour}
    return out


def risk_part(p: Plan) -> dict[str, Any] | None:
    """A plan's risks (``core.planner.risk``): each part a fraction of its cost, their reasons,
    the time range and the risk-priced cost ``--objective risk`` ranks by."""
    if p.risk is None:
        return None
    low, high = p.risk.hours_range(p.best_hours)
    return {**p.risk.as_dict(), "hours_range": [low, high], "risk_priced_usd": p.risk_cost}


def plan_entry(p: Plan, result: PlanResult, job: Job | None = None) -> dict[str, Any]:
    """One plan as docs/CLI.md's ``plans[]`` entry; ``job`` (default: the result's) is the job
    the plan meets, which a relaxation's plan has of its own."""
    job = job or result.job
    c, t = p.candidate, p.candidate.throughput
    margin = result.assumptions.memory_margin
    limit = memory_limit(p.capacity_bytes, margin)
    offer = offer_record(p.offer)
    if job.spot is False:  # --no-spot: spot prices are not part of the answer
        offer |= {"spot_price_per_hour": None, "spot_price_per_gpu_hour": None}
    cost: dict[str, Any] = {
        "hours": p.hours, "on_demand_usd": p.cost_usd, "spot": spot_part(p),
        "uses_spot": p.uses_spot, "ranked_usd": p.best_cost, "storage_note": p.storage}
    if p.on_demand is not None:  # the breakdown; the total stays the plan's own figure
        cost |= {"compute_usd": p.on_demand.compute_cost,
                 "storage_usd": p.on_demand.storage_cost, "egress_usd": p.on_demand.egress_cost,
                 "billing": p.on_demand.billing}
    return {
        "id": p.id, "offer": offer,
        "strategy": {**p.strategy.as_dict(), "link": p.link},
        "memory": {"device_total_bytes": c.device_total_bytes,
                   "capacity_bytes": p.capacity_bytes,
                   "headroom_bytes": p.capacity_bytes - c.device_total_bytes,
                   "limit_bytes": limit, "margin": margin,
                   "nominal_bytes": p.gpu.memory_bytes,
                   "usable_basis": p.gpu.usable_memory.basis,
                   "usable_source": p.gpu.usable_memory.source,
                   "usable_confidence": p.gpu.usable_memory.confidence,
                   "compared": "device_total_bytes (CUDA context, workspaces and allocator "
                               "reserve included) <= capacity_bytes (the card's usable, "
                               "CUDA-visible total) x margin",
                   "allocated_peak_bytes": c.memory.allocated_peak_bytes,
                   "reserved_peak_bytes": c.memory.reserved_peak_bytes,
                   "host_ram_bytes": c.host_ram_bytes, "peak_phase": c.memory.peak_phase,
                   # a paged optimizer's state in host RAM at the peak (not in the device
                   # total, which is what stays on the card)
                   "paged_out_bytes": c.paged_out_bytes,
                   "exact_for_gpu": c.exact, "trainable_params": c.memory.trainable_params,
                   "total_params": c.memory.total_params,
                   # one resumable checkpoint, all ranks together: with the optimizer's
                   # state, and its saved weights alone
                   "checkpoint_bytes": c.memory.checkpoint_bytes,
                   "checkpoint_weights_bytes": c.memory.checkpoint_weights_bytes,
                   # per GPU, term by term (they sum to device_total_bytes): only for plans
                   # whose estimate is this strategy's own on this GPU generation
                   "terms": [{"name": t.path, "bytes": int(t.value), "formula": t.formula}
                             for t in c.memory.breakdown] if c.exact else None},
        "throughput": {"tokens_per_second": t.tokens_per_second,
                       "tokens_per_second_per_gpu": t.tokens_per_second_per_gpu,
                       "step_seconds": t.step_seconds, "mfu": t.mfu, "bound": t.bound,
                       "bound_seconds": t.bound_seconds(), "training_hours": t.hours,
                       "notes": list(t.notes),
                       "time_basis": t.time_basis.as_dict(
                           tokens_per_second=t.tokens_per_second, hours=t.hours)},
        "cost": cost, "pareto": p.id in result.pareto_ids, "risk": risk_part(p),
        "fixed": sorted(fixed_values(job)),
        "why": list(p.why), "warnings": list(p.warnings),
    }


def plan_document(result: PlanResult, catalog: CatalogInfo, top: int) -> dict[str, Any]:
    """The ``tuneplan plan --json`` document (docs/CLI.md's keys first). ``feasible`` is
    false when no plan exists; ``binding`` and ``relaxations`` then say why and what changes
    (in the planner's order: memory, budget, deadline, fixed flags, filters)."""
    why = result.infeasible
    return {
        "job": result.job.as_dict(),
        "catalog": {"fetched_at": catalog.fetched_at, "sources": list(catalog.sources)},
        "plans": [plan_entry(p, result) for p in result.plans[:top]],
        # the best plan of each node count not among ``plans`` (several nodes ranked lower),
        # with its rank and its per-GPU breakdown
        "best_of_other_node_counts": [{"rank": rank, **plan_entry(p, result)}
                                      for rank, p in result.best_of_other_node_counts(top)],
        "pareto_front": list(result.pareto_ids),
        "rejected": [{"offer_id": r.offer.id, "provider": r.offer.provider,
                      "instance_type": r.offer.instance_type, "gpu": r.offer.gpu,
                      "gpu_count": r.offer.gpu_count, "region": r.offer.region,
                      "reason": r.reason} for r in result.rejected],
        "model": result.model, "objective": result.job.objective.value,
        "considered_offers": result.considered, "feasible_plans": len(result.plans),
        "assumptions": result.assumptions.describe(),
        # the speed model's constants with why (a probed GPU's plans replace its matmul
        # efficiency: their throughput.time_basis names the probe)
        "throughput_assumptions": result.assumptions.throughput.describe(),
        "notes": list(result.notes),
        "feasible": result.feasible,
        "fixed": fixed_values(result.job),
        "binding": [b.as_dict() for b in why.binding] if why else [],
        "relaxations": [r.as_dict() for r in why.relaxations] if why else [],
        # the plans the relaxations quote, whole and each with the job it meets: saved like
        # ``plans`` so ``tuneplan cost ID`` / ``launch ID`` find them
        "relaxation_plans": [{**plan_entry(r.plan, result, r.job), "job": r.job.as_dict(),
                              "relaxation": r.change} for r in result.relaxed],
    }
