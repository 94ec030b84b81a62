"""Strategies x offers -> ranked plans (cost, time or Pareto), with why, warnings and the
offers rejected with their reason.

Pure: the model, offers, GPU specs, providers and "now" come in as values; ``adapters.plans``
loads them and saves the result. Strategy search is ``core.planner.search``; cost and warnings
``core.planner.costing``; the fit solver for impossible jobs ``core.planner.fit``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from functools import lru_cache

from tuneplan.core.catalog.hardware import GpuSpec, card_capacity_bytes
from tuneplan.core.catalog.offers import Offer, gpu_matches, provider_matches
from tuneplan.core.catalog.providers import Provider
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.cost.estimate import CostAssumptions, CostEstimate, cents
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Interconnect, Job, Objective, Offload, Strategy
from tuneplan.core.memory import MemoryAssumptions
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.caveats import card_problem
from tuneplan.core.planner.costing import (
    UnitCost,
    node_link,
    plan_warnings,
    price_plan,
    storage_note,
    unit_cost,
)
from tuneplan.core.planner.search import (
    DEFAULT_MEMORY_MARGIN,
    Candidate,
    Node,
    Refused,
    SearchOutcome,
    StrategySearch,
)
from tuneplan.units import HOUR_S, GiB

INFINITY = Decimal("Infinity")
TRADE_OFFS = {
    Method.FULL: "full fine-tuning: every weight learns; the most capacity to change the model, "
                 "and the most memory and compute",
    Method.LORA: "LoRA: low-rank adapters on frozen bf16 weights; usually within a point or two "
                 "of full fine-tuning on instruction/domain tasks, a fraction of the memory",
    Method.QLORA: "QLoRA: LoRA on a 4-bit base; close to LoRA's quality (small quantization "
                  "loss), least memory, slower steps (dequantization)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanAssumptions:
    """Constants of the planner, printed with its result; each says why."""

    memory_margin: float = DEFAULT_MEMORY_MARGIN  # see plan_search.DEFAULT_MEMORY_MARGIN
    # Micro-batches are powers of two up to this many tokens (and at least 1): beyond ~32k
    # tokens per micro-batch a GPU's matmuls are saturated and host overhead is amortised.
    max_micro_batch_tokens: int = 32_768
    stale_after_s: float = 7 * 86_400    # a price older than a week is flagged
    ranking_spot_runs: int = 1           # analytic spot expectation while ranking
    detail_spot_runs: int = 1_000        # Monte Carlo runs for the P50/P90 of shown plans
    detailed_plans: int = 10             # plans that get the Monte Carlo
    max_nodes: int = 16                  # multi-node search stops here
    # A dearer plan is worth recommending for speed only if it saves this much wall time:
    # shorter gains are within start-up noise (provisioning + image pull is ~5 min).
    min_pareto_saving_s: float = 900.0
    memory: MemoryAssumptions = field(default_factory=MemoryAssumptions)
    throughput: ThroughputAssumptions = field(default_factory=ThroughputAssumptions)
    cost: CostAssumptions = field(default_factory=CostAssumptions)

    def describe(self) -> dict[str, object]:
        return {"memory_margin": self.memory_margin,
                "max_micro_batch_tokens": self.max_micro_batch_tokens,
                "stale_after_s": self.stale_after_s, "detail_spot_runs": self.detail_spot_runs,
                "detailed_plans": self.detailed_plans, "max_nodes": self.max_nodes,
                "min_pareto_saving_s": self.min_pareto_saving_s}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One way to run the job: an offer (x nodes), a fitted strategy, time and money.

    ``cost_usd``/``spot_usd`` are the on-demand total and spot's expected total (None when the
    offer has no such price or the job forbids spot); ``on_demand``/``spot`` hold the full
    cost breakdowns (with spot P50/P90) for the plans shown first.
    """

    id: str
    offer: Offer
    gpu: GpuSpec
    candidate: Candidate
    link: str
    capacity_bytes: int
    hours: float
    cost_usd: Decimal | None
    spot_usd: Decimal | None
    spot_hours: float | None
    spot_may_win: bool
    storage: str
    best_cost: Decimal = INFINITY     # what ranking uses: ``ranking_cost``
    on_demand: CostEstimate | None = None
    spot: CostEstimate | None = None
    why: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def strategy(self) -> Strategy:
        return self.candidate.strategy

    @property
    def uses_spot(self) -> bool:
        """Spot is allowed to win (``--spot``) and its expected cost is lower."""
        if not self.spot_may_win or self.spot_usd is None:
            return False
        return self.cost_usd is None or self.spot_usd < self.cost_usd

    @property
    def best_hours(self) -> float:
        return self.spot_hours if self.uses_spot and self.spot_hours else self.hours


