"""The plan page's data: a validated form → ``Job`` → the planner → the CLI's plan document,
and the views (rows, charts) the templates draw from the same result.

The model comes already resolved (``inputs.resolve_web_model``: never a path); the planner is
``core.planner.plan_offers`` fed by the same adapters as ``adapters.plans.plan``.
"""

from __future__ import annotations

import copyreg
import hashlib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from tuneplan.core.job.strategy import Job
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.plan import Plan, PlanResult
from tuneplan.units import HOUR_S, format_bytes, format_duration
from tuneplan.web.charts import MemoryChart, Scatter, memory_chart, scatter
from tuneplan.web.inputs import PlanInput, job_request


def build_job(form: BaseModel, model: ModelSpec) -> Job:
    """The Job of a validated form, through the service's one job vocabulary (``top`` stays on
    the form)."""
    return job_request(form, "plan", model.name).job()


def run_plan(form: BaseModel, model: ModelSpec, store_path: Path | None) -> PlanResult:
    """Plans over the app's catalog, by the service's planning use case."""
    from tuneplan.service.planning import plan_job

    return plan_job(build_job(form, model), model, store_path=store_path)


# ---- in the planning pool (web.capacity.PlanPool): picklable functions and their keys ----

def _mapping_proxy(items: dict[str, Any]) -> MappingProxyType[str, Any]:
    return MappingProxyType(items)


# A PlanResult holds read-only mappings (memory assumptions); they cross to the server process
# as copies. Registered wherever this module is imported: the server and every worker.
copyreg.pickle(MappingProxyType, lambda proxy: (_mapping_proxy, (dict(proxy),)))

PlanKey = tuple[str, str, int, tuple[str, int]]


def plan_key(kind: str, job: Job, model: ModelSpec, top: int, stamp: tuple[str, int]
             ) -> PlanKey:
    """The canonical request: what is returned (``kind``), the normalised job (defaults
    applied, so equal jobs from different forms meet), the model, ``top``, and the catalog
    stamp. The job and model go in by a digest of their dataclass repr."""
    digest = hashlib.sha256(f"{job!r}\n{model!r}".encode()).hexdigest()
    return (kind, digest, top, stamp)


def plan_document_bytes(job: Job, model: ModelSpec, top: int, store_path: Path | None
                        ) -> tuple[PlanKey, bytes]:
    """(key, ``tuneplan plan --json`` as UTF-8 JSON) of a job: run in a planning worker, so
    only ~200 KB of text comes back, not the whole result."""
    from tuneplan.service.jsondoc import dumps
    from tuneplan.service.planning import plan_job_stamped, plan_json

    result, stamp = plan_job_stamped(job, model, store_path=store_path)
    document = plan_json(result, top, store_path=store_path)
    return plan_key("json", job, model, top, stamp), dumps(document).encode("utf-8")


def plan_result(job: Job, model: ModelSpec, store_path: Path | None
                ) -> tuple[PlanKey, PlanResult]:
    """(key, the typed result) of a job, for the pages' views and detail pages."""
    from tuneplan.service.planning import plan_job_stamped

    result, stamp = plan_job_stamped(job, model, store_path=store_path)
    return plan_key("result", job, model, 0, stamp), result


def plan_document(result: PlanResult, top: int, store_path: Path | None) -> dict[str, Any]:
    """``tuneplan plan --json`` for a result, by the service's own document function."""
    from tuneplan.service.planning import plan_json

    return plan_json(result, top, store_path=store_path)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRow:
    """One ranked plan as the page shows it."""

    id: str
    rank: int
    title: str
    where: str
    method: str
    hours_text: str
    cost_text: str
    on_demand_text: str
    spot_text: str
    memory_text: str
    pareto: bool
    why: tuple[str, ...]
    warnings: tuple[str, ...]
    plan: Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanView:
    rows: tuple[PlanRow, ...]
    scatter: Scatter
    memory: MemoryChart | None
    memory_title: str
    feasible: int
    considered: int
    rejected: tuple[tuple[str, int], ...]   # reason, offers
    rejected_total: int


def _usd(value: Any) -> str:
    return "–" if value is None else f"${value:,.2f}"


def plan_row(plan: Plan, rank: int, pareto: bool) -> PlanRow:
    s, offer = plan.strategy, plan.offer
    nodes = f" × {s.nodes} nodes" if s.nodes > 1 else ""
    spot = "–" if plan.spot_usd is None else f"{_usd(plan.spot_usd)} expected"
    if plan.spot is not None and plan.spot.spot is not None:
        spot += f", P90 {_usd(plan.spot.spot.p90_cost)}"
    method = s.method.value + (f" r{s.lora_rank}" if s.method.is_lora else "")
    return PlanRow(
        id=plan.id, rank=rank, title=f"{s.gpus}× {plan.gpu.name}{nodes}",
        where=f"{offer.provider} · {offer.instance_type or '(GPU only)'} · "
              f"{offer.zone or offer.region}",
        method=f"{method}, micro-batch {s.batch_size}, {s.sharding.value}, "
               f"checkpointing {s.checkpointing.value}",
        hours_text=format_duration(plan.hours * HOUR_S), cost_text=_usd(plan.best_cost),
        on_demand_text=_usd(plan.cost_usd), spot_text=spot,
        memory_text=f"{format_bytes(plan.candidate.device_total_bytes)} of "
                    f"{format_bytes(plan.capacity_bytes)}",
        pareto=pareto, why=plan.why, warnings=plan.warnings, plan=plan)


