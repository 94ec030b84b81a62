"""What one plan costs and what to say about it: cost inputs from a fitted strategy and an
offer, the node's link kind, and the plan's warnings.

Pure: prices and provider terms come in as values; the cost model is ``core.cost.estimate``. Does
not
search strategies (``core.planner.search``) nor rank plans (``core.planner.plan``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.catalog.offers import Offer
from tuneplan.core.catalog.providers import Provider
from tuneplan.core.cost.estimate import (
    Billing,
    CostAssumptions,
    CostEstimate,
    CostInputs,
    billed_total,
    estimate_cost,
)
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Job, Loss, Sharding
from tuneplan.core.memory.experts import QLORA_EXPERTS_NOTE
from tuneplan.core.planner.caveats import card_notes
from tuneplan.core.planner.search import Candidate
from tuneplan.errors import TuneplanError
from tuneplan.units import HOUR_S, GiB

#: Canonical GPUs that a source's bare name can reach only through a memory-size guess.
AMBIGUOUS_GPUS = frozenset({"V100 SXM2 16GB", "V100 SXM2 32GB", "V100 PCIe 16GB",
                            "V100 PCIe 32GB", "H100 NVL", "H100 PCIe", "A100 40GB SXM4",
                            "A100 80GB SXM4"})


def node_link(offer: Offer, gpu: GpuSpec) -> str:
    """``single``, ``pcie``, ``nvlink`` (bridged pairs) or ``nvswitch`` (all-to-all NVLink /
    Infinity Fabric on SXM/OAM boards).

    A PCIe card talks over PCIe unless the offer itself says it is bridged: an NVLink bridge
    is an optional part (RTX 3090, A6000, A40, A100/H100 PCIe), and no offer in the bundled
    catalog states one, so a card that *can* take a bridge is not assumed to have it. SXM/OAM
    boards carry their fabric on the baseboard, so the GPU's own link stands unless the offer
    says PCIe."""
    if offer.gpu_count == 1:
        return "single"
    stated = (offer.interconnect or "").lower()
    if not gpu.interconnect_bytes_per_s or "pcie" in stated:
        return "pcie"
    if "pcie" in gpu.form_factor.lower() or "bridge" in (gpu.interconnect or "").lower():
        bridged = "nvlink" in stated or "bridge" in stated
        return "nvlink" if bridged and offer.gpu_count <= 2 else "pcie"
    if not (stated or gpu.interconnect):
        return "pcie"
    return "nvswitch" if offer.gpu_count >= 4 else "nvlink"


@dataclass(frozen=True, slots=True, kw_only=True)
class CostOptions:
    """What a person may set on top of the planner's cost model (``tuneplan cost``'s flags);
    None everywhere is what the planner prices with. Storage idle days live on
    ``CostAssumptions.storage_idle_days``."""

    checkpoint_every_s: float | None = None      # None: Young/Daly from the write time
    interruptions_per_hour: float | None = None  # None: CostAssumptions' default rate
    dataset_bytes: int | None = None             # None: tokens x dataset_bytes_per_token


def cost_inputs(c: Candidate, offer: Offer, provider: Provider | None, job: Job,
                a: CostAssumptions, *, spot: bool,
                options: CostOptions | None = None) -> CostInputs:
    """CostInputs of a fitted candidate on ``offer`` (``nodes`` instances billed alike): the
    one builder, used by the planner and by ``tuneplan cost``."""
    o = options or CostOptions()
    s, mem = c.strategy, c.memory
    with_opt, without = mem.checkpoint_bytes, mem.checkpoint_weights_bytes
    tokens = job.tokens_per_epoch or 0
    nodes = Decimal(s.nodes)
    granularity = provider.billing_granularity_s if provider else None
    minimum = provider.billing_minimum_s if provider else None
    billing = Billing(
        granularity_s=granularity or a.default_billing_granularity_s,
        minimum_s=minimum if minimum is not None else a.default_billing_minimum_s,
        source=(f"{provider.name}: {provider.billing_granularity_raw}; minimum "
                f"{provider.billing_minimum_raw}") if provider else "provider terms unknown")
    notes = [] if granularity else [
        f"billing granularity unknown: per {a.default_billing_granularity_s} s assumed"]
    if spot and provider and provider.spot_interruption_data:
        notes.append(f"{provider.name} interruption data (not a rate): "
                     f"{provider.spot_interruption_data}")
    return CostInputs(
        train_s=(c.throughput.hours or 0.0) * HOUR_S,
        price_per_hour=None if offer.price_per_hour is None else offer.price_per_hour * nodes,
        spot_price_per_hour=(None if offer.spot_price_per_hour is None
                             else offer.spot_price_per_hour * nodes),
        billing=billing, model_bytes=mem.total_params * 2,
        dataset_bytes=(o.dataset_bytes if o.dataset_bytes is not None
                       else round(tokens * a.dataset_bytes_per_token)),
        checkpoint_bytes_with_optimizer=with_opt, checkpoint_bytes_without_optimizer=without,
        artifact_bytes=without,
        storage_usd_per_gb_month=provider.storage_price_usd_per_gb_month if provider else None,
        egress_usd_per_gb=provider.egress_usd_per_gb if provider else None, spot=spot,
        checkpoint_every_s=o.checkpoint_every_s, interruptions_per_hour=o.interruptions_per_hour,
        notice_s=provider.spot_notice_s if provider else None, notes=tuple(notes))


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitCost:
    """Cost of one candidate with one provider at 1 USD/h: money scales with the price, so
    every offer of that provider is priced from it without re-running the cost model."""

    billed_seconds: int                      # on-demand, one session
    wall_hours: float
    extras_usd: Decimal                      # storage + egress in cents (price-independent)
    spot_expected_hours: float | None        # expected wall hours; None: spot not priced or
                                             # cannot finish
    spot_billed_seconds: float | None = None  # expected billed seconds on spot

    @property
    def billed_hours(self) -> float:
        return self.billed_seconds / HOUR_S


def unit_cost(c: Candidate, provider: Provider | None, job: Job,
              a: CostAssumptions) -> UnitCost:
    """The cost model at 1 USD/h on-demand and spot (analytic spot expectation only)."""
    fast = _analytic(a)
    probe = _unit_offer(provider.name if provider else "?")
    est = estimate_cost(cost_inputs(c, probe, provider, job, fast, spot=False), fast)
    spot_hours: float | None = None
    spot_billed: float | None = None
    if job.spot is not False:
        try:
            spot = estimate_cost(cost_inputs(c, probe, provider, job, fast, spot=True), fast)
            if spot.spot:
                spot_hours, spot_billed = spot.spot.expected_hours, spot.spot.expected_billed_s
        except TuneplanError:
            pass
    return UnitCost(billed_seconds=est.billing["billed_seconds"], wall_hours=est.hours,
                    extras_usd=est.storage_cost + est.egress_cost, spot_expected_hours=spot_hours,
                    spot_billed_seconds=spot_billed)


_ONE_DOLLAR = Offer(provider="?", instance_type="unit", gpu="H100 SXM5", gpu_count=1,
                    gpu_memory_bytes=1, vcpus=None, ram_bytes=None, region="?",
                    price_per_hour=Decimal(1), spot_price_per_hour=Decimal(1),
                    fetched_at=datetime(2000, 1, 1, tzinfo=UTC), source="unit price")


@lru_cache(maxsize=256)
def _unit_offer(provider: str) -> Offer:
    """The 1 USD/h offer of ``provider`` (built once: an Offer validates itself)."""
    return replace(_ONE_DOLLAR, provider=provider)


@lru_cache(maxsize=64)
def _analytic(a: CostAssumptions) -> CostAssumptions:
    """``a`` with one Monte Carlo run: the analytic spot expectation used while ranking."""
    return replace(a, monte_carlo_runs=1)


def scaled_costs(unit: UnitCost, offer: Offer, nodes: int) -> tuple[Decimal | None, Decimal | None]:
    """(on-demand USD, spot expected USD) of ``offer`` x ``nodes`` from the unit cost: the
    cost model's own ``billed_total``, so each equals what ``estimate_cost`` gives the offer."""
    on_demand = spot = None
    if offer.price_per_hour is not None:
        on_demand = billed_total(offer.price_per_hour * nodes, Decimal(unit.billed_seconds),
                                 unit.extras_usd)
    if offer.spot_price_per_hour is not None and unit.spot_billed_seconds is not None:
        spot = billed_total(offer.spot_price_per_hour * nodes,
                            Decimal(str(unit.spot_billed_seconds)), unit.extras_usd)
    return on_demand, spot


