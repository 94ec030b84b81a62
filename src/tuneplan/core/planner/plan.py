"""Strategies x offers -> ranked plans (cost, time or Pareto), with why, warnings and the
offers rejected with their reason.

Pure: the model, offers, GPU specs, providers and "now" come in as values; ``adapters.plans``
loads them and saves the result. Strategy search is ``core.planner.search``; cost and warnings
``core.planner.costing``; the fit solver for impossible jobs ``core.planner.fit``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from functools import lru_cache

from tuneplan.core.catalog.hardware import GpuSpec, card_capacity_bytes
from tuneplan.core.catalog.offers import Offer, gpu_matches, provider_matches
from tuneplan.core.catalog.providers import Provider, StatedFabric
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.cost.estimate import (
    CostAssumptions,
    CostEstimate,
    billed_total,
)
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import (
    SEARCHED_FIELDS,
    Checkpointing,
    Interconnect,
    Job,
    Loss,
    Objective,
    Offload,
    Precision,
    Strategy,
)
from tuneplan.core.memory import MemoryAssumptions
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.caveats import card_problem, model_defaults
from tuneplan.core.planner.costing import (
    UnitCost,
    node_link,
    plan_warnings,
    price_plan,
    storage_note,
    unit_cost,
)
from tuneplan.core.planner.fit import fit
from tuneplan.core.planner.infeasible import (
    Binding,
    Infeasibility,
    PlanRef,
    Relaxation,
    budget_and_deadline,
    ordered,
)
from tuneplan.core.planner.risk import PAGED_TERM, Risk, assess
from tuneplan.core.planner.search import (
    AUTO_METHODS,
    DEFAULT_MEMORY_MARGIN,
    Candidate,
    Node,
    Refused,
    SearchOutcome,
    StrategySearch,
    memory_limit,
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
    # without --multi-node, more nodes are tried only for an offer of at least this many GPUs
    # that cannot hold the job (a whole 8-GPU board: smaller instances have a bigger one-node
    # shape to go to, not a cluster of small VMs)
    auto_multi_node_gpus: int = 8
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
                "auto_multi_node_gpus": self.auto_multi_node_gpus,
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
    risk: Risk | None = None          # what the plan risks beyond its estimate (``risk.assess``)

    @property
    def strategy(self) -> Strategy:
        return self.candidate.strategy

    @property
    def risk_cost(self) -> Decimal:
        """``best_cost`` with the plan's risks priced in (``Risk.adjusted``): what
        ``--objective risk`` ranks by."""
        return self.best_cost if self.risk is None else self.risk.adjusted(self.best_cost)

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
    """An offer with no plan and why; ``kind`` is ``Refused.kind``, or ``budget``,
    ``deadline``, ``attachable`` (a GPU priced without its host)."""

    offer: Offer
    reason: str
    kind: str = "other"
    #: kind ``memory``: the smallest whole-device peak per GPU any strategy reached on the
    #: offer's node, and what a plan may fill (usable x margin); kind ``host-ram``: the least
    #: host RAM an offloading plan that fits the GPUs needs, and the instance's RAM
    need_bytes: int | None = None
    limit_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class _NoFit(Refused):
    """``Refused`` for memory, with the figures: the smallest peak seen and the limit."""

    need_bytes: int = 0
    limit_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RelaxedPlan:
    """A plan a relaxation gives, whole, with the job it meets: the person's job with that
    one change (the budget raised, the deadline moved, a flag freed)."""

    plan: Plan
    job: Job
    change: str               # the relaxation's words (``Relaxation.change``)


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
    infeasible: Infeasibility | None = None   # set when ``plans`` is empty: why, and changes
    notes: tuple[str, ...] = ()               # settings the model chose (caveats.model_defaults)
    # the whole plans the relaxations quote (``infeasible.relaxations[].plan``), each with the
    # job it meets, so a face can save them like ordinary plans (``cost``/``launch`` by id)
    relaxed: tuple[RelaxedPlan, ...] = ()

    @property
    def feasible(self) -> bool:
        return bool(self.plans)

    def best_of_other_node_counts(self, shown: int) -> list[tuple[int, Plan]]:
        """(rank, plan) of the best plan of each node count none of the first ``shown``
        plans has (each gets its per-GPU breakdown, see ``_explain``)."""
        seen = {p.strategy.nodes for p in self.plans[:shown]}
        out: list[tuple[int, Plan]] = []
        for rank, p in enumerate(self.plans, start=1):
            if p.strategy.nodes not in seen:
                seen.add(p.strategy.nodes)
                out.append((rank, p))
        return out


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

    Across nodes an offer runs on the fabric its provider states for its instance type
    (``Provider.fabric_for``), else on the assumed default, labelled so;
    ``inter_node_bytes_per_s`` (bytes/s per node, by provider) replaces what is stated.

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
    job, notes = model_defaults(model, job)
    context = _Context(model=model, offers=offers, gpus=gpus, providers=providers, now=now,
                       rates=inter_node_bytes_per_s or {}, a=a)
    search = strategy_search(model, job, a)
    result, overruns = _plan(context, job, search)
    result = replace(result, notes=notes)
    if result.plans:
        return result
    why, relaxed = _diagnose(context, job, search, result, overruns)
    return replace(result, infeasible=why, relaxed=relaxed)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Context:
    """What every planning pass of one request shares (the job may change between passes)."""

    model: ModelSpec
    offers: Sequence[Offer]
    gpus: Mapping[str, GpuSpec]
    providers: Mapping[str, Provider]
    now: datetime
    rates: Mapping[str, float]
    a: PlanAssumptions


def _plan(context: _Context, job: Job, search: StrategySearch
          ) -> tuple[PlanResult, list[_Priced]]:
    """One planning pass: the ranked result, and the priced options that fit but miss the
    budget or the deadline (what ``_diagnose`` relaxes)."""
    model, offers, gpus, providers = context.model, context.offers, context.gpus, \
        context.providers
    now, a = context.now, context.a
    overruns: list[_Priced] = []
    rejected: list[Rejection] = []
    late: list[Rejection] = []      # over the deadline or budget: listed after the others
    considered = 0
    prices: dict[tuple[object, ...], UnitCost] = {}
    shapes: dict[tuple[object, ...], _Shape | Refused] = {}
    best: dict[tuple[object, ...], _Priced] = {}
    rates = context.rates
    spot_wins = job.spot is True
    filtered = bool(job.providers or job.regions or job.gpu or job.max_gpus is not None
                    or job.is_fixed("gpus") or job.is_fixed("nodes"))
    for offer in offers:
        if filtered and not _wanted(job, offer):
            continue
        if offer.price_per_hour is None and not spot_wins:
            continue
        considered += 1
        if offer.attachable:
            rejected.append(Rejection(offer=offer, kind="attachable", reason=(
                "GPU priced without its host VM (GCP attachable GPU): not a rentable machine "
                "on its own; add the host's price with `tuneplan catalog import`")))
            continue
        inter = offer_fabric(offer, providers.get(offer.provider), rates)
        key = (offer.provider, offer.gpu, offer.gpu_count, offer.gpu_memory_bytes,
               offer.interconnect, offer.ram_bytes, offer.vcpus, inter)
        shape = shapes.get(key)
        if shape is None:
            shape = _offer_shape(search, job, offer, gpus, providers, inter, a, prices)
            shapes[key] = shape
        if isinstance(shape, Refused):
            rejected.append(Rejection(
                offer=offer, reason=shape.reason, kind=shape.kind,
                need_bytes=shape.need_bytes if isinstance(shape, _NoFit) else None,
                limit_bytes=shape.limit_bytes if isinstance(shape, _NoFit) else None))
            continue
        price, spot_price = offer.price_per_hour, offer.spot_price_per_hour
        for option in shape.options:
            # ``costing.scaled_costs``, with the unit cost's Decimals made once per shape.
            cost = spot = None
            if price is not None:
                cost = billed_total(price * option.nodes, option.billed_s, option.extras)
            if spot_price is not None and option.spot_billed_s is not None:
                spot = billed_total(spot_price * option.nodes, option.spot_billed_s,
                                    option.extras)
            # Spot may win only where its expected run (interruptions included) meets the
            # deadline; elsewhere the plan runs on-demand, so the hours checked against the
            # deadline are always those of the way the plan runs.
            spot_h = option.unit.spot_expected_hours
            spot_late = job.deadline_s is not None and spot_h is not None and (
                spot_h * HOUR_S > job.deadline_s)
            may_spot = spot_wins and not spot_late
            ranked_cost = ranking_cost(cost, spot, may_spot)
            priced = _Priced(offer, shape, option, cost, spot, ranked_cost, may_spot)
            if job.deadline_s is not None and (priced.hours * HOUR_S > job.deadline_s
                                               or (cost is None and spot_late)):
                hours = spot_h if cost is None and spot_h is not None else priced.hours
                late.append(Rejection(offer=offer, kind="deadline", reason=(
                    f"takes {hours:.1f} h{' on spot' if cost is None else ''}, deadline "
                    f"{job.deadline_s / HOUR_S:.1f} h")))
                overruns.append(priced)
                continue
            if ranked_cost == INFINITY:
                rejected.append(Rejection(offer=offer, kind="hardware", reason=(
                    "no on-demand price, and on spot the job would almost never finish "
                    "between interruptions")))
                continue
            if job.budget_usd is not None and ranked_cost > job.budget_usd:
                late.append(Rejection(offer=offer, kind="budget", reason=(
                    f"costs ${ranked_cost:,.2f}, budget ${job.budget_usd:,.2f}")))
                overruns.append(priced)
                continue
            # One plan per provider, instance shape and method: the cheapest region wins.
            dedupe = (offer.provider, offer.instance_type, offer.gpu, offer.gpu_count,
                      option.nodes, option.method)
            held = best.get(dedupe)
            if held is None or (ranked_cost, priced.hours) < (held.best_cost, held.hours):
                best[dedupe] = priced
    rejected += late
    plans = [_build_plan(p, job, now, a) for p in best.values()]
    ranked, front = rank_plans(plans, job.objective, a.min_pareto_saving_s)
    ranked = _explain(ranked, front, job, a, providers, search)
    return PlanResult(job=job, model=model.name, plans=tuple(ranked), pareto_ids=front,
                      rejected=tuple(rejected), considered=considered, assumptions=a,
                      memory_estimates=search.memory_calls), overruns


def packs(job: Job) -> bool:
    """Whether the planner packs ``job``'s sequences: as given (``--packing`` /
    ``--no-packing``), else when its samples (``--avg-tokens``) are shorter than
    ``--seq-len``. Packing joins samples into full sequences: the same memory (an unpacked
    batch is padded to its longest sample, which reaches ``--seq-len``) and no compute spent
    on padding, so it is never slower; the launch bundle packs as the plan says (TRL's
    ``packing``)."""
    s = job.strategy
    if job.is_fixed("packing"):
        return s.packing
    return s.packing or (job.avg_tokens is not None and job.avg_tokens < s.seq_len)


def strategy_search(model: ModelSpec, job: Job, a: PlanAssumptions) -> StrategySearch:
    """The planner's search for ``job`` (training length, packing, micro-batch cap, margin
    and assumptions): what ``plan_offers`` searches with and ``tuneplan cost`` re-prices with."""
    # avg_tokens stays: the speed model reads it only for an unpacked strategy (a given one
    # priced by ``tuneplan cost`` pads its batches as the job says)
    return StrategySearch(
        model=model, base=replace(job.strategy, packing=packs(job)),
        tokens=job.tokens_per_epoch, epochs=job.epochs, avg_tokens=job.avg_tokens,
        margin=a.memory_margin, max_micro_batch_log2=max(
            0, (a.max_micro_batch_tokens // job.strategy.seq_len).bit_length() - 1),
        memory_assumptions=a.memory, throughput_assumptions=a.throughput,
        fixed=frozenset(job.fixed), headroom=job.objective is Objective.RISK)


def offer_fabric(offer: Offer, provider: Provider | None,
                 rates: Mapping[str, float] | None = None) -> StatedFabric | None:
    """The network between nodes of ``offer``: a rate given for its provider (``rates``),
    else the fabric the provider states for its instance type, else None (the assumed
    default, ``ThroughputAssumptions.inter_node_bytes_per_s``)."""
    rate = (rates or {}).get(offer.provider)
    if rate:
        return StatedFabric(provider=offer.provider, scope="*", bytes_per_s=rate,
                            kind="network (rate given to the planner)")
    return provider.fabric_for(offer.instance_type) if provider else None


def with_nodes(node: Node, nodes: int, fabric: StatedFabric | None) -> Node:
    """``node`` x ``nodes``, linked by ``fabric`` (None: the assumed default)."""
    many = nodes > 1 and fabric is not None
    return replace(node, nodes=nodes,
                   inter_node_bytes_per_s=fabric.bytes_per_s if many and fabric else None,
                   inter_node_fabric=fabric.describe() if many and fabric else None)


def offer_node(offer: Offer, gpu: GpuSpec, *, nodes: int = 1,
               fabric: StatedFabric | None = None) -> Node:
    """The Node ``offer`` x ``nodes`` gives a strategy: its GPUs, the usable memory per card
    (``card_capacity_bytes``: the spec's CUDA-visible total, not the nominal size, unless the
    offer lists clearly less), the link inside a node
    (``node_link``) and, across nodes, the provider's fabric rate."""
    link = node_link(offer, gpu)
    capacity = card_capacity_bytes(gpu, offer.gpu_memory_bytes)
    return with_nodes(
        Node(gpu=gpu, gpus_per_node=offer.gpu_count, capacity_bytes=capacity,
             intra_link="pcie" if link == "pcie" else "auto",
             host_vcpus=int(offer.vcpus) if offer.vcpus and offer.vcpus >= 1 else None),
        nodes, fabric)



