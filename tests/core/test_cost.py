"""Billing rounding, Young/Daly, the spot expectation against its Monte Carlo, and totals."""

from __future__ import annotations

import math
import random
import statistics
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuneplan.core.cost.estimate import Billing, CostInputs, billed_seconds, charge, estimate_cost
from tuneplan.core.cost.spot import SpotModel, expected_wall_s, simulate, young_daly_interval_s


@pytest.mark.parametrize(("duration", "granularity", "minimum", "billed"), [
    (3601, 1, 0, 3601),        # per-second: what was used
    (3601, 3600, 0, 7200),     # per-hour: a second into the next hour pays the hour
    (3601, 60, 0, 3660),       # per-minute
    (10, 1, 60, 60),           # a 60 s minimum per session
    (59.2, 1, 0, 60),          # fractions round up
    (7200, 3600, 0, 7200),     # exact multiples are not rounded up
])
def test_billing_rounding(duration: float, granularity: int, minimum: int, billed: int) -> None:
    assert billed_seconds(duration, Billing(granularity_s=granularity, minimum_s=minimum)) == billed


def test_charge_is_exact_decimal() -> None:
    assert charge(5400, Decimal("2.40"), Billing(granularity_s=1)) == Decimal("3.6")
    assert charge(5400, Decimal("2.40"), Billing(granularity_s=3600)) == Decimal("4.8")


@settings(max_examples=200, deadline=None)
@given(duration=st.floats(0, 10**6), minimum=st.sampled_from([0, 60, 600]),
       pair=st.sampled_from([(1, 60), (1, 3600), (60, 3600), (1, 1), (30, 60)]))
def test_finer_granularity_never_costs_more(duration: float, minimum: int,
                                            pair: tuple[int, int]) -> None:
    fine, coarse = pair
    price = Decimal("3.17")
    assert (charge(duration, price, Billing(granularity_s=fine, minimum_s=minimum))
            <= charge(duration, price, Billing(granularity_s=coarse, minimum_s=minimum)))


def test_young_daly_closed_form() -> None:
    assert young_daly_interval_s(60, 36_000) == pytest.approx(math.sqrt(2 * 60 * 36_000))
    assert young_daly_interval_s(120, 3600) == pytest.approx(929.5160030897804)
    assert young_daly_interval_s(8000, 3600) == 3600  # C >= 2 MTBF: checkpoint every MTBF
    assert math.isinf(young_daly_interval_s(60, math.inf))


@pytest.mark.parametrize("saves", [False, True])
def test_monte_carlo_mean_converges_to_the_expectation(saves: bool) -> None:
    model = SpotModel(work_s=20 * 3600, interval_s=1800, checkpoint_s=60, restart_s=600,
                      rate_per_s=0.2 / 3600, saves_on_notice=saves)
    expected, failures = expected_wall_s(model)
    runs = simulate(model, runs=10_000, seed=7)
    mean = statistics.fmean(run.wall_s for run in runs)
    assert mean == pytest.approx(expected, rel=0.02)
    assert statistics.fmean(run.interruptions for run in runs) == pytest.approx(failures, rel=0.05)


def test_no_interruptions_is_work_plus_checkpoints() -> None:
    model = SpotModel(work_s=3600, interval_s=1000, checkpoint_s=10, restart_s=100,
                      rate_per_s=0.0, saves_on_notice=False)
    assert expected_wall_s(model) == (100 + 3600 + 4 * 10, 0.0)
    run = simulate(model, runs=1, seed=0)[0]
    assert run.wall_s == 100 + 3600 + 40 and run.interruptions == 0


def test_losing_work_costs_more_than_saving_on_notice() -> None:
    kwargs = dict(work_s=36_000, interval_s=3600, checkpoint_s=60, restart_s=300,
                  rate_per_s=0.5 / 3600)
    lose = expected_wall_s(SpotModel(**kwargs, saves_on_notice=False))[0]
    save = expected_wall_s(SpotModel(**kwargs, saves_on_notice=True))[0]
    assert lose > save


def test_same_seed_same_runs() -> None:
    model = SpotModel(work_s=7200, interval_s=600, checkpoint_s=5, restart_s=60,
                      rate_per_s=1 / 3600, saves_on_notice=False)
    assert simulate(model, runs=50, seed=3) == simulate(model, runs=50, seed=3)
    assert simulate(model, runs=50, seed=3) != simulate(model, runs=50, seed=4)
    assert random.Random(3).random() == random.Random(3).random()


