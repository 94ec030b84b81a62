"""The planner's answers an expert checks: an impossible job names what binds and what a
relaxation costs (and the relaxation really gives that plan), one spot figure everywhere,
and flags the person fixed are kept."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from tests.core.test_planner import MIXED, NOW, PROVIDERS, SPECS, offer, run
from tuneplan.adapters.hub import resolve_model
from tuneplan.core.catalog.offers import Offer
from tuneplan.core.cost.estimate import Billing, billed_seconds
from tuneplan.core.cost.spot import SpotModel, expected_billed_s, expected_wall_s, simulate
from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.strategy import Job, Sharding, Strategy
from tuneplan.core.planner.plan import Plan, PlanResult, plan_offers
from tuneplan.units import HOUR_S

MODEL = "meta-llama/Llama-3.1-8B"
TOKENS = 300_000_000


def _loose() -> PlanResult:
    return run(MODEL, "lora", MIXED, tokens=TOKENS)


def test_budget_and_deadline_that_cannot_both_hold_name_both_with_real_relaxations() -> None:
    plans = _loose().plans
    cheapest = min(plans, key=lambda p: (p.best_cost, p.hours))
    fastest = min(plans, key=lambda p: (p.hours, p.best_cost))
    assert fastest.hours < cheapest.hours and fastest.best_cost > cheapest.best_cost
    # The budget buys only the cheapest plan; the deadline is a bit shorter than it takes.
    budget, deadline_s = cheapest.best_cost, cheapest.hours * HOUR_S * 0.9
    result = run(MODEL, "lora", MIXED, tokens=TOKENS, budget_usd=budget, deadline_s=deadline_s)
    assert not result.plans and result.infeasible is not None
    binding = [b.constraint for b in result.infeasible.binding]
    assert binding[:2] == ["budget", "deadline"]
    by_kind = {r.constraint: r for r in result.infeasible.relaxations}
    # Budget: the cheapest plan that meets the deadline, and exactly what it costs more.
    on_time = min((p for p in plans if p.hours * HOUR_S <= deadline_s),
                  key=lambda p: (p.best_cost, p.hours))
    money = by_kind["budget"]
    assert money.plan is not None and money.plan.id == on_time.id
    assert money.unit == "USD" and money.amount == on_time.best_cost - budget > 0
    # Deadline: the cheapest plan is the only one within budget; the extra hours make it fit.
    time = by_kind["deadline"]
    assert time.plan is not None and time.plan.id == cheapest.id and time.unit == "h"
    assert isinstance(time.amount, float)
    assert time.amount == pytest.approx(cheapest.hours - deadline_s / HOUR_S)
    # Each relaxation, applied, gives the plan it names.
    raised = run(MODEL, "lora", MIXED, tokens=TOKENS, budget_usd=budget + money.amount,
                 deadline_s=deadline_s)
    assert raised.plans[0].id == on_time.id
    later = run(MODEL, "lora", MIXED, tokens=TOKENS, budget_usd=budget,
                deadline_s=deadline_s + time.amount * HOUR_S)
    assert [p.id for p in later.plans] == [cheapest.id]


def test_when_neither_alone_is_enough_both_bind_and_the_relaxation_moves_both() -> None:
    plans = _loose().plans
    cheapest = min(plans, key=lambda p: (p.best_cost, p.hours))
    fastest = min(plans, key=lambda p: (p.hours, p.best_cost))
    budget = cheapest.best_cost / 2
    deadline_s = fastest.hours * HOUR_S / 2
    result = run(MODEL, "lora", MIXED, tokens=TOKENS, budget_usd=budget, deadline_s=deadline_s)
    assert result.infeasible is not None
    details = {b.constraint: b.detail for b in result.infeasible.binding}
    assert f"${cheapest.best_cost:,.2f}" in details["budget"]
    assert f"{fastest.hours:.1f} h" in details["deadline"]
    both = [r for r in result.infeasible.relaxations if r.constraint == "budget"]
    assert both[0].plan is not None and both[0].plan.id == cheapest.id
    assert both[0].amount == cheapest.best_cost - budget and "deadline +" in both[0].change


def test_memory_binds_when_nothing_fits_and_the_method_relaxation_is_a_real_plan() -> None:
    small = [o for o in MIXED if o.gpu_count == 1 and o.gpu_memory_bytes < 30 * 2**30]
    result = run("meta-llama/Llama-3.1-70B", "lora", small)
    assert result.infeasible is not None
    assert result.infeasible.binding[0].constraint == "memory"
    assert "nothing fits in GPU memory" in result.infeasible.binding[0].detail
    fit_changes = [r for r in result.infeasible.relaxations if r.constraint == "memory"]
    assert fit_changes and all(r.unit == "bytes" and r.plan is None for r in fit_changes)
    # 70B in 4 bits (~35 GB of weights) fits no 16-24 GB card either: no method relaxation.
    assert not any(r.constraint == "flag:method" for r in result.infeasible.relaxations)
    # On the 80 GB cards QLoRA fits where LoRA does not: the relaxation names that plan.
    one_gpu = [o for o in MIXED if o.gpu_count == 1]
    lora = run("meta-llama/Llama-3.1-70B", "lora", one_gpu)
    assert lora.infeasible is not None
    method = next(r for r in lora.infeasible.relaxations if r.constraint == "flag:method")
    qlora = run("meta-llama/Llama-3.1-70B", "qlora", one_gpu)
    assert method.plan is not None and method.plan.id == qlora.plans[0].id
    assert "--method qlora instead of lora" in method.change


def test_a_job_the_estimator_cannot_handle_says_exactly_that() -> None:
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    job = Job(model=spec.name, strategy=Strategy(method=Method.QLORA, quant=Quant.INT2),
              tokens=1_000_000)
    result = plan_offers(spec, job, MIXED, SPECS, PROVIDERS, now=NOW)
    assert result.infeasible is not None
    [binding] = [b for b in result.infeasible.binding if b.constraint == "estimate"]
    assert "cannot estimate" in binding.detail and "not estimated yet" in binding.detail
    assert result.infeasible.binding[0].constraint == "estimate"


def test_a_fixed_micro_batch_is_kept_and_marked_in_every_plan() -> None:
    free = _loose()
    assert any(p.strategy.batch_size != 2 for p in free.plans)   # the search would move it
    strategy = Strategy(method=Method.LORA, batch_size=2)
    fixed = run(MODEL, "lora", MIXED, tokens=TOKENS, strategy=strategy, fixed=("batch_size",))
    assert fixed.plans and all(p.strategy.batch_size == 2 for p in fixed.plans)
    assert all("micro-batch 2 [fixed]" in p.why[1] for p in fixed.plans)
    assert all("[fixed]" not in p.why[1] for p in free.plans)


def test_fixed_gpus_and_sharding_are_kept_and_a_binding_gpu_count_is_relaxed() -> None:
    one = run(MODEL, "lora", MIXED, tokens=TOKENS, strategy=Strategy(gpus=1), fixed=("gpus",))
    assert one.plans and all(p.strategy.world_size == 1 and p.offer.gpu_count == 1
                             for p in one.plans)
    zero3 = run(MODEL, "lora", MIXED, tokens=TOKENS,
                strategy=Strategy(gpus=8, sharding=Sharding.ZERO3), fixed=("gpus", "sharding"))
    assert zero3.plans and all(p.strategy.gpus == 8 and p.strategy.sharding is Sharding.ZERO3
                               for p in zero3.plans)
    # Full 70B needs a whole 8-GPU node: with --gpus 1 fixed nothing fits, and the gpus flag
    # binds with the plan that freeing it gives.
    full = Strategy(method=Method.FULL, gpus=1)
    stuck = run("meta-llama/Llama-3.1-70B", "full", MIXED, strategy=full, fixed=("gpus",))
    assert not stuck.plans and stuck.infeasible is not None
    assert any(b.constraint == "flag:gpus" for b in stuck.infeasible.binding)
    relax = next(r for r in stuck.infeasible.relaxations if r.constraint == "flag:gpus")
    free = run("meta-llama/Llama-3.1-70B", "full", MIXED, strategy=full)
    assert relax.plan is not None and relax.plan.gpus > 1
    assert relax.plan.id == free.plans[0].id


def test_one_spot_figure_ranks_fills_the_detail_and_the_words() -> None:
    offers = [offer("L40S", 1, "1.20", spot="0.40", provider="AWS"),
              offer("H100 SXM5", 1, "2.99", spot="1.10", provider="AWS"),
              # Billed per hour (assumed): spot's figure must include each session's rounding.
              offer("A100 80GB SXM4", 1, "1.60", spot="0.55", provider="Verda (ex-DataCrunch)"),
              offer("L40S", 1, "0.95", spot="0.45", provider="Verda (ex-DataCrunch)")]
    result = run(MODEL, "qlora", offers, tokens=TOKENS, spot=True)
    ranked = [p.best_cost for p in result.plans]
    assert ranked == sorted(ranked)
    for p in result.plans:
        assert p.spot is not None and p.spot.spot is not None and p.on_demand is not None
        # The detailed estimate quotes the same numbers the plan was ranked by ...
        assert p.spot.spot.expected_cost == p.spot_usd
        assert p.on_demand.cost == p.cost_usd
        assert p.best_cost == (p.spot_usd if p.uses_spot else p.cost_usd)
        # ... and the words quote them too.
        assert f"spot expected ${p.spot_usd:,.2f}" in p.why[-1]
        # The figure is the billed expectation: within 2 % of the simulated runs' mean.
        assert p.spot_usd is not None
        assert float(p.spot_usd) == pytest.approx(float(p.spot.spot.simulated_mean_cost),
                                                  rel=0.02)
    hourly = [p for p in result.plans if p.offer.provider.startswith("Verda")]
    # Verda states no granularity: the cost model assumes per hour (CostAssumptions).
    assert hourly and all(p.on_demand is not None and p.on_demand.billing["granularity_s"]
                          == HOUR_S for p in hourly)
    for p in hourly:
        # Per-hour billing rounds every session up: more than price x expected hours (what
        # the ranking once used, while the table showed the billed simulation).
        assert p.spot_hours is not None and p.offer.spot_price_per_hour is not None
        assert p.on_demand is not None and p.spot_usd is not None
        unbilled = (p.offer.spot_price_per_hour * Decimal(str(p.spot_hours))
                    + p.on_demand.storage_cost + p.on_demand.egress_cost)
        assert p.spot_usd > unbilled


@pytest.mark.parametrize(("work_h", "rate", "step", "minimum", "notice", "within"), [
    (2.58, 0.1, 3600, 0, False, 0.015), (0.45, 0.1, 3600, 0, False, 0.015),
    (1.0, 0.1, 3600, 3600, False, 0.015), (6.0, 0.1, 1, 0, False, 0.015),
    (13.0, 0.1, 3600, 0, False, 0.015), (30.0, 0.1, 3600, 0, True, 0.015),
    (5.0, 0.5, 60, 600, True, 0.015), (1.0, 1.0, 3600, 0, False, 0.015),
    (10.0, 1.0, 3600, 0, False, 0.03)])
def test_the_analytic_billed_expectation_matches_simulated_billing(
        work_h: float, rate: float, step: int, minimum: int, notice: bool,
        within: float) -> None:
    # Checkpoints every hour (a whole billing step: the rounding of the sessions is lumpy)
    model = SpotModel(work_s=work_h * HOUR_S, interval_s=3_600.0, checkpoint_s=60.0,
                      restart_s=600.0, rate_per_s=rate / HOUR_S, saves_on_notice=notice)
    billing = Billing(granularity_s=step, minimum_s=minimum)
    runs = simulate(model, runs=20_000, seed=3)
    simulated = sum(sum(billed_seconds(s, billing) for s in r.sessions_s) for r in runs)
    analytic = expected_billed_s(model, step, minimum)
    assert analytic == pytest.approx(simulated / len(runs), rel=within)
    # Billing only ever adds: never below the expected wall time.
    assert analytic >= expected_wall_s(model)[0]


def test_the_spot_figure_does_not_depend_on_how_many_plans_get_the_detail() -> None:
    offers = [offer("L40S", 1, "1.20", spot="0.40", provider="AWS"),
              offer("A100 80GB SXM4", 1, "1.60", spot="0.55", provider="Verda (ex-DataCrunch)")]
    spec = resolve_model(MODEL)
    job = Job(model=MODEL, strategy=Strategy(method=Method.QLORA), tokens=TOKENS, spot=True)
    from tuneplan.core.planner.plan import PlanAssumptions

    detailed = plan_offers(spec, job, offers, SPECS, PROVIDERS, now=NOW)
    bare = plan_offers(spec, job, offers, SPECS, PROVIDERS, now=NOW,
                       assumptions=replace(PlanAssumptions(), detailed_plans=0))
    assert [(p.id, p.spot_usd, p.best_cost) for p in detailed.plans] == [
        (p.id, p.spot_usd, p.best_cost) for p in bare.plans]
    assert all(p.spot is None for p in bare.plans)
    assert Decimal(0) < detailed.plans[0].best_cost


def test_spot_wins_only_where_its_expected_run_meets_the_deadline() -> None:
    offers = [offer("L40S", 1, "1.20", spot="0.30", provider="AWS")]
    free = run(MODEL, "qlora", offers, tokens=TOKENS, spot=True).plans[0]
    assert free.uses_spot and free.spot_hours is not None and free.spot_hours > free.hours
    # Between the on-demand run and spot's expected one (interruptions, restarts).
    deadline_s = (free.hours + free.spot_hours) / 2 * HOUR_S
    tight = run(MODEL, "qlora", offers, tokens=TOKENS, spot=True, deadline_s=deadline_s)
    [p] = tight.plans
    assert not p.uses_spot and p.best_cost == p.cost_usd and p.best_hours == p.hours
    assert p.best_hours * HOUR_S <= deadline_s
    assert "spot expected" not in " ".join(p.why)


def test_a_budget_only_spot_meets_names_spot_as_the_relaxation() -> None:
    offers = [offer("L40S", 1, "1.20", spot="0.30", provider="AWS"),
              offer("H100 SXM5", 1, "2.99", spot="0.90", provider="AWS")]
    allowed = run(MODEL, "qlora", offers, tokens=TOKENS, spot=True).plans[0]
    on_demand = min(p.cost_usd for p in _loose_over(offers) if p.cost_usd is not None)
    assert allowed.uses_spot and allowed.best_cost < on_demand
    budget = (allowed.best_cost + on_demand) / 2
    result = run(MODEL, "qlora", offers, tokens=TOKENS, budget_usd=budget)
    assert result.infeasible is not None
    assert [b.constraint for b in result.infeasible.binding] == ["budget", "flag:spot"]
    spot = next(r for r in result.infeasible.relaxations if r.constraint == "flag:spot")
    assert spot.plan is not None and spot.plan.id == allowed.id
    assert spot.plan.cost_usd == allowed.best_cost <= budget
    money = next(r for r in result.infeasible.relaxations if r.constraint == "budget")
    assert money.amount == on_demand - budget


def _loose_over(offers: list[Offer]) -> tuple[Plan, ...]:
    return run(MODEL, "qlora", offers, tokens=TOKENS).plans