def ranking_cost(cost: Decimal | None, spot: Decimal | None, spot_may_win: bool) -> Decimal:
    """Spot's expected cost when it may win and is lower, else on-demand (inf if none)."""
    if spot_may_win and spot is not None and (cost is None or spot < cost):
        return spot
    return cost if cost is not None else INFINITY


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    offer: Offer
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """Ranked plans (best first), the Pareto front's ids, and rejected offers."""

    job: Job
    model: str
    plans: tuple[Plan, ...]
    pareto_ids: tuple[str, ...]
    rejected: tuple[Rejection, ...]
    considered: int
    assumptions: PlanAssumptions
    memory_estimates: int = 0


def plan_id(offer: Offer, strategy: Strategy) -> str:
    """Stable id: hash of the offer's id and the strategy's settings."""
    text = offer.id + _strategy_text(strategy)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@lru_cache(maxsize=4096)
def _strategy_text(strategy: Strategy) -> str:
    return json.dumps(strategy.as_dict(), sort_keys=True, default=str)


def plan_offers(model: ModelSpec, job: Job, offers: Sequence[Offer],
                gpus: Mapping[str, GpuSpec], providers: Mapping[str, Provider], *,
                now: datetime, inter_node_bytes_per_s: Mapping[str, float] | None = None,
                assumptions: PlanAssumptions | None = None) -> PlanResult:
    """Every offer passing ``job``'s constraints, with its best strategy, ranked.

    Offers sharing a GPU type, count, capacity and link share one strategy search (and the
    memory estimates inside it). Raises nothing for infeasible offers: they are rejected.

    The catalog's size costs only a few look-ups and two Decimal products per offer:
    everything the strategy search and the cost model depend on (provider, GPU, count,
    memory, interconnect, host RAM) is worked out once per ``_Shape``, and only the winner
    of each de-duplication key becomes a ``Plan`` (id, warnings). The result is the one of
    building a Plan for every offer and then de-duplicating (tests/core check it against
    such a reference).
    """
    a = assumptions or PlanAssumptions()
    # The plan carries the resolved model id (an alias becomes its hub id), as launch needs.
    job = replace(job, model=model.name) if job.model != model.name else job
    search = strategy_search(model, job, a)
    rejected: list[Rejection] = []
    late: list[Rejection] = []      # over the deadline or budget: listed after the others
    considered = 0
    prices: dict[tuple[object, ...], UnitCost] = {}
    shapes: dict[tuple[object, ...], _Shape | Refused] = {}
    best: dict[tuple[object, ...], _Priced] = {}
    rates = inter_node_bytes_per_s or {}
    spot_wins = job.spot is True
    filtered = bool(job.providers or job.regions or job.gpu or job.max_gpus is not None)
    for offer in offers:
        if filtered and not _wanted(job, offer):
            continue
        if offer.price_per_hour is None and not spot_wins:
            continue
        considered += 1
        if offer.attachable:
            rejected.append(Rejection(offer=offer, reason=(
                "GPU priced without its host VM (GCP attachable GPU): not a rentable machine "
                "on its own; add the host's price with `tuneplan catalog import`")))
            continue
        key = (offer.provider, offer.gpu, offer.gpu_count, offer.gpu_memory_bytes,
               offer.interconnect, offer.ram_bytes)
        shape = shapes.get(key)
        if shape is None:
            shape = _offer_shape(search, job, offer, gpus, providers, rates.get(offer.provider),
                                 a, prices)
            shapes[key] = shape
        if isinstance(shape, Refused):
            rejected.append(Rejection(offer=offer, reason=shape.reason))
            continue
        price, spot_price = offer.price_per_hour, offer.spot_price_per_hour
        for option in shape.options:
            # ``costing.scaled_costs``, with the unit cost's Decimals made once per shape.
            cost = spot = None
            if price is not None:
                cost = cents(price * option.nodes * option.billed + option.extras)
            if spot_price is not None and option.spot_hours is not None:
                spot = cents(spot_price * option.nodes * option.spot_hours + option.extras)
            ranked_cost = ranking_cost(cost, spot, spot_wins)
            if job.deadline_s is not None and option.hours * HOUR_S > job.deadline_s:
                late.append(Rejection(offer=offer, reason=(
                    f"takes {option.hours:.1f} h, deadline {job.deadline_s / HOUR_S:.1f} h")))
                continue
            if job.budget_usd is not None and ranked_cost > job.budget_usd:
                late.append(Rejection(offer=offer, reason=(
                    f"costs ${ranked_cost:,.2f}, budget ${job.budget_usd:,.2f}")))
                continue
            # One plan per provider, instance shape and method: the cheapest region wins.
            dedupe = (offer.provider, offer.instance_type, offer.gpu, offer.gpu_count,
                      option.nodes, option.method)
            held = best.get(dedupe)
            if held is None or (ranked_cost, option.hours) < (held.best_cost, held.option.hours):
                best[dedupe] = _Priced(offer, shape, option, cost, spot, ranked_cost)
    rejected += late
    plans = [_build_plan(p, job, now, a) for p in best.values()]
    ranked, front = rank_plans(plans, job.objective, a.min_pareto_saving_s)
    ranked = _explain(ranked, front, job, a, providers, search)
    return PlanResult(job=job, model=model.name, plans=tuple(ranked), pareto_ids=front,
                      rejected=tuple(rejected), considered=considered, assumptions=a,
                      memory_estimates=search.memory_calls)


