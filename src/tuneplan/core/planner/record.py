"""What a plan hands on once it is made: ``SavedPlan``, the typed record that launch bundles
and ``tuneplan cost PLAN_ID`` read, whether the plan comes straight from the planner
(``saved_plan``) or back from a saved ``tuneplan plan --json`` file (an adapter parses it).

It holds the ``Job``, the ``Strategy`` and the ``Offer`` themselves, not copies of their
fields. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from tuneplan.core.catalog.offers import Offer
from tuneplan.core.job.strategy import Job, Strategy
from tuneplan.core.planner.plan import Plan, PlanResult


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedPlan:
    """One plan of a result, as launch and re-pricing need it (seconds, bytes, USD).

    ``model_id`` is the resolved model (a bundled alias becomes its hub id);
    ``spot_interval_s`` is the Young/Daly checkpoint interval of the plan's spot Monte Carlo
    (None when spot was not simulated for it).
    """

    id: str
    model_id: str
    job: Job
    strategy: Strategy
    offer: Offer
    link: str
    step_s: float
    total_params: int
    trainable_params: int
    hours: float | None
    on_demand_usd: Decimal | None
    spot_usd: Decimal | None
    uses_spot: bool
    spot_interval_s: float | None = None
    why: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: one resumable checkpoint with its optimizer state, as the memory estimate counts it
    #: (``MemoryEstimate.checkpoint_bytes``); None in a plan file written without it
    checkpoint_bytes: int | None = None


def saved_plan(plan: Plan, result: PlanResult) -> SavedPlan:
    """The record of ``plan`` (one of ``result.plans``)."""
    c = plan.candidate
    spot = plan.spot.spot if plan.spot is not None else None
    minutes = spot.checkpoint_interval_minutes if spot is not None else None
    return SavedPlan(
        id=plan.id, model_id=result.model, job=result.job, strategy=plan.strategy,
        offer=plan.offer, link=plan.link, step_s=c.throughput.step_seconds,
        total_params=c.memory.total_params, trainable_params=c.memory.trainable_params,
        hours=plan.hours,
        on_demand_usd=plan.cost_usd, spot_usd=plan.spot_usd,
        uses_spot=plan.uses_spot, spot_interval_s=None if minutes is None else minutes * 60,
        why=plan.why, warnings=plan.warnings, checkpoint_bytes=c.memory.checkpoint_bytes)