@dataclass(frozen=True, slots=True)
class _Option:
    """One fitted candidate of a shape, with its unit cost as the Decimals pricing needs."""

    candidate: Candidate
    unit: UnitCost
    nodes: int
    method: Method
    hours: float
    billed_s: Decimal                # Decimal(unit.billed_seconds)
    spot_billed_s: Decimal | None    # Decimal(str(unit.spot_billed_seconds))
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
    may_spot: bool                   # spot may win this plan (``Plan.spot_may_win``)

    @property
    def on_spot(self) -> bool:
        """``Plan.uses_spot``: spot may win and its expected cost is lower."""
        return self.may_spot and self.spot is not None and (
            self.cost is None or self.spot < self.cost)

    @property
    def hours(self) -> float:
        """Wall hours of the way the plan runs (``Plan.best_hours``)."""
        spot_h = self.option.unit.spot_expected_hours
        return spot_h if self.on_spot and spot_h else self.option.hours


def _offer_shape(search: StrategySearch, job: Job, offer: Offer, gpus: Mapping[str, GpuSpec],
                 providers: Mapping[str, Provider], inter: StatedFabric | None,
                 a: PlanAssumptions,
                 prices: dict[tuple[object, ...], UnitCost]) -> _Shape | Refused:
    """The fitted candidates (with unit costs) of ``offer``'s shape, or why it has none."""
    gpu = gpus.get(offer.gpu)
    if gpu is None:
        return Refused(f"no GPU specification for {offer.gpu}", kind="gpu-spec")
    link = node_link(offer, gpu)
    problem = _hardware_problem(job, gpu, link)
    if problem:
        return Refused(problem, kind="hardware")
    node = offer_node(offer, gpu)
    capacity = node.capacity_bytes
    provider = providers.get(offer.provider)
    nodes = job.strategy.nodes if job.is_fixed("nodes") else 1
    if nodes > 1:  # --nodes N given: exactly N nodes, on a provider that links them
        if not _multi_node_ok(provider):
            return Refused(f"--nodes {nodes} is fixed and {offer.provider} states no "
                           "multi-node interconnect", kind="hardware")
        node = with_nodes(node, nodes, inter)
    def _unit(candidate: Candidate) -> UnitCost:
        # Money scales with the price: one cost-model run per candidate and provider (keyed
        # by identity: the search's node cache keeps every candidate alive while it plans).
        key = (id(candidate), offer.provider)
        if key not in prices:
            prices[key] = unit_cost(candidate, provider, job, a.cost)
        return prices[key]

    outcome = search.search(node)
    short = _host_ram_short(outcome.best.values(), offer)
    candidates = list(outcome.best.values())
    # No one-node plan on this offer (nothing fits, or every fit lacks host RAM): by default
    # more nodes are tried for a whole node (``auto_multi_node_gpus``, --gpus not fixed);
    # --multi-node tries them on any linked offer, and beside a starved one-node fit too.
    no_one_node = len(short) == len(outcome.best)
    auto = (job.multi_node is None and no_one_node and offer.gpu_count >= a.auto_multi_node_gpus
            and not job.is_fixed("gpus"))
    if (job.multi_node or auto) and _multi_node_ok(provider) and not job.is_fixed("nodes"):
        if no_one_node:
            bigger = _more_nodes(search, job, node, inter, a, offer)
            if bigger is not None:
                outcome, short = bigger, {}
                candidates = list(bigger.best.values())
        elif (pays := _nodes_may_pay(job, [c for c in candidates if id(c) not in short],
                                     lambda c: _unit(c).wall_hours)):
            # One node fits, but starved of memory or missing the deadline: more nodes may
            # be cheaper or in time, so they are plans beside it (ranked alike).
            want, most = pays
            more = _more_nodes(search, job, node, inter, replace(a, max_nodes=min(
                most, a.max_nodes)), offer, want=want)
            if more is not None:
                candidates += list(more.best.values())
    if not candidates:
        need = outcome.smallest_need_bytes
        batch = job.strategy.batch_size if job.is_fixed("batch_size") else 1
        reason = _why_not(need, outcome.refusals, capacity, a, batch=batch)
        if need is None:
            return Refused(reason, kind="estimate")
        return _NoFit(reason, kind="memory", need_bytes=need,
                      limit_bytes=memory_limit(capacity, a.memory_margin))
    # A candidate the card cannot run (bitsandbytes without a kernel for it) is skipped too.
    short |= {id(c): why for c in candidates if (why := card_problem(c.strategy, gpu))}
    options: list[_Option] = []
    for candidate in candidates:
        if id(candidate) in short:
            continue
        unit = _unit(candidate)
        options.append(_Option(
            candidate=candidate, unit=unit, nodes=candidate.strategy.nodes,
            method=candidate.strategy.method, hours=unit.wall_hours,
            billed_s=Decimal(unit.billed_seconds),
            spot_billed_s=None if unit.spot_billed_seconds is None
            else Decimal(str(unit.spot_billed_seconds)), extras=unit.extras_usd))
    if not options:
        ram = [c.host_ram_bytes for c in candidates if id(c) in short
               and "host RAM" in short[id(c)]]
        if ram and offer.ram_bytes is not None:
            return _NoFit(next(iter(short.values())), kind="host-ram", need_bytes=min(ram),
                          limit_bytes=offer.ram_bytes)
        return Refused(next(iter(short.values())), kind="host-ram")
    return _Shape(gpu=gpu, link=link, capacity=capacity, provider=provider,
                  options=tuple(options))


