"""Every GPU named by an offer of the bundled catalog has the facts the planner needs.

The bundled snapshot once had 696 of 4,740 offers on GPUs with no FLOP/s or bandwidth (RTX A5000,
RTX 4000 Ada, A800, MI355X, ...); the planner dropped them all. These tests keep that count at 0.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tuneplan.adapters.bundled import load_gpu_spec, load_gpu_specs
from tuneplan.adapters.plans import plan
from tuneplan.adapters.store import load_catalog
from tuneplan.core.catalog.gpu_names import normalise_gpu_name
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Job, Strategy
from tuneplan.units import TERA


def test_no_bundled_offer_lacks_gpu_facts() -> None:
    specs = {spec.name: spec for spec in load_gpu_specs()}
    offers = load_catalog()
    assert len(offers) > 4000  # the bundled snapshot, not an empty store
    missing: Counter[str] = Counter()
    for offer in offers:
        spec = specs.get(offer.gpu)
        # BF16/FP16 is the precision the planner plans in (FP32 only on request).
        if spec is None or not spec.bf16_flops_per_s or not spec.memory_bandwidth_bytes_per_s:
            missing[offer.gpu] += 1
    assert missing == Counter()


def test_whole_catalog_plan_rejects_no_offer_for_missing_gpu_facts() -> None:
    result = plan(Job(model="meta-llama/Llama-3.1-8B", strategy=Strategy(method=Method.LORA)))
    reasons = [r.reason for r in result.rejected]
    fact_gaps = [r for r in reasons if "no GPU specification" in r or "publishes no" in r]
    assert fact_gaps == []
    planned = {p.offer.gpu for p in result.plans}
    for gpu in ("RTX A5000", "RTX A4000", "RTX 4000 Ada", "RTX PRO 6000 Blackwell", "MI355X"):
        assert gpu in planned


@pytest.mark.parametrize(("gpu", "bf16_tflops", "bandwidth_gbs"), [
    ("RTX A5000", 111.1, 768), ("RTX A4000", 76.7, 448), ("RTX 4000 Ada", 76.7, 360),
    ("A800 80GB PCIe", 312, 1935), ("MI355X", 2516.6, 8000), ("Titan RTX", 130.5, 672),
])
def test_newly_filled_cards_carry_datasheet_figures(gpu: str, bf16_tflops: float,
                                                    bandwidth_gbs: int) -> None:
    spec = load_gpu_spec(gpu)
    assert spec.bf16_flops_per_s == pytest.approx(bf16_tflops * TERA)
    assert spec.memory_bandwidth_bytes_per_s == bandwidth_gbs * 10**9
    assert spec.source and "memory only" not in spec.source


def test_titan_rtx_is_a_known_gpu_name() -> None:
    assert normalise_gpu_name("NVIDIA TITAN RTX") == "Titan RTX"
    assert normalise_gpu_name("Titan_RTX") == "Titan RTX"