def strategy_search(model: ModelSpec, job: Job, a: PlanAssumptions) -> StrategySearch:
    """The planner's search for ``job`` (training length, packing, micro-batch cap, margin
    and assumptions): what ``plan_offers`` searches with and ``tuneplan cost`` re-prices with."""
    return StrategySearch(
        model=model, base=job.strategy, tokens=job.tokens_per_epoch, epochs=job.epochs,
        avg_tokens=None if job.strategy.packing else job.avg_tokens,
        margin=a.memory_margin, max_micro_batch_log2=max(
            0, (a.max_micro_batch_tokens // job.strategy.seq_len).bit_length() - 1),
        memory_assumptions=a.memory, throughput_assumptions=a.throughput)


def offer_node(offer: Offer, gpu: GpuSpec, *, nodes: int = 1,
               inter_node_bytes_per_s: float | None = None) -> Node:
    """The Node ``offer`` x ``nodes`` gives a strategy: its GPUs, the usable memory per card
    (``card_capacity_bytes``: the spec's CUDA-visible total, not the nominal size, unless the
    offer lists clearly less), the link inside a node
    (``node_link``) and, across nodes, the provider's fabric rate."""
    link = node_link(offer, gpu)
    capacity = card_capacity_bytes(gpu, offer.gpu_memory_bytes)
    return Node(gpu=gpu, gpus_per_node=offer.gpu_count, capacity_bytes=capacity,
                intra_link="pcie" if link == "pcie" else "auto", nodes=nodes,
                inter_node_bytes_per_s=inter_node_bytes_per_s if nodes > 1 else None)



@dataclass(frozen=True, slots=True)
class _Option:
    """One fitted candidate of a shape, with its unit cost as the Decimals pricing needs."""

    candidate: Candidate
    unit: UnitCost
    nodes: int
    method: Method
    hours: float
    billed: Decimal                  # Decimal(str(unit.billed_hours))
    spot_hours: Decimal | None       # Decimal(str(unit.spot_expected_hours))
    extras: Decimal


@dataclass(frozen=True, slots=True)
class _Shape:
    """What every offer with the same provider, GPU, count, memory, link and host RAM shares."""

    gpu: GpuSpec
    link: str
    capacity: int
    provider: Provider | None
    options: tuple[_Option, ...]


@dataclass(slots=True)
class _Priced:
    """The best offer so far of one de-duplication key, priced."""

    offer: Offer
    shape: _Shape
    option: _Option
    cost: Decimal | None
    spot: Decimal | None
    best_cost: Decimal


def _offer_shape(search: StrategySearch, job: Job, offer: Offer, gpus: Mapping[str, GpuSpec],
                 providers: Mapping[str, Provider], inter: float | None, a: PlanAssumptions,
                 prices: dict[tuple[object, ...], UnitCost]) -> _Shape | Refused:
    """The fitted candidates (with unit costs) of ``offer``'s shape, or why it has none."""
    gpu = gpus.get(offer.gpu)
    if gpu is None:
        return Refused(f"no GPU specification for {offer.gpu}")
    link = node_link(offer, gpu)
    problem = _hardware_problem(job, gpu, link)
    if problem:
        return Refused(problem)
    node = offer_node(offer, gpu)
    capacity = node.capacity_bytes
    provider = providers.get(offer.provider)
    outcome = search.search(node)
    short = _host_ram_short(outcome.best.values(), offer)
    if len(short) == len(outcome.best) and job.multi_node and _multi_node_ok(provider):
        bigger = _more_nodes(search, job, node, inter, a, offer)
        if bigger is not None:
            outcome, short = bigger, {}
    if not outcome.best:
        return Refused(_why_not(outcome.smallest_need_bytes, outcome.refusals, capacity, a))
    # A candidate the card cannot run (bitsandbytes without a kernel for it) is skipped too.
    short |= {id(c): why for c in outcome.best.values() if (why := card_problem(c.strategy, gpu))}
    options: list[_Option] = []
    for candidate in outcome.best.values():
        if id(candidate) in short:
            continue
        # Money scales with the price: one cost-model run per candidate and provider.
        key = (id(candidate), offer.provider)
        if key not in prices:
            prices[key] = unit_cost(candidate, provider, job, a.cost)
        unit = prices[key]
        options.append(_Option(
            candidate=candidate, unit=unit, nodes=candidate.strategy.nodes,
            method=candidate.strategy.method, hours=unit.wall_hours,
            billed=Decimal(str(unit.billed_hours)),
            spot_hours=None if unit.spot_expected_hours is None
            else Decimal(str(unit.spot_expected_hours)), extras=unit.extras_usd))
    if not options:
        return Refused(next(iter(short.values())))
    return _Shape(gpu=gpu, link=link, capacity=capacity, provider=provider,
                  options=tuple(options))


def _build_plan(p: _Priced, job: Job, now: datetime, a: PlanAssumptions) -> Plan:
    option, shape, offer = p.option, p.shape, p.offer
    candidate = option.candidate
    return Plan(id=plan_id(offer, candidate.strategy), offer=offer, gpu=shape.gpu,
                candidate=candidate, link=shape.link, capacity_bytes=shape.capacity,
                hours=option.hours, cost_usd=p.cost, spot_usd=p.spot,
                spot_hours=option.unit.spot_expected_hours, spot_may_win=job.spot is True,
                best_cost=p.best_cost, storage=storage_note(shape.provider),
                warnings=tuple(plan_warnings(candidate, offer, shape.gpu, shape.provider,
                                             shape.link, now=now,
                                             stale_after_s=a.stale_after_s)))


def _wanted(job: Job, offer: Offer) -> bool:
    """The job's hard filters on an offer (not memory, time or money)."""
    if job.providers and not any(provider_matches(p, offer.provider) for p in job.providers):
        return False
    if job.regions and not any(offer.region.lower().startswith(r.lower()) for r in job.regions):
        return False
    if job.gpu and not gpu_matches(job.gpu, offer.gpu):
        return False
    if job.max_gpus is not None and offer.gpu_count > job.max_gpus:
        return False
    return job.spot is True or offer.price_per_hour is not None


_LINK_RANK = {"single": 3, "pcie": 1, "nvlink": 2, "nvswitch": 3}


def _hardware_problem(job: Job, gpu: GpuSpec, link: str) -> str | None:
    """A reason the hardware cannot serve the job at all, before any memory estimate."""
    if _LINK_RANK[link] < job.min_interconnect.rank and job.min_interconnect is not (
            Interconnect.ANY):
        return f"{link} between GPUs, the job asks for at least {job.min_interconnect.value}"
    return card_problem(job.strategy, gpu)


def _host_ram_short(candidates: Iterable[Candidate], offer: Offer) -> dict[int, str]:
    """id -> reason for offloading candidates that need more host RAM than the instance has
    (when its RAM is known)."""
    ram = offer.ram_bytes
    if ram is None:
        return {}
    return {id(c): f"offload needs {c.host_ram_bytes / GiB:,.0f} GiB host RAM, "
                   f"the instance has {ram / GiB:,.0f} GiB"
            for c in candidates
            if c.strategy.offload is not Offload.NONE and c.host_ram_bytes > ram}


def _multi_node_ok(provider: Provider | None) -> bool:
    text = (provider.multinode_interconnect or "") if provider else ""
    return bool(text) and not text.lower().startswith(("no", "none", "unknown"))


def _more_nodes(search: StrategySearch, job: Job, node: Node, inter: float | None,
                a: PlanAssumptions, offer: Offer) -> SearchOutcome | None:
    """The fewest nodes (2, 4, 8 ...) on which something fits (within the instance's RAM
    when offloading), up to --max-gpus; None when no count works."""
    nodes = 2
    limit = job.max_gpus or a.max_nodes * node.gpus_per_node
    while nodes <= a.max_nodes and nodes * node.gpus_per_node <= limit:
        outcome = search.search(replace(node, nodes=nodes, inter_node_bytes_per_s=inter))
        short = _host_ram_short(outcome.best.values(), offer)
        if outcome.best and len(short) < len(outcome.best):
            return SearchOutcome(best={m: c for m, c in outcome.best.items()
                                       if id(c) not in short})
        nodes *= 2
    return None


def _why_not(need: int | None, refusals: list[str], capacity: int, a: PlanAssumptions) -> str:
    if need is not None:
        return (f"needs {need / GiB:.1f} GiB per GPU at micro-batch 1, card has "
                f"{capacity / GiB:.1f} GiB usable, a plan may fill {a.memory_margin:.0%}")
    return refusals[0] if refusals else "no strategy fits"


def pareto_front(plans: Sequence[Plan], min_saving_s: float = 0.0) -> list[Plan]:
    """Plans no other plan beats on both cost and hours, cheapest first; a dearer plan joins
    only when it saves at least ``min_saving_s`` of wall time over the previous member."""
    front: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.best_cost, p.hours)):
        if not front or p.hours < front[-1].hours - min_saving_s / HOUR_S:
            front.append(p)
    return front