def plan_risk(p: Plan, provider: Provider | None, a: CostAssumptions) -> Risk:
    """``risk.assess`` for a plan: spot's extra wall time over on-demand when it runs on spot,
    and whether the provider's notice is long enough to write a checkpoint (``a``'s write
    rate, as the cost model has it)."""
    c = p.candidate
    extra = (p.spot_hours / p.hours - 1) if p.uses_spot and p.spot_hours and p.hours else 0.0
    notice = provider.spot_notice_s if provider else None
    saves = False
    if notice:
        saves = notice >= c.memory.checkpoint_bytes / a.checkpoint_write_bytes_per_s
    return assess(c, link=p.link, capacity_bytes=p.capacity_bytes,
                  on_spot=p.uses_spot, spot_extra=extra, spot_notice=saves)


def _build_plan(p: _Priced, job: Job, now: datetime, a: PlanAssumptions) -> Plan:
    option, shape, offer = p.option, p.shape, p.offer
    candidate = option.candidate
    plan = Plan(id=plan_id(offer, candidate.strategy), offer=offer, gpu=shape.gpu,
                candidate=candidate, link=shape.link, capacity_bytes=shape.capacity,
                hours=option.hours, cost_usd=p.cost, spot_usd=p.spot,
                spot_hours=option.unit.spot_expected_hours, spot_may_win=p.may_spot,
                best_cost=p.best_cost, storage=storage_note(shape.provider),
                warnings=tuple(plan_warnings(candidate, offer, shape.gpu, shape.provider,
                                             shape.link, now=now,
                                             stale_after_s=a.stale_after_s)))
    return replace(plan, risk=plan_risk(plan, shape.provider, a.cost))


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
    s = job.strategy
    if job.is_fixed("gpus") and offer.gpu_count != s.gpus:
        return False  # --gpus N given: only N-GPU machines (never a bigger one half used)
    if job.is_fixed("nodes") and job.max_gpus is not None and (
            offer.gpu_count * s.nodes > job.max_gpus):
        return False
    return job.spot is True or offer.price_per_hour is not None


