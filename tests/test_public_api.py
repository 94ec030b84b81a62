"""The curated public surface: exactly these names, each importable and documented."""

from __future__ import annotations

import tuneplan

EXPECTED = {
    "Breakdown", "Job", "MemoryAssumptions", "MemoryEstimate", "ModelSpec", "ParameterCounts",
    "PlanResult", "Strategy", "Term", "TuneplanError", "__version__", "count_parameters",
    "estimate_memory", "estimate_throughput", "load_catalog", "parse_model_config", "plan",
    "resolve_model",
}


def test_public_names_are_exactly_the_curated_list() -> None:
    assert set(tuneplan.__all__) == EXPECTED
    assert all(hasattr(tuneplan, name) for name in tuneplan.__all__)


def test_every_public_callable_is_documented() -> None:
    undocumented = [name for name in tuneplan.__all__
                    if callable(getattr(tuneplan, name)) and not getattr(tuneplan, name).__doc__]
    assert undocumented == []


def test_the_python_api_answers_the_main_question() -> None:
    model = tuneplan.resolve_model("llama-3.1-8b")
    estimate = tuneplan.estimate_memory(model, tuneplan.Strategy())
    # The breakdown runs up to the whole device: allocated terms, then reserve, then context.
    assert estimate.breakdown.total == estimate.device_total_bytes
    allocated, reserved = estimate.allocated_peak_bytes, estimate.reserved_peak_bytes
    assert allocated < reserved < estimate.device_total_bytes
    assert tuneplan.count_parameters(model).total == 8_030_261_248