def rank_plans(plans: list[Plan], objective: Objective,
               min_saving_s: float = 0.0) -> tuple[list[Plan], tuple[str, ...]]:
    """Plans ordered by the objective, and the Pareto front's ids (cost vs hours)."""
    front = pareto_front(plans, min_saving_s)
    ids = tuple(p.id for p in front)
    if objective is Objective.TIME:
        return sorted(plans, key=lambda p: (p.hours, p.best_cost, p.id)), ids
    by_cost = sorted(plans, key=lambda p: (p.best_cost, p.hours, p.id))
    if objective is Objective.PARETO:
        on = set(ids)
        return front + [p for p in by_cost if p.id not in on], ids
    return by_cost, ids


def _explain(ranked: list[Plan], front: tuple[str, ...], job: Job, a: PlanAssumptions,
             providers: Mapping[str, Provider], search: StrategySearch) -> list[Plan]:
    """Add why-lines to every plan; the first ones get their exact memory estimate and the
    full cost breakdown with the spot Monte Carlo."""
    out: list[Plan] = []
    for rank, p in enumerate(ranked, start=1):
        provider = providers.get(p.offer.provider)
        if rank <= a.detailed_plans:
            on_demand, spot = price_plan(p.candidate, p.offer, provider, job, a.cost,
                                         runs=a.detail_spot_runs)
            p = replace(p, on_demand=on_demand, spot=spot,
                        candidate=search.exact(p.candidate, p.gpu))
        if p.uses_spot and (provider is None or not provider.spot_notice_s):
            p = replace(p, warnings=(*p.warnings, "spot without a notice period: an "
                                     "interruption loses the work since the last checkpoint"))
        out.append(replace(p, why=tuple(_why(p, rank, len(ranked), p.id in front, job))))
    return out