_LINK_RANK = {"single": 3, "pcie": 1, "nvlink": 2, "nvswitch": 3}


def _hardware_problem(job: Job, gpu: GpuSpec, link: str) -> str | None:
    """A reason the hardware cannot serve the job at all, before any memory estimate."""
    if _LINK_RANK[link] < job.min_interconnect.rank and job.min_interconnect is not (
            Interconnect.ANY):
        return f"{link} between GPUs, the job asks for at least {job.min_interconnect.value}"
    if gpu.supports_bf16 is False and job.strategy.precision is Precision.BF16_MIXED and (
            job.is_fixed("precision")):
        return (f"no BF16 on {gpu.name}: --precision bf16-mixed is fixed "
                "(fp16-mixed would run)")
    return card_problem(job.strategy, gpu)


def _host_ram_short(candidates: Iterable[Candidate], offer: Offer) -> dict[int, str]:
    """id -> reason for candidates that keep state in host RAM (offload, or a paged
    optimizer's paged-out state) and need more of it than the instance has (when its RAM is
    known)."""
    ram = offer.ram_bytes
    if ram is None:
        return {}
    return {id(c): f"{'offload' if c.strategy.offload is not Offload.NONE else 'paged optimizer'}"
                   f" needs {c.host_ram_bytes / GiB:,.0f} GiB host RAM, "
                   f"the instance has {ram / GiB:,.0f} GiB"
            for c in candidates
            if (c.strategy.offload is not Offload.NONE or c.paged_out_bytes)
            and c.host_ram_bytes > ram}


def _multi_node_ok(provider: Provider | None) -> bool:
    text = (provider.multinode_interconnect or "") if provider else ""
    return bool(text) and not text.lower().startswith(("no", "none", "unknown"))