def plan_memory_chart(plan: Plan) -> MemoryChart:
    """The plan's per-GPU terms stacked against its card's capacity."""
    terms = [(t.path, int(t.value)) for t in plan.candidate.memory.breakdown]
    return memory_chart(terms, plan.capacity_bytes)


def plan_view(result: PlanResult, top: int) -> PlanView:
    front = set(result.pareto_ids)
    shown = result.plans[:top]
    rows = tuple(plan_row(p, i, p.id in front) for i, p in enumerate(shown, start=1))
    # The chart shows every Pareto plan, and the shown ones, so the front is whole.
    points = [(p.id, f"{p.strategy.gpus}× {p.gpu.name} · {p.offer.provider}", p.hours,
               float(p.best_cost), rank) for rank, p in enumerate(result.plans, start=1)
              if p.id in front or rank <= top]
    reasons: dict[str, int] = {}
    for r in result.rejected:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    top_plan = shown[0] if shown else None
    return PlanView(
        rows=rows, scatter=scatter(points, front),
        memory=None if top_plan is None else plan_memory_chart(top_plan),
        memory_title="" if top_plan is None else f"#1: {rows[0].title}, {rows[0].method}",
        feasible=len(result.plans), considered=result.considered,
        rejected=tuple(sorted(reasons.items(), key=lambda kv: -kv[1])[:12]),
        rejected_total=len(result.rejected))


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanDetail:
    row: PlanRow
    memory: MemoryChart
    terms: tuple[tuple[str, str, str, str], ...]     # name, size, formula, source
    facts: tuple[tuple[str, str], ...]               # label, value
    job: PlanInput


def plan_detail_view(plan: Plan, rank: int, result: PlanResult, form: PlanInput) -> PlanDetail:
    """Everything the detail page shows about one plan."""
    est, tp, s, offer = plan.candidate.memory, plan.candidate.throughput, plan.strategy, \
        plan.offer
    terms = tuple((t.path, format_bytes(int(t.value)), t.formula, t.source)
                  for t in est.breakdown if t.value)
    on_demand = _usd(plan.cost_usd)
    if plan.on_demand is not None:
        od = plan.on_demand
        on_demand = (f"{_usd(od.cost)} (compute {_usd(od.compute_cost)}, storage "
                     f"{_usd(od.storage_cost)}, egress {_usd(od.egress_cost)})")
    spot = "–" if plan.spot_usd is None else f"{_usd(plan.spot_usd)} expected"
    if plan.spot is not None and plan.spot.spot is not None:
        sp = plan.spot.spot
        spot = (f"{_usd(sp.expected_cost)} expected, P50 {_usd(sp.p50_cost)}, P90 "
                f"{_usd(sp.p90_cost)}; {sp.interruptions_expected:.1f} interruptions expected")
    facts = [
        ("model", result.model), ("offer", f"{offer.provider} {offer.instance_type} "
                                           f"({offer.id}) in {offer.zone or offer.region}"),
        ("GPUs", f"{s.gpus} × {plan.gpu.name} per node × {s.nodes} node(s); link {plan.link}"),
        ("price", f"{_usd(offer.price_per_hour)}/h on-demand, {_usd(offer.spot_price_per_hour)}"
                  "/h spot"),
        ("method", f"{s.method.value}, {s.precision.value}, optimizer {s.optimizer.value}"),
        ("batch", f"micro-batch {s.batch_size} × grad-accum {s.grad_accum} × seq {s.seq_len}"),
        ("memory per GPU", f"{format_bytes(plan.candidate.device_total_bytes)} of "
                           f"{format_bytes(plan.capacity_bytes)} (peak during {est.peak_phase})"),
        ("throughput", f"{tp.tokens_per_second:,.0f} tokens/s, MFU {tp.mfu:.0%}, step "
                       f"{tp.step_seconds:.2f} s"),
        ("time", format_duration(plan.hours * HOUR_S)),
        ("on-demand cost", on_demand),
        ("spot cost", spot),
        ("storage", plan.storage),
        ("catalog", f"{offer.source}, fetched {offer.fetched_at:%Y-%m-%d %H:%M} UTC"),
    ]
    return PlanDetail(row=plan_row(plan, rank, plan.id in result.pareto_ids),
                      memory=plan_memory_chart(plan), terms=terms, facts=tuple(facts), job=form)


def launch_zip(plan: Plan, result: PlanResult, targets: str) -> tuple[str, bytes]:
    """(file name, zip bytes) of the plan's launch bundle, as ``tuneplan launch`` renders it,
    from the typed plan (``core.planner.record.saved_plan``). Built in memory; nothing is
    written on the server."""
    import io
    import zipfile

    from tuneplan.service.launch import result_bundle

    _, files = result_bundle(plan, result, [targets])
    buffer = io.BytesIO()
    folder = f"launch-{plan.id}"
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, text in sorted(files.items()):
            bundle.writestr(f"{folder}/{name}", text)
    return f"{folder}.zip", buffer.getvalue()
