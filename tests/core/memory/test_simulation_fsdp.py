"""FSDP1 / FSDP2 as accelerate wraps them, simulated on 2 real CPU ranks (gloo).

The ranks are spawned once for the module (``adapters/probe/fsdp_step.simulate``); the tests
check mechanisms the simulation shows, from torch 2.13's FSDP code, and record where the
analytic estimate stands against it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("accelerate")

from tests.core.memory.fsdp_cases import CASES, CONFIG, Case, case_id, strategy

from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import parse_model_config

pytestmark = pytest.mark.probe

WORLD = 2
H, V, MLP, KV = 256, 4096, 688, 128  # hidden, vocabulary, MLP width, k/v width (2 heads · 64)
LAYERS = 3
BLOCK = 2 * H * H + 2 * H * KV + 3 * H * MLP + 2 * H         # q, o, k, v, MLP, two norms
PARAMS = 2 * V * H + H + LAYERS * BLOCK                      # untied embedding + head, norm
LORA = LAYERS * 8 * (2 * (H + H) + 2 * (H + KV) + 3 * (H + MLP))  # r = 8 on every linear

#: every configuration at 2 ranks; at 4, full and LoRA under both FSDP versions, accumulating
W4_CASES: list[Case] = [c for c in CASES if not c[4] and c[5] == 2]


@pytest.fixture(scope="module")
def simulated() -> dict[str, Any]:
    from tuneplan.adapters.probe.fsdp_step import FsdpCase, simulate

    def cases(group: list[Case], world: int) -> list[FsdpCase]:
        return [FsdpCase(name=case_id(c, world), config=CONFIG, strategy=strategy(c, world),
                         version=c[0]) for c in group]
    two = cases(CASES, 2)
    flat = next(c for c in two if c.name == case_id((1, "lora", 1, 128, False, 1), 2))
    two.append(replace(flat, name="v1-lora-flat", use_orig_params=False))
    return {**simulate(two, 2), **simulate(cases(W4_CASES, 4), 4)}


def _name(version: int, method: str, accumulate: int) -> str:
    return case_id((version, method, 1, 128, False, accumulate), WORLD)


def _forward(result: Any) -> int:
    return max(int(r.by_phase["forward"]) for r in result)


def test_parameters_are_sharded_across_ranks(simulated: dict[str, Any]) -> None:
    for rank in simulated[_name(2, "full", 1)]:
        assert rank.by_category["parameters"] == PARAMS * 4 // WORLD


def test_fsdp1_refuses_mixed_units_without_orig_params(simulated: dict[str, Any]) -> None:
    # torch 2.13 fsdp/_wrap_utils.py _validate_frozen_params / _flat_param.py: a LoRA block
    # (frozen base + trainable A/B) cannot be one flat parameter with use_orig_params=False.
    for rank in simulated["v1-lora-flat"]:
        assert "uniform `requires_grad`" in rank.error


def test_no_sync_holds_unsharded_gradients(simulated: dict[str, Any]) -> None:
    # accelerate's no_sync (FSDP2: set_requires_gradient_sync(False)) keeps every gradient
    # unsharded between micro-batches: the second forward carries all of them, full size.
    extra = _forward(simulated[_name(2, "full", 2)]) - _forward(simulated[_name(2, "full", 1)])
    assert abs(extra - PARAMS * 4) <= 0.005 * PARAMS * 4


def test_fsdp1_mixed_unit_accumulates_gradients_for_frozen_parameters(
        simulated: dict[str, Any]) -> None:
    # FSDP1 (use_orig_params=True) gives a unit's flat parameter one gradient for all its
    # elements, frozen ones included (the warning in _validate_frozen_params); FSDP2 keeps
    # per-parameter gradients, the LoRA factors' alone.
    fsdp1 = _forward(simulated[_name(1, "lora", 2)]) - _forward(simulated[_name(1, "lora", 1)])
    fsdp2 = _forward(simulated[_name(2, "lora", 2)]) - _forward(simulated[_name(2, "lora", 1)])
    blocks = (LAYERS * BLOCK + LORA) * 4
    assert abs(fsdp1 - blocks) <= 0.02 * blocks
    assert abs(fsdp2 - LORA * 4) <= 0.02 * LORA * 4


ALL = [(c, 2) for c in CASES] + [(c, 4) for c in W4_CASES]


@pytest.mark.parametrize("case", ALL, ids=[case_id(*c) for c in ALL])
def test_estimate_matches_simulated_peak(simulated: dict[str, Any],
                                         case: tuple[Case, int]) -> None:
    (config, world) = case
    spec = parse_model_config(CONFIG, name="tiny-llama")
    # the simulated step: fused AdamW; the FSDP generation the case wraps with
    # the simulation accumulates under accelerate's no_sync (a Trainer left at its default)
    a = MemoryAssumptions(adamw_impl="fused", fsdp_version=config[0], fsdp_sync_each_batch=False)
    est = estimate_memory(spec, strategy(config, world), a)
    tensors = est.allocated_peak_bytes - int(
        est.breakdown.value("overheads/cublas_workspace"))  # GPU-only, not simulated
    peak = max(r.peak_bytes for r in simulated[case_id(config, world)])
    assert abs(tensors - peak) <= 0.03 * peak, (
        f"estimated {tensors} ({est.peak_phase}) vs simulated {peak}")