def _more_nodes(search: StrategySearch, job: Job, node: Node, inter: StatedFabric | None,
                a: PlanAssumptions, offer: Offer,
                want: Callable[[Candidate], bool] | None = None) -> SearchOutcome | None:
    """The fewest nodes (2, 4, 8 ...) on which something fits (within the instance's RAM
    when offloading) and, given ``want``, passes it, up to --max-gpus; None when no count
    works. Only the candidates that pass are returned."""
    nodes = 2
    limit = job.max_gpus or a.max_nodes * node.gpus_per_node
    while nodes <= a.max_nodes and nodes * node.gpus_per_node <= limit:
        outcome = search.search(with_nodes(node, nodes, inter))
        short = _host_ram_short(outcome.best.values(), offer)
        kept = {m: c for m, c in outcome.best.items()
                if id(c) not in short and (want is None or want(c))}
        if kept:
            return SearchOutcome(best=kept)
        nodes *= 2
    return None


def _nodes_may_pay(job: Job, fitted: Sequence[Candidate],
                   wall_hours: Callable[[Candidate], float]
                   ) -> tuple[Callable[[Candidate], bool], int] | None:
    """What more nodes must do to be worth a plan when one node already fits ``fitted``, and
    the most nodes to try for it: meet the deadline none of them meets (up to
    ``max_nodes``), or, when every one of them is ``memory_starved``, run faster per GPU on
    2 or 4 nodes (the same price per node: cheaper); None when one node is enough."""
    if not fitted:
        return None
    # the deadline binds the wall time a plan is billed for (set-up, loading and checkpoint
    # writes included), not its training time alone
    if job.deadline_s is not None and all(
            wall_hours(c) * HOUR_S > job.deadline_s for c in fitted):
        deadline = job.deadline_s
        return (lambda c: wall_hours(c) * HOUR_S <= deadline), _NO_LIMIT
    if all(memory_starved(c) for c in fitted):
        # the same node price per node, so cheaper exactly when each GPU does more
        # (2 then 4 nodes only: a guess at a cheaper plan, not a requirement; bounded)
        best = max(c.throughput.tokens_per_second_per_gpu for c in fitted)
        return (lambda c: c.throughput.tokens_per_second_per_gpu > best), 4
    return None


_NO_LIMIT = 1 << 30   # node counts up to ``PlanAssumptions.max_nodes``


def memory_starved(c: Candidate) -> bool:
    """One node holds ``c`` only by leaning on host RAM (offload, a paged optimizer's
    paged-out state) or at micro-batch 1 with recompute: a second node's memory may make it
    run faster per GPU, hence cheaper."""
    s = c.strategy
    return (s.offload is not Offload.NONE or c.paged_out_bytes > 0
            or (s.batch_size == 1 and s.checkpointing is not Checkpointing.NONE))


def _why_not(need: int | None, refusals: list[str], capacity: int, a: PlanAssumptions, *,
             batch: int = 1) -> str:
    if need is not None:
        return (f"needs {need / GiB:.1f} GiB per GPU at micro-batch {batch}, card has "
                f"{capacity / GiB:.1f} GiB usable, a plan may fill {a.memory_margin:.0%}")
    return refusals[0] if refusals else "no strategy fits"


def pareto_front(plans: Sequence[Plan], min_saving_s: float = 0.0) -> list[Plan]:
    """Plans no other plan beats on both cost and hours, cheapest first; a dearer plan joins
    only when it saves at least ``min_saving_s`` of wall time over the previous member."""
    front: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.best_cost, p.best_hours)):
        if not front or p.best_hours < front[-1].best_hours - min_saving_s / HOUR_S:
            front.append(p)
    return front


def rank_plans(plans: list[Plan], objective: Objective,
               min_saving_s: float = 0.0) -> tuple[list[Plan], tuple[str, ...]]:
    """Plans ordered by the objective, and the Pareto front's ids (cost vs hours)."""
    front = pareto_front(plans, min_saving_s)
    ids = tuple(p.id for p in front)
    if objective is Objective.TIME:
        return sorted(plans, key=lambda p: (p.best_hours, p.best_cost, p.id)), ids
    if objective is Objective.RISK:
        # Equal risk-priced cost: fewer GPUs first (fewer machines that can fail, no
        # gradient all-reduce), then the faster plan.
        return sorted(plans, key=lambda p: (p.risk_cost, p.strategy.world_size, p.best_hours,
                                            p.id)), ids
    by_cost = sorted(plans, key=lambda p: (p.best_cost, p.best_hours, p.id))
    if objective is Objective.PARETO:
        on = set(ids)
        return front + [p for p in by_cost if p.id not in on], ids
    return by_cost, ids


def _explain(ranked: list[Plan], front: tuple[str, ...], job: Job, a: PlanAssumptions,
             providers: Mapping[str, Provider], search: StrategySearch) -> list[Plan]:
    """Add why-lines to every plan; the first ones get their exact memory estimate and the
    full cost breakdown with the spot Monte Carlo."""
    out: list[Plan] = []
    first_of_nodes = {p.strategy.nodes: p.id for p in reversed(ranked)}
    # the best plan of each node count gets the detail too (its per-GPU breakdown), so a
    # several-node plan ranked below the first ones still shows where its memory goes
    detailed = set(first_of_nodes.values()) if a.detailed_plans else set()
    for rank, p in enumerate(ranked, start=1):
        provider = providers.get(p.offer.provider)
        if rank <= a.detailed_plans or p.id in detailed:
            on_demand, spot = price_plan(p.candidate, p.offer, provider, job, a.cost,
                                         runs=a.detail_spot_runs)
            p = replace(p, on_demand=on_demand, spot=spot,
                        candidate=search.exact(p.candidate, p.gpu))
        if p.uses_spot and (provider is None or not provider.spot_notice_s):
            p = replace(p, warnings=(*p.warnings, "spot without a notice period: an "
                                     "interruption loses the work since the last checkpoint"))
        # each plan against #1; #1 against #2 (what it wins by)
        other = out[0] if out else ranked[1] if len(ranked) > 1 else None
        out.append(replace(p, why=tuple(_why(p, rank, len(ranked), p.id in front, job,
                                             lead=other))))
    return out