def _inputs(**overrides: object) -> CostInputs:
    base: dict[str, object] = dict(
        train_s=10 * 3600, price_per_hour=Decimal("10"), spot_price_per_hour=Decimal("3"),
        billing=Billing(granularity_s=3600), model_bytes=16 * 10**9, dataset_bytes=10**9,
        checkpoint_bytes_with_optimizer=10**9, checkpoint_bytes_without_optimizer=10**8,
        artifact_bytes=10**8, storage_usd_per_gb_month=Decimal("0.10"),
        egress_usd_per_gb=Decimal("0.09"))
    base.update(overrides)
    return CostInputs(**base)  # type: ignore[arg-type]


def test_total_is_compute_plus_storage_plus_egress() -> None:
    estimate = estimate_cost(_inputs())
    assert estimate.cost == estimate.compute_cost + estimate.storage_cost + estimate.egress_cost
    # 10 h training + 425 s start-up + 1 s checkpoint, billed per hour: 11 h at 10 USD.
    assert estimate.compute_cost == Decimal("110.00")
    assert estimate.egress_cost == Decimal("0.01")  # 0.1 GB x 0.09, rounded up to a cent


def test_spot_price_above_on_demand_is_said() -> None:
    estimate = estimate_cost(_inputs(spot=True, spot_price_per_hour=Decimal("12")))
    assert any("above on-demand" in w for w in estimate.warnings)


def test_spot_costing_more_than_on_demand_is_said() -> None:
    estimate = estimate_cost(_inputs(spot=True, spot_price_per_hour=Decimal("9"),
                                     interruptions_per_hour=2.0))
    assert estimate.spot is not None
    assert estimate.spot.expected_cost > estimate.cost
    assert any("exceeds on-demand" in w for w in estimate.warnings)


def test_spot_estimate_fields() -> None:
    estimate = estimate_cost(_inputs(spot=True, interruptions_per_hour=0.1, notice_s=120))
    spot = estimate.spot
    assert spot is not None and spot.saves_on_notice
    assert spot.p50_cost <= spot.p90_cost
    assert spot.interruptions_expected == pytest.approx(0.1 * 10, rel=0.02)
    assert spot.simulated_mean_hours == pytest.approx(spot.expected_hours, rel=0.02)


def test_a_spot_run_that_cannot_finish_is_refused() -> None:
    from tuneplan.errors import InfeasibleJobError

    with pytest.raises(InfeasibleJobError):
        estimate_cost(_inputs(spot=True, interruptions_per_hour=60.0,
                              checkpoint_every_s=36_000.0))


def test_spot_expected_cost_is_billed_like_its_percentiles() -> None:
    # A ~33-minute job billed per hour: every run pays at least one whole hour of spot, so the
    # expected cost cannot fall below P50 (it once did: price x expected hours, unrounded).
    estimate = estimate_cost(_inputs(spot=True, spot_price_per_hour=Decimal("4"),
                                     train_s=1_600.0))
    spot = estimate.spot
    assert spot is not None
    assert spot.p50_cost <= spot.expected_cost <= spot.p90_cost + Decimal("4")
    assert spot.p50_cost >= Decimal("4")


@pytest.mark.parametrize(("method", "precision", "optimizer", "expected"), [
    # LoRA: fp32 adapters (4 B) + AdamW moments (8 B) per trainable parameter
    ("lora", "bf16-mixed", "adamw", (100 * 12, 100 * 4)),
    # full, mixed: bf16 weights (2 B x all) + moments (8 B) + fp32 masters (4 B)
    ("full", "bf16-mixed", "adamw", (1_000 * 2 + 1_000 * 12, 1_000 * 2)),
    # freeze saves the whole model like full (the `cost` command once saved adapters only)
    ("freeze", "bf16-mixed", "adamw8bit", (1_000 * 2 + 100 * 6, 1_000 * 2)),
    # pure bf16: no fp32 masters
    ("full", "bf16", "adamw", (1_000 * 2 + 1_000 * 8, 1_000 * 2)),
])
def test_checkpoint_bytes_one_formula_for_cost_plan_and_launch(
        method: str, precision: str, optimizer: str, expected: tuple[int, int]) -> None:
    from tuneplan.core.cost.estimate import checkpoint_bytes

    trainable = 1_000 if method == "full" else 100
    assert checkpoint_bytes(method=method, precision=precision, optimizer=optimizer,
                            total_params=1_000, trainable_params=trainable) == expected