def price_plan(c: Candidate, offer: Offer, provider: Provider | None, job: Job,
               a: CostAssumptions, *, runs: int, options: CostOptions | None = None,
               ) -> tuple[CostEstimate | None, CostEstimate | None]:
    """Full cost estimates (on-demand, spot) of one plan with ``runs`` Monte Carlo runs; each
    None when the offer has no such price, the job forbids spot, or spot cannot finish."""
    fast = replace(a, monte_carlo_runs=max(1, runs))
    on_demand = None
    if offer.price_per_hour is not None:
        on_demand = estimate_cost(
            cost_inputs(c, offer, provider, job, fast, spot=False, options=options), fast)
    if job.spot is False or offer.spot_price_per_hour is None:
        return on_demand, None
    try:
        spot = estimate_cost(
            cost_inputs(c, offer, provider, job, fast, spot=True, options=options), fast)
    except TuneplanError:
        return on_demand, None
    return on_demand, spot


def plan_warnings(c: Candidate, offer: Offer, gpu: GpuSpec, provider: Provider | None,
                  link: str, *, now: datetime,
                  stale_after_s: float) -> list[str]:
    """Things a person should know before renting this plan (each one line)."""
    s = c.strategy
    out: list[str] = []
    if link == "pcie" and s.sharding in (Sharding.ZERO3, Sharding.FSDP) and s.world_size > 1:
        out.append(f"PCIe-only node: {s.sharding.value} gathers every layer's weights over "
                   "PCIe each pass (slower than on NVLink/NVSwitch)")
    if "consumer" in gpu.form_factor.lower() and s.gpus > 1 and link != "nvswitch":
        out.append(f"consumer card ({gpu.name}) without NVLink: GPUs talk through PCIe "
                   "(and peer-to-peer may be disabled by the driver)")
    if s.loss is Loss.CHUNKED and s.recipe is Recipe.HF:
        # the launch bundle's train.py sets TrainingArguments.use_liger_kernel for it
        out.append("chunked loss: the launch files run Liger's fused linear cross-entropy "
                   "(use_liger_kernel, liger-kernel in requirements.txt; needs Triton on "
                   "CUDA or ROCm), which holds no more than the chunked loss planned")
    out += card_notes(s, gpu)
    out += [n for n in c.memory.notes if n.startswith(QLORA_EXPERTS_NOTE)]
    age_s = (now - offer.fetched_at).total_seconds()
    if age_s > stale_after_s:
        out.append(f"stale price: fetched {age_s / 86_400:.0f} days ago "
                   "(`tuneplan catalog refresh`)")
    if offer.gpu in AMBIGUOUS_GPUS or gpu.confidence == "low":
        out.append(f"GPU variant ambiguity: {gpu.name} is inferred from the source's name and "
                   "memory size; check the instance's exact GPU")
    if offer.ram_bytes is not None and c.host_ram_bytes > offer.ram_bytes:
        out.append(f"host RAM: the job needs {c.host_ram_bytes / GiB:.0f} GiB, the "
                   f"instance has {offer.ram_bytes / GiB:.0f} GiB")
    # offer.notes (data-cleaning remarks) stay on the offer record, not among warnings: they
    # would repeat on most plans and drown the ones that should change a decision.
    return out


def storage_note(provider: Provider | None) -> str:
    """Persistent storage in a few words: price and whether it survives a stop."""
    if provider is None:
        return "storage terms unknown"
    price = provider.storage_price_usd_per_gb_month
    parts = [f"${price}/GB-month" if price is not None else "storage price unknown"]
    if provider.storage_survives_stop:
        # The provider's own words, whole: a clipped "yes while the" misleads more than it saves.
        parts.append(f"survives a stop: {provider.storage_survives_stop}")
    return "; ".join(parts)