RANK_WORDS = {Objective.COST: "cheapest", Objective.TIME: "fastest",
              Objective.PARETO: "best cost/time trade-off",
              Objective.RISK: "lowest cost with its risks priced in"}


def _money(value: Decimal) -> str:
    return f"${value:,.2f}" if value.is_finite() else "no price"


def _rank_reason(p: Plan, lead: Plan | None, objective: Objective, rank: int) -> str | None:
    """How ``p`` compares with ``lead``: the #1 plan, or for #1 itself the #2, in the
    objective's terms."""
    if lead is None:
        return None
    dcost = p.best_cost - lead.best_cost
    dh = p.best_hours - lead.best_hours
    parts = [f"{_money(abs(dcost))} {'more' if dcost >= 0 else 'less'}",
             f"{abs(dh):.1f} h {'slower' if dh >= 0 else 'faster'}"]
    if objective is Objective.RISK and p.risk is not None and lead.risk is not None:
        parts.append(f"risk-priced {_money(p.risk_cost)} vs {_money(lead.risk_cost)}")
    return f"vs #{2 if rank == 1 else 1}: " + ", ".join(parts)


def _risk_lines(p: Plan) -> list[str]:
    """The plan's risks and its time and cost range, in words (every objective)."""
    r = p.risk
    if r is None:
        return []
    low, high = r.hours_range(p.best_hours)
    reasons = list(r.reasons)
    if r.fabric_share and p.best_cost.is_finite():
        # the exposed share of the step is that share of the compute bill
        share = Decimal(str(round(r.fabric_share, 4)))
        reasons.append(f"the exposed all-gathers are about {_money(p.best_cost * share)} of "
                       f"this plan's {_money(p.best_cost)}")
    lines = [f"risks: {'; '.join(reasons)}"] if reasons else [
        f"risks: none beyond the estimate (memory at {r.memory_fill:.0%} of usable)"]
    text = f"range: {low:.1f}-{high:.1f} h"
    if p.best_cost.is_finite():
        lo, hi = (Decimal(str(round(e, 4))) for e in r.time_range)
        text += f", {_money(p.best_cost * (1 + lo))}-{_money(p.best_cost * (1 + hi))}"
    text += (f" (model error {100 * r.time_range[0]:+.0f}..{100 * r.time_range[1]:+.0f} %, "
             f"{r.time_error_source})")
    if p.uses_spot and p.spot is not None and p.spot.spot is not None:
        sp = p.spot.spot
        text += (f"; spot P50-P90 {sp.p50_hours:.1f}-{sp.p90_hours:.1f} h, "
                 f"{_money(sp.p50_cost)}-{_money(sp.p90_cost)} (Monte Carlo of interruptions)")
    lines.append(text)
    return lines


def _chosen_settings(p: Plan, job: Job) -> list[str]:
    """Settings the search changed from the job's own to make the plan fit (each one said)."""
    s, base = p.strategy, job.strategy
    out: list[str] = []
    if s.loss is Loss.CHUNKED and base.loss is not Loss.CHUNKED:
        out.append("chunked loss (--loss chunked: the logits are never materialised whole; "
                   "set it in the trainer, e.g. a fused linear cross-entropy): these settings "
                   "fit only with it")
    if s.optimizer is not base.optimizer:
        paged = (", paged: bitsandbytes keeps it in CUDA managed memory that the driver pages "
                 "to host RAM under pressure instead of running out of memory"
                 if s.optimizer.is_paged else "")
        out.append(f"--optimizer {s.optimizer.value} (8-bit optimizer state{paged}): these "
                   "settings fit only with it")
    spill = p.candidate.paged_out_bytes
    if spill:
        term = p.candidate.throughput.step.get(PAGED_TERM)
        seconds = float(term.value) if term is not None else 0.0
        out.append(f"paged optimizer: {spill / GiB:.1f} GiB per GPU of its state waits in host "
                   f"RAM at the peak, paged back for each update: +{seconds:.1f} s per step "
                   f"of {p.candidate.throughput.step_seconds:.1f} s (the card stays at its "
                   "limit; low confidence in the paging rate)")
    if s.packing and not base.packing and job.avg_tokens is not None:
        out.append(f"sequence packing (--packing): samples of {job.avg_tokens:,} tokens "
                   f"joined into {s.seq_len:,}-token sequences, so no step computes padding "
                   "(same memory; --no-packing keeps them apart)")
    if s.checkpointing is Checkpointing.OFFLOAD and base.checkpointing is not (
            Checkpointing.OFFLOAD):
        out.append("activation checkpoints offloaded to host RAM: these settings fit only "
                   "with them off the GPU")
    return out


def _why(p: Plan, rank: int, total: int, on_front: bool, job: Job,
         lead: Plan | None = None) -> list[str]:
    s = p.strategy
    word = RANK_WORDS[job.objective]
    lines = [f"#{rank} {word} of {total} feasible plans" + (
        " (on the cost/time Pareto front)" if on_front else "")]

    def mark(name: str) -> str:  # a setting the person fixed: kept, not searched
        return " [fixed]" if job.is_fixed(name) else ""

    where = f"{s.gpus}x{mark('gpus')} {p.gpu.name}" + (
        f" x {s.nodes} nodes{mark('nodes')}" if s.nodes > 1 else "")
    lines.append(
        f"fits {where} at micro-batch {s.batch_size}{mark('batch_size')} ({s.sharding.value}"
        f"{mark('sharding')}, checkpointing {s.checkpointing.value}{mark('checkpointing')}, "
        f"offload {s.offload.value}{mark('offload')}): "
        f"{p.candidate.device_total_bytes / GiB:.1f}"
        f" of {p.capacity_bytes / GiB:.1f} GiB usable per GPU "
        f"({p.gpu.memory_bytes / GiB:g} GiB nominal)")
    reason = _rank_reason(p, lead, job.objective, rank)
    if reason:
        lines.append(reason)
    if job.strategy.method is Method.AUTO and s.method in TRADE_OFFS:
        lines.append(TRADE_OFFS[s.method])
    lines += _chosen_settings(p, job) + _risk_lines(p)
    if p.uses_spot and p.spot_usd is not None:
        lines.append(f"spot expected ${p.spot_usd:,.2f} vs on-demand "
                     + (f"${p.cost_usd:,.2f}" if p.cost_usd is not None else "none offered"))
    return lines


