"""Total cost of a training job on one offer: billing rounding, start-up, storage, egress,
checkpoints, and spot with interruptions (``core.cost.spot``). Money is Decimal USD.

Pure: takes the training seconds (from ``core.compute.throughput``), prices and provider terms as
plain
values, and ``CostAssumptions``; reads no catalog and no clock. Does not rank offers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from tuneplan.core.compute.step import STATE_BYTES
from tuneplan.core.cost.spot import (
    SpotModel,
    check_feasible,
    expected_billed_s,
    expected_wall_s,
    percentile,
    simulate,
    young_daly_interval_s,
)
from tuneplan.errors import InvalidValueError
from tuneplan.explain import Breakdown, Term
from tuneplan.units import GB, HOUR_S


@dataclass(frozen=True, slots=True, kw_only=True)
class CostAssumptions:
    """Constants of the cost model (see ``COST_WHY``); override with ``dataclasses.replace``."""

    provisioning_s: float = 180.0
    image_pull_s: float = 120.0
    download_bytes_per_s: float = 200e6
    dataset_bytes_per_token: float = 4.0
    checkpoint_write_bytes_per_s: float = 1e9
    checkpoints_kept: int = 2
    storage_idle_days: float = 0.0
    hours_per_month: float = 730.0
    default_billing_granularity_s: int = HOUR_S
    default_billing_minimum_s: int = 0
    default_storage_usd_per_gb_month: Decimal = Decimal("0.10")
    default_egress_usd_per_gb: Decimal = Decimal("0.09")
    default_interruptions_per_hour: float = 0.1
    monte_carlo_runs: int = 10_000
    seed: int = 0

    def describe(self) -> dict[str, dict[str, Any]]:
        return {name: {"value": str(v) if isinstance(v, Decimal) else v,
                       "why": COST_WHY.get(name, "")} for name, v in asdict(self).items()}


COST_WHY: dict[str, str] = {
    "provisioning_s": "instance allocation and boot before the container starts (typical, stated)",
    "image_pull_s": "pulling a CUDA + PyTorch image of about 10 GB (stated)",
    "download_bytes_per_s": "model and dataset download from the Hugging Face hub: 200 MB/s",
    "dataset_bytes_per_token": "tokenised text on disk: about 4 bytes (characters) per token",
    "checkpoint_write_bytes_per_s": "checkpoint write to a network volume: 1 GB/s",
    "checkpoints_kept": "checkpoints kept on persistent storage (latest and one before)",
    "storage_idle_days": "days the volume is kept between sessions and after the job (user)",
    "hours_per_month": "storage is priced per GB-month: 8760 h / 12",
    "default_billing_granularity_s": "provider's granularity unknown: per hour (conservative)",
    "default_billing_minimum_s": "provider's minimum unknown: none",
    "default_storage_usd_per_gb_month": "provider's storage price unknown: block-storage price",
    "default_egress_usd_per_gb": "provider's egress price unknown: a hyperscaler's first tier",
    "default_interruptions_per_hour": (
        "providers publish no usable spot interruption rate: 1 per 10 running hours (MTBF 10 h), "
        "a planning default; override with --interruptions-per-hour"),
    "monte_carlo_runs": "simulated spot runs for P50/P90",
    "seed": "Monte Carlo seed: the same inputs give the same percentiles",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Billing:
    """How a provider rounds: ``granularity_s`` steps with at least ``minimum_s`` per session."""

    granularity_s: int
    minimum_s: int = 0
    source: str = ""


def billed_seconds(duration_s: float, billing: Billing) -> int:
    """max(minimum, ceil(duration / granularity) x granularity) for one session."""
    step = max(1, billing.granularity_s)
    # Round to whole microseconds first, the same for every granularity, so float noise
    # (3600.0000000001 s) is not billed as an extra step and finer billing stays cheaper.
    rounded = math.ceil(round(max(0.0, duration_s), 6) / step) * step
    return max(billing.minimum_s, int(rounded))


def charge(duration_s: float, price_per_hour: Decimal, billing: Billing) -> Decimal:
    """USD for one session of ``duration_s`` at ``price_per_hour``, rounded as billed."""
    return price_per_hour * Decimal(billed_seconds(duration_s, billing)) / HOUR_S


def billed_total(price_per_hour: Decimal, billed_s: Decimal, extras: Decimal) -> Decimal:
    """cents(price x billed seconds / 3600 + extras), ``extras`` (storage + egress) already in
    whole cents: the one formula by which the cost model, the planner's unit costs scaled to
    an offer's price, and ``tuneplan cost`` turn billed time into a total, so a plan's ranked
    figure, its table, its words and its re-pricing are the same number."""
    return cents(price_per_hour * billed_s / HOUR_S + extras)


def startup_seconds(*, model_bytes: int, dataset_bytes: int, a: CostAssumptions) -> Breakdown:
    """Seconds before training starts: provisioning, image, model and dataset download."""
    rate = a.download_bytes_per_s
    return Breakdown("s", (
        Term(path="startup/provisioning", value=a.provisioning_s, unit="s", formula="assumption"),
        Term(path="startup/image-pull", value=a.image_pull_s, unit="s", formula="assumption"),
        Term(path="startup/model-download", value=model_bytes / rate, unit="s",
             formula="model bytes / download rate", inputs={"bytes": model_bytes}),
        Term(path="startup/dataset-download", value=dataset_bytes / rate, unit="s",
             formula="dataset bytes / download rate", inputs={"bytes": dataset_bytes}),
    ))


def checkpoint_bytes(*, method: str, precision: str, optimizer: str, total_params: int,
                     trainable_params: int) -> tuple[int, int]:
    """(with optimizer state, without) bytes of one resumable checkpoint, by a rule of thumb:
    only for a plan file written before plans carried the memory estimate's own count
    (``MemoryEstimate.checkpoint_bytes``, which the planner and the cost model use).

    Full fine-tuning, freeze and lisa save every weight in bf16 (2 B each); PEFT methods save only
    their fp32 trainable weights (4 B each). The optimizer state adds ``STATE_BYTES`` per
    trainable parameter, plus fp32 master weights (4 B) under mixed precision when full.
    """
    full = method in ("full", "freeze", "lisa")
    without = total_params * 2 if full else trainable_params * 4
    state = STATE_BYTES.get(optimizer, 8) + (4 if full and precision.endswith("-mixed") else 0)
    return without + trainable_params * state, without


def storage_cost(*, stored_bytes: int, hours: float, price_usd_per_gb_month: Decimal,
                 a: CostAssumptions) -> Decimal:
    """GB x price per GB-month x (job hours + idle days x 24) / hours per month."""
    held_h = hours + a.storage_idle_days * 24
    return (Decimal(stored_bytes) / GB * price_usd_per_gb_month
            * Decimal(str(held_h)) / Decimal(str(a.hours_per_month)))


@dataclass(frozen=True, slots=True, kw_only=True)
class CostInputs:
    """One job on one offer: seconds of training, byte sizes, and the provider's terms."""

    train_s: float
    price_per_hour: Decimal | None
    spot_price_per_hour: Decimal | None = None
    billing: Billing
    model_bytes: int
    dataset_bytes: int
    checkpoint_bytes_with_optimizer: int
    checkpoint_bytes_without_optimizer: int
    artifact_bytes: int
    storage_usd_per_gb_month: Decimal | None = None
    egress_usd_per_gb: Decimal | None = None
    spot: bool = False
    checkpoint_every_s: float | None = None
    interruptions_per_hour: float | None = None
    notice_s: float | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SpotEstimate:
    """Spot with interruptions. ``expected_cost`` is the analytic expectation of the billed
    sessions (``spot.expected_billed_s``): the figure a plan is ranked, shown and explained
    by. P50/P90 come from the seeded Monte Carlo, whose mean is ``simulated_mean_cost``."""

    expected_cost: Decimal
    expected_billed_s: float        # expected billed seconds (``spot.expected_billed_s``)
    p50_cost: Decimal
    p90_cost: Decimal
    expected_hours: float
    p50_hours: float
    p90_hours: float
    simulated_mean_hours: float
    simulated_mean_cost: Decimal
    checkpoint_interval_minutes: float | None
    interruptions_expected: float
    interruptions_per_hour: float
    saves_on_notice: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class CostEstimate:
    hours: float
    cost: Decimal
    compute_cost: Decimal
    storage_cost: Decimal
    egress_cost: Decimal
    billing: dict[str, Any]
    startup: Breakdown
    checkpoint: dict[str, Any]
    spot: SpotEstimate | None
    assumptions: CostAssumptions
    warnings: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of ``tuneplan cost`` (money as strings keeps it exact)."""
        return {"hours": self.hours, "cost": self.cost, "compute_cost": self.compute_cost,
                "storage_cost": self.storage_cost, "egress_cost": self.egress_cost,
                "billing": self.billing, "startup": self.startup.as_dict(),
                "checkpoint": self.checkpoint,
                "spot": None if self.spot is None else self.spot.as_dict(),
                "warnings": list(self.warnings), "assumptions": self.assumptions.describe()}


def cents(value: Decimal) -> Decimal:
    """Money rounded up to whole cents (what is shown and summed in a plan)."""
    return value.quantize(Decimal("0.01"), rounding=ROUND_CEILING)


def estimate_cost(job: CostInputs, a: CostAssumptions | None = None) -> CostEstimate:
    """On-demand (and, with ``spot``, spot) cost of one job. Raises InvalidValueError when
    the offer has no price for what is asked."""
    a = a or CostAssumptions()
    warnings: list[str] = list(job.notes)
    start = startup_seconds(model_bytes=job.model_bytes, dataset_bytes=job.dataset_bytes, a=a)
    write_s = job.checkpoint_bytes_with_optimizer / a.checkpoint_write_bytes_per_s
    wall_s = float(start.total) + job.train_s + write_s
    hourly = job.price_per_hour
    if hourly is None and not job.spot:
        raise InvalidValueError("this offer has no on-demand price: add --spot")
    compute = charge(wall_s, hourly, job.billing) if hourly is not None else None
    stored = (job.model_bytes + job.dataset_bytes
              + a.checkpoints_kept * job.checkpoint_bytes_with_optimizer)
    storage_price, egress_price = _side_prices(job, a, warnings)
    # Storage and egress in whole cents, so the parts shown add up to the total.
    storage = cents(storage_cost(stored_bytes=stored, hours=wall_s / HOUR_S,
                                 price_usd_per_gb_month=storage_price, a=a))
    egress = cents(Decimal(job.artifact_bytes) / GB * egress_price)
    # A restart pays the whole start-up again plus reading the checkpoint back.
    restart_s = float(start.total) + write_s
    spot = (_spot(job, a, restart_s, write_s, storage + egress, warnings)
            if job.spot else None)
    if hourly is not None and compute is not None:
        base = compute
        total = billed_total(hourly, Decimal(billed_seconds(wall_s, job.billing)),
                             storage + egress)
    else:
        base = spot.expected_cost - storage - egress if spot else Decimal(0)
        total = base + storage + egress
    if spot and compute is not None and spot.expected_cost > total:
        warnings.append(f"spot's expected cost {cents(spot.expected_cost)} USD exceeds "
                        f"on-demand {cents(total)} USD: interruptions cost more than they save")
    return CostEstimate(
        hours=wall_s / HOUR_S, cost=cents(total), compute_cost=cents(base),
        storage_cost=storage, egress_cost=egress,
        billing={"granularity_s": job.billing.granularity_s, "minimum_s": job.billing.minimum_s,
                 "billed_seconds": billed_seconds(wall_s, job.billing),
                 "price_per_hour": hourly, "source": job.billing.source},
        startup=start,
        checkpoint={"bytes_with_optimizer": job.checkpoint_bytes_with_optimizer,
                    "bytes_without_optimizer": job.checkpoint_bytes_without_optimizer,
                    "write_seconds": write_s, "stored_bytes": stored},
        spot=spot, assumptions=a, warnings=tuple(warnings))


def _side_prices(job: CostInputs, a: CostAssumptions,
                 warnings: list[str]) -> tuple[Decimal, Decimal]:
    """Storage USD/GB-month and egress USD/GB: the provider's, else the stated defaults."""
    storage = job.storage_usd_per_gb_month
    if storage is None:
        storage = a.default_storage_usd_per_gb_month
        warnings.append(f"storage price unknown: {storage} USD/GB-month assumed")
    egress = job.egress_usd_per_gb
    if egress is None:
        egress = a.default_egress_usd_per_gb
        warnings.append(f"egress price unknown: {egress} USD/GB assumed")
    return storage, egress


