"""``tuneplan cost``'s use case: price one strategy on one offer exactly as the planner does.

Two entry points: ``cost_saved_plan`` re-prices a plan of the last ``tuneplan plan`` result
(its job, strategy and offer, read back typed by ``adapters.plans``), ``cost_on_offer`` prices
the job flags' strategy on a catalog offer. Both rebuild the Candidate with the planner's own
functions (``strategy_search``, ``offer_node``, ``evaluate_strategy``) and price it with
``price_plan`` (the one ``CostInputs`` builder, ``core.planner.costing.cost_inputs``) with the
planner's Monte Carlo runs and seed, so a plan and its re-pricing agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.catalog.offers import Offer
from tuneplan.core.catalog.providers import Provider
from tuneplan.core.cost.estimate import CostEstimate, estimate_cost
from tuneplan.core.job.strategy import Job, Strategy
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.costing import CostOptions, cost_inputs, price_plan
from tuneplan.core.planner.plan import (
    PlanAssumptions,
    offer_fabric,
    offer_node,
    strategy_search,
)
from tuneplan.core.planner.search import Candidate, Refused, evaluate_strategy
from tuneplan.errors import InvalidValueError
from tuneplan.units import GiB

FABRICS = ("auto", "nvlink", "pcie")


@dataclass(frozen=True, slots=True, kw_only=True)
class CostRequest:
    """The cost command's own settings; the defaults are the planner's."""

    spot: bool = False                 # price spot too (a plan whose job allows spot always is)
    options: CostOptions = field(default_factory=CostOptions)
    storage_idle_days: float = 0.0
    fabric: str = "auto"               # inside a node: auto (the offer's link), nvlink, pcie


def cost_saved_plan(plan_id: str, request: CostRequest | None = None) -> dict[str, Any]:
    """The cost document of plan ``plan_id`` from the last ``tuneplan plan`` result, priced
    with the planner's assumptions on the plan's own offer, strategy and job."""
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.adapters.plans import find_saved_plan

    r = request or CostRequest()
    saved = find_saved_plan(plan_id)
    job = saved.job
    if r.spot and job.spot is False:
        job = replace(job, spot=None)
    from tuneplan.adapters.calibration import calibrated_for_job

    # the saved probes the plan was priced with (calibrated_for_job, as plan applies them)
    document = _price(resolve_model(saved.model_id), job, saved.strategy, saved.offer,
                      calibrated_for_job(saved.job), r)
    return {"plan_id": saved.id, **document}


def cost_on_offer(job: Job, offer: Offer, request: CostRequest | None = None
                  ) -> dict[str, Any]:
    """The cost document of ``job`` (from the job flags) on catalog ``offer``; speed
    uses the GPU's saved probe calibration when there is one (``tuneplan probe``). Spot is
    priced only with ``--spot`` (the planner's ``spot=False`` means no spot prices)."""
    from tuneplan.adapters.bundled import load_gpu_specs
    from tuneplan.adapters.calibration import calibration_for
    from tuneplan.adapters.hub import resolve_model

    r = request or CostRequest()
    model = resolve_model(job.model)
    job = replace(job, model=model.name, spot=bool(r.spot))
    gpu = {g.name: g for g in load_gpu_specs()}.get(offer.gpu)
    a = PlanAssumptions(throughput=calibration_for(gpu).throughput)
    return {"plan_id": None, **_price(model, job, job.strategy, offer, a, r)}


def find_offer(offer_id: str) -> Offer:
    """The catalog's offer with this id; InvalidValueError naming where to find ids."""
    from tuneplan.adapters.store import CatalogStore

    with CatalogStore.open() as store:
        offer = store.offer(offer_id)
    if offer is None:
        raise InvalidValueError(f"no offer with id {offer_id!r}: see `tuneplan offers --json`")
    return offer


def _lookup(offer: Offer) -> tuple[GpuSpec, Provider | None]:
    """The offer's GPU spec and provider terms, found as the planner finds them (by name)."""
    from tuneplan.adapters.bundled import load_gpu_specs, load_providers

    gpu = {g.name: g for g in load_gpu_specs()}.get(offer.gpu)
    if gpu is None:
        raise InvalidValueError(f"no GPU specification for {offer.gpu}")
    provider = {p.name: p for p in load_providers()}.get(offer.provider)
    return gpu, provider


def candidate_on_offer(model: ModelSpec, job: Job, strategy: Strategy, offer: Offer,
                       gpu: GpuSpec, provider: Provider | None, a: PlanAssumptions, *,
                       fabric: str = "auto") -> Candidate:
    """``strategy`` on ``offer`` x ``strategy.nodes`` as the planner evaluates it."""
    if fabric not in FABRICS:
        raise InvalidValueError(f"--fabric {fabric!r}: use auto, nvlink or pcie")
    if strategy.gpus > offer.gpu_count:
        raise InvalidValueError(f"--gpus {strategy.gpus}: the offer has only "
                                f"{offer.gpu_count} GPUs per node")
    node = offer_node(offer, gpu, nodes=strategy.nodes, fabric=offer_fabric(offer, provider))
    if fabric != "auto":
        node = replace(node, intra_link=fabric)
    found = evaluate_strategy(strategy_search(model, job, a), node, strategy)
    if isinstance(found, Refused):
        raise InvalidValueError(f"cannot price this strategy: {found.reason}")
    return found


def _price(model: ModelSpec, job: Job, strategy: Strategy, offer: Offer, a: PlanAssumptions,
           r: CostRequest) -> dict[str, Any]:
    gpu, provider = _lookup(offer)
    c = candidate_on_offer(model, job, strategy, offer, gpu, provider, a, fabric=r.fabric)
    if c.throughput.hours is None:
        raise InvalidValueError("cost needs the training length: add --tokens (e.g. 50M)")
    costs = replace(a.cost, storage_idle_days=r.storage_idle_days)
    on_demand, spot = price_plan(c, offer, provider, job, costs, runs=a.detail_spot_runs,
                                 options=r.options)
    if r.spot and spot is None:
        # Spot was asked for and cannot be priced: say why (no price, cannot finish).
        fast = replace(costs, monte_carlo_runs=a.detail_spot_runs)
        spot = estimate_cost(cost_inputs(c, offer, provider, job, fast, spot=True,
                                         options=r.options), fast)
    main = on_demand or spot
    if main is None:
        raise InvalidValueError("this offer has no on-demand price: add --spot")
    document = main.as_dict()
    document["spot"] = None if spot is None or spot.spot is None else spot.spot.as_dict()
    # The planner keeps a strategy only where it fits; a priced one is told whether it does.
    usable = int(offer_node(offer, gpu).capacity_bytes * a.memory_margin)
    fits = c.device_total_bytes <= usable
    document["warnings"] = _warnings(on_demand, spot) + ([] if fits else [
        f"does not fit: needs {c.device_total_bytes / GiB:.1f} GiB per GPU, "
        f"{usable / GiB:.1f} GiB usable on {gpu.name} ({a.memory_margin:.0%})"])
    document["memory"] = {"device_total_bytes": c.device_total_bytes,
                          "usable_bytes": usable, "fits": fits,
                          "host_ram_bytes": c.host_ram_bytes}
    document["nodes"] = strategy.nodes
    document["strategy"] = strategy.as_dict()
    document["offer"] = {"id": offer.id, "provider": offer.provider, "gpu": offer.gpu,
                         "gpu_count": offer.gpu_count, "region": offer.region}
    document["throughput"] = {"tokens_per_second": c.throughput.tokens_per_second,
                              "training_hours": c.throughput.hours,
                              "mfu": c.throughput.mfu, "bound": c.throughput.bound,
                              "time_basis": c.throughput.time_basis.as_dict(
                                  tokens_per_second=c.throughput.tokens_per_second,
                                  hours=c.throughput.hours),
                              "notes": list(c.throughput.notes)}
    return document


def _warnings(*estimates: CostEstimate | None) -> list[str]:
    out: list[str] = []
    for est in estimates:
        for line in est.warnings if est is not None else ():
            if line not in out:
                out.append(line)
    return out