def fixed_values(job: Job) -> dict[str, object]:
    """The searched strategy fields the person fixed, with their values (what a plan keeps)."""
    return {name: getattr(job.strategy, name) for name in SEARCHED_FIELDS if job.is_fixed(name)}


def plan_ref(p: Plan) -> PlanRef:
    """The few figures of ``p`` a relaxation quotes."""
    s = p.strategy
    return PlanRef(id=p.id, provider=p.offer.provider, instance_type=p.offer.instance_type,
                   region=p.offer.region, gpu=p.gpu.name, gpus=s.gpus, nodes=s.nodes,
                   method=s.method.value, batch_size=s.batch_size, hours=p.best_hours,
                   cost_usd=p.best_cost)


def _priced_ref(p: _Priced) -> PlanRef:
    s = p.option.candidate.strategy
    return PlanRef(id=plan_id(p.offer, s), provider=p.offer.provider,
                   instance_type=p.offer.instance_type, region=p.offer.region,
                   gpu=p.shape.gpu.name, gpus=s.gpus, nodes=s.nodes, method=s.method.value,
                   batch_size=s.batch_size, hours=p.hours, cost_usd=p.best_cost)


def _value(value: object) -> str:
    return str(getattr(value, "value", value))


def _alternatives(job: Job) -> Iterable[tuple[str, str, str, Job, bool]]:
    """(constraint, binding detail, change, relaxed job, same strategy search) for every
    single relaxation of a flag or filter: the job with only that one thing freed."""
    s = job.strategy
    if s.method is not Method.AUTO:
        given = "given" if job.is_fixed("method") else "the default"
        for method in AUTO_METHODS:
            if method is not s.method and (s.method is Method.FULL or method is Method.QLORA):
                yield ("flag:method", f"--method {s.method.value} ({given})",
                       f"--method {method.value} instead of {s.method.value}",
                       replace(job, strategy=replace(s, method=method)), False)
    for name, flag in SEARCHED_FIELDS.items():
        if job.is_fixed(name):
            shown = f"{flag} {_value(getattr(s, name))}"
            yield (f"flag:{name}", f"{shown} is fixed (the search kept it)",
                   f"leave {flag} to the planner (instead of {_value(getattr(s, name))})",
                   replace(job, fixed=tuple(f for f in job.fixed if f != name)),
                   name in ("gpus", "nodes"))
    if job.spot is not True:
        yield ("flag:spot", "on-demand prices rank the plans" + (
            " (--no-spot)" if job.spot is False else " (no --spot)"),
            "--spot (spot's expected cost, interruptions included, may win)",
            replace(job, spot=True), True)
    if not job.multi_node and not job.is_fixed("nodes"):
        yield ("flag:multi-node", "one node per plan (--no-multi-node)" if job.multi_node is
               False else "several nodes only where one node cannot hold it (no --multi-node)",
               "--multi-node (plans across several nodes)", replace(job, multi_node=True), True)
    filters: list[tuple[str, object, Job]] = [
        ("gpu", job.gpu, replace(job, gpu=None)),
        ("provider", ",".join(job.providers), replace(job, providers=())),
        ("region", ",".join(job.regions), replace(job, regions=())),
        ("max-gpus", job.max_gpus, replace(job, max_gpus=None)),
        ("min-interconnect", None if job.min_interconnect is Interconnect.ANY
         else job.min_interconnect.value, replace(job, min_interconnect=Interconnect.ANY))]
    for name, value, relaxed in filters:
        if value:
            yield (f"filter:{name}", f"--{name} {value} keeps only some offers",
                   f"drop --{name} {value}", relaxed, True)


def _diagnose(context: _Context, job: Job, search: StrategySearch, result: PlanResult,
              overruns: Sequence[_Priced]) -> tuple[Infeasibility, tuple[RelaxedPlan, ...]]:
    """Why ``result`` has no plan: the binding constraints and their cheapest relaxations,
    and the whole plans those relaxations quote (by id, first relaxation first)."""
    binding: list[Binding] = []
    relax: list[Relaxation] = []
    whole: dict[str, tuple[Plan, Job]] = {}
    if result.considered == 0:
        binding.append(Binding(constraint="filters", detail=(
            f"no offer passes the job's filters ({len(context.offers)} offers in the "
            "catalog)")))
    elif overruns:
        found, changes = budget_and_deadline([_priced_ref(p) for p in overruns],
                                             job.budget_usd, job.deadline_s)
        binding += found
        relax += changes
        quoted = {r.plan.id for r in changes if r.plan is not None}
        for p in overruns:
            ref = _priced_ref(p)
            if ref.id in quoted and ref.id not in whole:
                met = _meeting(job, ref)
                whole[ref.id] = (_build_plan(p, met, context.now, context.a), met)
    else:
        binding.append(_rejections_binding(job, result))
        if binding[0].constraint == "memory":
            relax += _memory_changes(context, search, result)
    # One thing freed at a time, every other constraint kept: a full, quick planning pass.
    quick = replace(context, a=replace(context.a, detailed_plans=0))
    for constraint, detail, change, relaxed, same in _alternatives(job):
        sub_search = search if same else strategy_search(context.model, relaxed, quick.a)
        sub, _ = _plan(quick, relaxed, sub_search)
        if sub.plans:
            if not any(b.constraint == constraint for b in binding):
                binding.append(Binding(constraint=constraint, detail=detail))
            relax.append(Relaxation(constraint=constraint, change=change,
                                    plan=plan_ref(sub.plans[0])))
            whole.setdefault(sub.plans[0].id, (sub.plans[0], sub.job))
    why = ordered(binding, relax)
    saved: dict[str, RelaxedPlan] = {}
    for r in why.relaxations:
        if r.plan is not None and r.plan.id in whole and r.plan.id not in saved:
            plan, met = whole[r.plan.id]
            saved[r.plan.id] = RelaxedPlan(
                plan=replace(plan, why=(f"relaxation: {r.change}", *plan.why)), job=met,
                change=r.change)
    return why, tuple(saved.values())


