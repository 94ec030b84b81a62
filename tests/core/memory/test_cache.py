"""The estimate's caches change no answer: an estimate made after others (batch-independent
work reused, breakdown built lazily) equals one made from a cold cache, term for term."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Attention, Checkpointing, Sharding, Strategy
from tuneplan.core.memory import estimate as memory_estimate
from tuneplan.core.memory import estimate_memory
from tuneplan.explain import Breakdown, LazyBreakdown, Term

STRATEGIES = [
    Strategy(method=Method.FULL, gpus=8, sharding=Sharding.ZERO3),
    Strategy(method=Method.LORA, lora_dropout=0.1, checkpointing=Checkpointing.NONE),
    Strategy(method=Method.QLORA, attention=Attention.EAGER, seq_len=1024),
    # DoRA on the attention linears: peft refuses DoRA on fused MoE experts.
    Strategy(method=Method.DORA, grad_accum=4, lora_targets=("q_proj", "v_proj")),
    Strategy(method=Method.IA3, checkpointing=Checkpointing.OFFLOAD),
    Strategy(method=Method.PREFIX),
]


def _cold(model_name: str, strategy: Strategy) -> dict[str, object]:
    memory_estimate.clear_cache()
    est = estimate_memory(resolve_model(model_name), strategy, generation="hopper")
    return {"breakdown": est.breakdown.as_dict(), "host": est.host.as_dict(),
            "phases": dict(est.phases), "peak": est.peak_phase,
            "device": est.device_total_bytes}


@pytest.mark.parametrize("model_name", ["Qwen/Qwen2.5-0.5B", "mistralai/Mixtral-8x7B-v0.1"])
def test_a_warm_estimate_equals_a_cold_one(model_name: str) -> None:
    model = resolve_model(model_name)
    batches = (1, 3, 8)
    cold = {(i, b): _cold(model_name, replace(s, batch_size=b))
            for i, s in enumerate(STRATEGIES) for b in batches}
    memory_estimate.clear_cache()
    for b in reversed(batches):          # warm: every strategy at every batch, other order
        for i, s in enumerate(STRATEGIES):
            est = estimate_memory(model, replace(s, batch_size=b), generation="hopper")
            got = {"breakdown": est.breakdown.as_dict(), "host": est.host.as_dict(),
                   "phases": dict(est.phases), "peak": est.peak_phase,
                   "device": est.device_total_bytes}
            assert got == cold[(i, b)], (s, b)
            assert est.breakdown.total == est.device_total_bytes
            assert all(isinstance(t, Term) and t.unit == "bytes" and t.formula
                       for t in est.breakdown)


def test_a_lazy_breakdown_is_a_breakdown() -> None:
    terms = (Term(path="a", value=2, unit="bytes", formula="x"),
             Term(path="b", value=3, unit="bytes", formula="y"))
    lazy = LazyBreakdown("bytes", lambda: terms, 5)
    eager = Breakdown("bytes", terms)
    assert lazy == eager and eager == lazy
    assert lazy.total == 5 and lazy.value("b") == 3 and lazy.subtotal("a") == 2
    assert lazy.as_dict() == eager.as_dict() and list(lazy) == list(eager)
    twice = LazyBreakdown("bytes", lambda: (terms[0], terms[0]), 4)
    with pytest.raises(ValueError, match="duplicate"):
        _ = twice.terms   # checked like any Breakdown once built


def test_the_same_estimate_again_is_answered_alike_and_shares_no_mutable_state() -> None:
    model = resolve_model("Qwen/Qwen2.5-0.5B")
    memory_estimate.clear_cache()
    strategy = Strategy(method=Method.LORA, batch_size=3, seq_len=1024)
    first = estimate_memory(model, strategy, generation="hopper")
    again_strategy = replace(strategy)          # equal, not the same object
    again = estimate_memory(model, again_strategy, generation="hopper")
    assert again.strategy is again_strategy
    assert again.breakdown.as_dict() == first.breakdown.as_dict()
    assert again.host.as_dict() == first.host.as_dict()
    assert (again.device_total_bytes, again.peak_phase, dict(again.phases)) == (
        first.device_total_bytes, first.peak_phase, dict(first.phases))
    assert again.phases is not first.phases
    first.phases["forward"] = -1                # type: ignore[index]
    third = estimate_memory(model, strategy, generation="hopper")
    assert third.phases == again.phases and third.phases["forward"] != -1
    # another generation is another question (its CUDA context differs)
    other = estimate_memory(model, strategy, generation="ampere")
    memory_estimate.clear_cache()
    assert other.breakdown.as_dict() == estimate_memory(
        model, strategy, generation="ampere").breakdown.as_dict()


@pytest.mark.parametrize("model_name", ["Qwen/Qwen2.5-0.5B", "mistralai/Mixtral-8x7B-v0.1"])
def test_cached_saved_bytes_per_batch_equal_the_blocks_summed_at_that_batch(
        model_name: str) -> None:
    model = resolve_model(model_name)
    for strategy in STRATEGIES:
        memory_estimate.clear_cache()
        fixed = memory_estimate._fixed(model, strategy, memory_estimate._DEFAULT_ASSUMPTIONS)
        assert fixed.saved_line is not None, strategy
        for batch in (1, 5, 7, 64):
            at = replace(strategy, batch_size=batch)
            summed = memory_estimate._saved(fixed.model, at, fixed.widths,
                                            memory_estimate._shape(at, batch),
                                            fixed.layer_inputs)
            line = {k: batch * per + rest for k, per, rest in fixed.saved_line}
            assert list(line.items()) == list(summed.items()), (strategy, batch)
