"""The planner's grouped, price-first path returns exactly what building a Plan for every
offer and then de-duplicating returns (a straightforward reference kept here), on a generated
catalog with the same instances in several regions, price ties, spot prices, stale rows,
host-RAM differences, attachable GPUs and GPUs without a specification."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tuneplan.adapters.bundled import load_gpu_specs, load_providers
from tuneplan.adapters.hub import resolve_model
from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.catalog.offers import Offer
from tuneplan.core.catalog.providers import Provider
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Job, Objective, Strategy
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner import plan as planner
from tuneplan.core.planner.costing import (
    UnitCost,
    node_link,
    plan_warnings,
    scaled_costs,
    storage_note,
    unit_cost,
)
from tuneplan.core.planner.plan import (
    Plan,
    PlanAssumptions,
    PlanResult,
    Rejection,
    plan_id,
    plan_offers,
    rank_plans,
    ranking_cost,
)
from tuneplan.core.planner.search import Node, StrategySearch
from tuneplan.units import HOUR_S, GiB

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
SPECS = {s.name: s for s in load_gpu_specs()}
PROVIDERS = {p.name: p for p in load_providers()}
ASSUMPTIONS = PlanAssumptions(detail_spot_runs=20)


def reference_plan_offers(model: ModelSpec, job: Job, offers: Sequence[Offer],
                          gpus: Mapping[str, GpuSpec], providers: Mapping[str, Provider], *,
                          now: datetime, a: PlanAssumptions) -> PlanResult:
    """One Plan (id, costs, warnings) per offer and candidate, then limits, then one plan per
    provider, instance, GPU, count, nodes and method (cheapest, then quickest, first wins)."""
    search = StrategySearch(
        model=model, base=job.strategy, tokens=job.tokens_per_epoch, epochs=job.epochs,
        avg_tokens=None if job.strategy.packing else job.avg_tokens,
        margin=a.memory_margin, max_micro_batch_log2=max(
            0, (a.max_micro_batch_tokens // job.strategy.seq_len).bit_length() - 1),
        memory_assumptions=a.memory, throughput_assumptions=a.throughput)
    plans: list[Plan] = []
    rejected: list[Rejection] = []
    considered = 0
    prices: dict[tuple[object, ...], UnitCost] = {}
    for offer in offers:
        if not planner._wanted(job, offer):
            continue
        considered += 1
        if offer.attachable:
            rejected.append(Rejection(offer=offer, reason=(
                "GPU priced without its host VM (GCP attachable GPU): not a rentable machine "
                "on its own; add the host's price with `tuneplan catalog import`")))
            continue
        found = _reference_offer(search, job, offer, gpus, providers, now, a, prices)
        if isinstance(found, str):
            rejected.append(Rejection(offer=offer, reason=found))
        else:
            plans.extend(found)
    kept: list[Plan] = []
    for p in plans:
        if job.deadline_s is not None and p.hours * HOUR_S > job.deadline_s:
            rejected.append(Rejection(offer=p.offer, reason=(
                f"takes {p.hours:.1f} h, deadline {job.deadline_s / HOUR_S:.1f} h")))
        elif job.budget_usd is not None and p.best_cost > job.budget_usd:
            rejected.append(Rejection(offer=p.offer, reason=(
                f"costs ${p.best_cost:,.2f}, budget ${job.budget_usd:,.2f}")))
        else:
            kept.append(p)
    best: dict[tuple[object, ...], Plan] = {}
    for p in kept:
        key = (p.offer.provider, p.offer.instance_type, p.offer.gpu, p.offer.gpu_count,
               p.strategy.nodes, p.strategy.method)
        if key not in best or (p.best_cost, p.hours) < (best[key].best_cost, best[key].hours):
            best[key] = p
    ranked, front = rank_plans(list(best.values()), job.objective, a.min_pareto_saving_s)
    ranked = planner._explain(ranked, front, job, a, providers, search)
    return PlanResult(job=job, model=model.name, plans=tuple(ranked), pareto_ids=front,
                      rejected=tuple(rejected), considered=considered, assumptions=a,
                      memory_estimates=search.memory_calls)


def _reference_offer(search: StrategySearch, job: Job, offer: Offer,
                     gpus: Mapping[str, GpuSpec], providers: Mapping[str, Provider],
                     now: datetime, a: PlanAssumptions,
                     prices: dict[tuple[object, ...], UnitCost]) -> list[Plan] | str:
    gpu = gpus.get(offer.gpu)
    if gpu is None:
        return f"no GPU specification for {offer.gpu}"
    link = node_link(offer, gpu)
    problem = planner._hardware_problem(job, gpu, link)
    if problem:
        return problem
    capacity = min(gpu.usable_memory_bytes, offer.gpu_memory_bytes) if (
        offer.gpu_memory_bytes >= gpu.memory_bytes * 0.9) else (
        offer.gpu_memory_bytes * gpu.usable_memory_bytes // gpu.memory_bytes)
    node = Node(gpu=gpu, gpus_per_node=offer.gpu_count, capacity_bytes=capacity,
                intra_link="pcie" if link == "pcie" else "auto")
    provider = providers.get(offer.provider)
    outcome = search.search(node)
    short = planner._host_ram_short(outcome.best.values(), offer)
    if len(short) == len(outcome.best) and job.multi_node and planner._multi_node_ok(provider):
        bigger = planner._more_nodes(search, job, node, None, a, offer)
        if bigger is not None:
            outcome, short = bigger, {}
    if not outcome.best:
        return planner._why_not(outcome.smallest_need_bytes, outcome.refusals, capacity, a)
    out: list[Plan] = []
    for candidate in outcome.best.values():
        if id(candidate) in short:
            continue
        key = (id(candidate), offer.provider)
        if key not in prices:
            prices[key] = unit_cost(candidate, provider, job, a.cost)
        cost, spot = scaled_costs(prices[key], offer, candidate.strategy.nodes)
        plan = Plan(id=plan_id(offer, candidate.strategy), offer=offer, gpu=gpu,
                    candidate=candidate, link=link, capacity_bytes=capacity,
                    hours=prices[key].wall_hours, cost_usd=cost, spot_usd=spot,
                    spot_hours=prices[key].spot_expected_hours,
                    spot_may_win=job.spot is True,
                    best_cost=ranking_cost(cost, spot, job.spot is True),
                    storage=storage_note(provider),
                    warnings=tuple(plan_warnings(
                        candidate, offer, gpu, provider, link, now=now,
                        stale_after_s=a.stale_after_s)))
        out.append(replace(plan, risk=planner.plan_risk(plan, provider, a.cost)))
    return out or next(iter(short.values()))


def _offer(provider: str, gpu: str, count: int, price: str | None, region: str, *,
           spot: str | None = None, ram_gib: int | None = 512, days_old: int = 0,
           interconnect: str | None = None, attachable: bool = False) -> Offer:
    return Offer(provider=provider, instance_type=f"{count}x-{gpu}".replace(" ", "-"), gpu=gpu,
                 gpu_count=count, gpu_memory_bytes=SPECS[gpu].memory_bytes, vcpus=32,
                 ram_bytes=None if ram_gib is None else ram_gib * GiB, region=region,
                 price_per_hour=None if price is None else Decimal(price),
                 spot_price_per_hour=None if spot is None else Decimal(spot),
                 interconnect=interconnect, fetched_at=NOW - timedelta(days=days_old),
                 source="generated", attachable=attachable)


def generated_catalog() -> list[Offer]:
    """Real-looking shapes, each copied into several regions with shuffled prices."""
    base = [
        _offer("RunPod", "RTX 4090", 1, "0.69", "us-east", spot="0.35"),
        _offer("RunPod", "L40S", 1, "0.86", "us-east", spot="0.40"),
        _offer("Lambda", "A100 80GB SXM4", 1, "1.29", "us-west", ram_gib=None),
        _offer("Lambda", "H100 SXM5", 8, "23.92", "us-west", interconnect="NVLink 4.0"),
        _offer("AWS", "A10G", 1, "1.006", "us-east-1", spot="0.45", ram_gib=16),
        _offer("AWS", "L4", 4, "4.60", "us-east-1", spot="1.80", ram_gib=48),
        _offer("GCP", "T4", 1, "0.35", "us-central1", spot="0.11", attachable=True),
        _offer("GCP", "L4", 1, "0.71", "us-central1", spot="0.22", ram_gib=16),
        _offer("Azure", "A100 80GB PCIe", 2, "7.35", "eastus", spot=None),
        _offer("Vast.ai", "RTX 3090", 2, None, "eu-west", spot="0.20"),
    ]
    out: list[Offer] = []
    # The same price in two regions (first listed wins), a dearer one, a cheaper later one,
    # a stale one, one with less RAM (another shape, same instance name).
    shifts = [("a", "1.00", 0, None), ("b", "1.00", 0, None), ("c", "1.25", 40, None),
              ("d", "0.97", 0, None), ("e", "0.99", 10, 8)]
    for tag, factor, days, ram in shifts:
        for o in base:
            scale = Decimal(factor)
            out.append(replace(
                o, region=f"{o.region}-{tag}",
                price_per_hour=None if o.price_per_hour is None else o.price_per_hour * scale,
                spot_price_per_hour=None if o.spot_price_per_hour is None
                else o.spot_price_per_hour * scale,
                fetched_at=NOW - timedelta(days=days),
                ram_bytes=o.ram_bytes if ram is None or o.ram_bytes is None else ram * GiB))
    return out


JOBS = {
    "qlora": {"strategy": Strategy(method=Method.QLORA)},
    "auto spot": {"strategy": Strategy(method=Method.AUTO), "spot": True},
    "auto budget deadline time": {"strategy": Strategy(method=Method.AUTO),
                                  "budget_usd": Decimal(6), "deadline_s": 20 * HOUR_S,
                                  "objective": Objective.TIME},
    "lora pareto no spot regions": {"strategy": Strategy(method=Method.LORA), "spot": False,
                                    "objective": Objective.PARETO, "regions": ("us",)},
}


@pytest.mark.parametrize("name", list(JOBS))
def test_the_optimised_planner_matches_the_reference(name: str) -> None:
    model = "Qwen/Qwen2.5-0.5B"
    spec = resolve_model(model)
    job = Job(model=model, tokens=50_000_000, **JOBS[name])  # type: ignore[arg-type]
    offers = generated_catalog()
    gpus = {k: v for k, v in SPECS.items() if k != "RTX 3090"}   # one GPU without a spec
    fast = plan_offers(spec, job, offers, gpus, PROVIDERS, now=NOW, assumptions=ASSUMPTIONS)
    slow = reference_plan_offers(spec, job, offers, gpus, PROVIDERS, now=NOW, a=ASSUMPTIONS)
    assert [p.id for p in fast.plans] == [p.id for p in slow.plans]
    assert [(p.cost_usd, p.spot_usd, p.best_cost, p.why, p.warnings) for p in fast.plans] == [
        (p.cost_usd, p.spot_usd, p.best_cost, p.why, p.warnings) for p in slow.plans]
    assert fast.plans == slow.plans
    assert fast.pareto_ids == slow.pareto_ids
    # The reference says why; the planner also classifies the why (``kind``) for its diagnosis.
    assert [(r.offer, r.reason) for r in fast.rejected] == [
        (r.offer, r.reason) for r in slow.rejected]
    assert fast.considered == slow.considered
    assert fast.plans, "the generated catalog should leave something to rank"
    # the duplicates really were collapsed: one plan per instance and method
    assert len(fast.plans) < len([o for o in offers if o.price_per_hour is not None])