def _why(p: Plan, rank: int, total: int, on_front: bool, job: Job) -> list[str]:
    s = p.strategy
    word = {Objective.COST: "cheapest", Objective.TIME: "fastest",
            Objective.PARETO: "best cost/time trade-off"}[job.objective]
    lines = [f"#{rank} {word} of {total} feasible plans" + (
        " (on the cost/time Pareto front)" if on_front else "")]
    where = f"{s.gpus}x {p.gpu.name}" + (f" x {s.nodes} nodes" if s.nodes > 1 else "")
    lines.append(
        f"fits {where} at micro-batch {s.batch_size} ({s.sharding.value}, checkpointing "
        f"{s.checkpointing.value}, offload {s.offload.value}): "
        f"{p.candidate.device_total_bytes / GiB:.1f}"
        f" of {p.capacity_bytes / GiB:.1f} GiB usable per GPU "
        f"({p.gpu.memory_bytes / GiB:g} GiB nominal)")
    if job.strategy.method is Method.AUTO and s.method in TRADE_OFFS:
        lines.append(TRADE_OFFS[s.method])
    if p.uses_spot and p.spot_usd is not None:
        lines.append(f"spot expected ${p.spot_usd:,.2f} vs on-demand "
                     + (f"${p.cost_usd:,.2f}" if p.cost_usd is not None else "none offered"))
    return lines