def _meeting(job: Job, ref: PlanRef) -> Job:
    """``job`` with its budget and deadline moved just far enough for the plan ``ref``: the
    job that plan meets (a budget or deadline it already meets is kept)."""
    budget, deadline = job.budget_usd, job.deadline_s
    if budget is not None and ref.cost_usd > budget:
        budget = ref.cost_usd.quantize(Decimal("0.01"), rounding="ROUND_CEILING")
    if deadline is not None and ref.hours * HOUR_S > deadline:
        deadline = float(math.ceil(ref.hours * HOUR_S))
    return replace(job, budget_usd=budget, deadline_s=deadline)


def _rejections_binding(job: Job, result: PlanResult) -> Binding:
    """The constraint behind offers that all fail before pricing: memory (some strategy was
    estimated and nothing fits), else the estimate itself, else the hardware."""
    by_kind: dict[str, list[Rejection]] = {}
    for r in result.rejected:
        by_kind.setdefault(r.kind, []).append(r)
    if "memory" in by_kind:
        big = max(by_kind["memory"], key=lambda r: (r.offer.gpu_count * r.offer.gpu_memory_bytes,
                                                    r.offer.id))
        host = [r for r in by_kind.get("host-ram", ()) if r.need_bytes is not None]
        if host:
            # a larger node holds it on its GPUs only by offloading to host RAM it lacks
            node = max(host, key=lambda r: (r.offer.gpu_count * r.offer.gpu_memory_bytes,
                                            r.offer.id))
            if node.offer.gpu_count * node.offer.gpu_memory_bytes > \
                    big.offer.gpu_count * big.offer.gpu_memory_bytes:
                return Binding(constraint="memory", detail=(
                    f"nothing fits in GPU memory without offloading; the largest node tried "
                    f"({node.offer.gpu_count}x {node.offer.gpu}) holds it only by offloading "
                    f"to host RAM: {node.reason}" + _one_node_short_host(job, node)))
        return Binding(constraint="memory", detail=(
            f"nothing fits in GPU memory; on the largest node tried ({big.offer.gpu_count}x "
            f"{big.offer.gpu}) it {big.reason}" + _one_node_short(job, big)))
    if "estimate" in by_kind:
        reasons = [r.reason for r in by_kind["estimate"]]
        common = max(dict.fromkeys(reasons), key=reasons.count)
        return Binding(constraint="estimate", detail=(
            f"tuneplan cannot estimate {job.model} with --method {job.strategy.method.value}: "
            f"{common}"))
    reasons = [r.reason for r in result.rejected]
    common = max(dict.fromkeys(reasons), key=reasons.count) if reasons else "no offer"
    return Binding(constraint="hardware", detail=f"no offer can run it as asked: {common}")


def _one_node_short(job: Job, r: Rejection) -> str:
    """On a one-node job (--no-multi-node, no --nodes), what one node lacks, plainly."""
    if job.multi_node is not False or job.is_fixed("nodes") or r.need_bytes is None or (
            r.limit_bytes is None or r.need_bytes <= r.limit_bytes):
        return ""
    per_gpu = r.need_bytes - r.limit_bytes
    gpus = r.offer.gpu_count
    return (f"; one node cannot hold it: short by {per_gpu / GiB:.1f} GiB per GPU, "
            f"{gpus * per_gpu / GiB:.1f} GiB over its {gpus} GPUs ({gpus * r.need_bytes / GiB:.1f}"
            f" GiB needed, {gpus * r.limit_bytes / GiB:.1f} GiB may be filled); --multi-node "
            "plans across several nodes")


def _one_node_short_host(job: Job, r: Rejection) -> str:
    """On a one-node job, the host RAM one node lacks for its offloading plan."""
    if job.multi_node is not False or job.is_fixed("nodes") or r.need_bytes is None or (
            r.limit_bytes is None or r.need_bytes <= r.limit_bytes):
        return ""
    return (f"; one node cannot hold it: short by {(r.need_bytes - r.limit_bytes) / GiB:,.0f} "
            f"GiB of host RAM ({r.need_bytes / GiB:,.0f} GiB needed over its "
            f"{r.offer.gpu_count} GPUs' offloaded state, {r.limit_bytes / GiB:,.0f} GiB "
            "installed); --multi-node plans across several nodes")


def _memory_changes(context: _Context, search: StrategySearch, result: PlanResult
                    ) -> list[Relaxation]:
    """The fit solver's single changes that make the job fit the largest card tried (when
    none does, its nearest misses, marked as still too big)."""
    specs = [context.gpus[r.offer.gpu] for r in result.rejected
             if r.kind == "memory" and r.offer.gpu in context.gpus]
    if not specs:
        return []
    gpu = max(specs, key=lambda g: (g.usable_memory_bytes, g.name))
    report = fit(search, gpu, max_gpus=result.job.max_gpus or 64)
    return [Relaxation(constraint="memory", amount=s.peak_bytes, unit="bytes",
                       change=f"{s.change}: peak {s.peak_bytes / GiB:.1f} GiB per GPU on "
                              f"{gpu.name} (limit {report.limit_bytes / GiB:.1f} GiB"
                              + ("" if s.fits else ", still too big") + ")")
            for s in report.suggestions][:4]