def _spot(job: CostInputs, a: CostAssumptions, restart_s: float, write_s: float,
          extras: Decimal, warnings: list[str]) -> SpotEstimate:
    price = job.spot_price_per_hour
    if price is None:
        raise InvalidValueError("this offer has no spot price: drop --spot or pick another offer")
    if job.price_per_hour is not None and price > job.price_per_hour:
        warnings.append(f"the spot price {price} USD/h is above on-demand "
                        f"{job.price_per_hour} USD/h for this offer")
    rate_h = job.interruptions_per_hour
    if rate_h is None:
        rate_h = a.default_interruptions_per_hour
        warnings.append(f"no interruption rate for this provider: {rate_h}/h assumed")
    notice = job.notice_s or 0.0
    saves = notice >= write_s > 0 or (notice > 0 and write_s == 0)
    if not saves:
        warnings.append("no usable notice period: an interruption loses the work since the "
                        "last checkpoint")
    mtbf_s = HOUR_S / rate_h if rate_h > 0 else math.inf
    interval = job.checkpoint_every_s or young_daly_interval_s(write_s, mtbf_s)
    model = SpotModel(work_s=job.train_s, interval_s=interval, checkpoint_s=write_s,
                      restart_s=restart_s, rate_per_s=rate_h / HOUR_S, saves_on_notice=saves)
    check_feasible(model)
    wall, failures = expected_wall_s(model)
    runs = simulate(model, runs=a.monte_carlo_runs, seed=a.seed)
    costs = [sum((charge(s, price, job.billing) for s in run.sessions_s), Decimal(0))
             for run in runs]
    hours = [run.wall_s / HOUR_S for run in runs]
    # Billed sessions, not price x expected hours: every session is rounded up to the billing
    # step, so a 33-minute job billed per hour costs a whole hour (and P50 agrees).
    billed_s = expected_billed_s(model, job.billing.granularity_s, job.billing.minimum_s)
    return SpotEstimate(
        expected_cost=billed_total(price, Decimal(str(billed_s)), extras),
        expected_billed_s=billed_s,
        simulated_mean_cost=cents(sum(costs, Decimal(0)) / len(costs) + extras),
        p50_cost=cents(percentile(costs, 0.5) + extras),
        p90_cost=cents(percentile(costs, 0.9) + extras),
        expected_hours=wall / HOUR_S, p50_hours=percentile(hours, 0.5),
        p90_hours=percentile(hours, 0.9), simulated_mean_hours=statistics.fmean(hours),
        checkpoint_interval_minutes=None if math.isinf(interval) else interval / 60,
        interruptions_expected=failures, interruptions_per_hour=rate_h, saves_on_notice=saves)

