"""Properties of the analytic estimate: monotone in batch/seq/rank/targets, method and sharding
order, sums of terms, and bytes as integers (GB and GiB never mixed)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Checkpointing, Offload, Optimizer, Sharding, Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.errors import UnsupportedError

MODEL = resolve_model("meta-llama/Llama-3.2-1B")
BIG = resolve_model("meta-llama/Llama-3.1-8B")
methods = st.sampled_from([Method.FULL, Method.LORA, Method.QLORA, Method.DORA, Method.IA3,
                           Method.PREFIX, Method.PROMPT])
ckpt = st.sampled_from(list(Checkpointing))


def _peak(s: Strategy) -> int:
    return estimate_memory(MODEL, s).allocated_peak_bytes


@settings(max_examples=60, deadline=None)
@given(methods, ckpt, st.integers(1, 8), st.integers(64, 4096), st.integers(1, 128))
def test_monotone_in_batch_seq_rank(method: Method, c: Checkpointing, b: int, s: int,
                                    r: int) -> None:
    base = Strategy(method=method, checkpointing=c, batch_size=b, seq_len=s, lora_rank=r)
    assert _peak(replace(base, batch_size=b + 1)) >= _peak(base)
    assert _peak(replace(base, seq_len=s + 64)) >= _peak(base)
    assert _peak(replace(base, lora_rank=r + 8)) >= _peak(base)


def test_monotone_in_targets() -> None:
    few = Strategy(lora_targets=("q_proj", "v_proj"))
    more = Strategy(lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    assert _peak(more) >= _peak(few)
    assert _peak(Strategy()) >= _peak(more)


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B",
                                  "Qwen/Qwen2.5-7B"])
def test_full_above_lora_above_qlora(name: str) -> None:
    model = resolve_model(name)
    peaks = [estimate_memory(model, Strategy(method=m)).allocated_peak_bytes
             for m in (Method.FULL, Method.LORA, Method.QLORA)]
    assert peaks[0] > peaks[1] > peaks[2]


@pytest.mark.parametrize("method", [Method.FULL, Method.LORA])
def test_zero_stages_order(method: Method) -> None:
    def peak(sh: Sharding) -> int:
        return estimate_memory(BIG, Strategy(method=method, gpus=8, sharding=sh)
                               ).device_total_bytes
    assert peak(Sharding.ZERO3) <= peak(Sharding.ZERO2) <= peak(Sharding.ZERO1) <= peak(
        Sharding.DDP)


def test_terms_sum_and_are_integer_bytes() -> None:
    est = estimate_memory(BIG, Strategy(method=Method.QLORA, batch_size=2))
    assert est.breakdown.unit == "bytes"
    assert all(isinstance(t.value, int) for t in est.breakdown)
    assert est.breakdown.total == est.device_total_bytes
    assert est.allocated_peak_bytes == max(est.phases.values()) + int(
        est.breakdown.value("overheads/cublas_workspace"))


def test_full_finetune_is_sixteen_bytes_per_param_plus() -> None:
    est = estimate_memory(BIG, Strategy(method=Method.FULL))
    assert est.breakdown.value("weights/trainable") == 8_030_261_248 * 4
    assert est.breakdown.value("optimizer/states") == 8_030_261_248 * 8


def test_refusals() -> None:
    with pytest.raises(UnsupportedError, match="rank"):
        estimate_memory(BIG, Strategy(lora_rank=0))
    with pytest.raises(UnsupportedError, match="limit"):
        estimate_memory(BIG, Strategy(seq_len=200_000))
    estimate_memory(BIG, Strategy(seq_len=200_000, allow_long_context=True))
    with pytest.raises(UnsupportedError, match="8-bit"):
        estimate_memory(BIG, Strategy(optimizer=Optimizer.ADAMW8BIT, gpus=2,
                                      sharding=Sharding.ZERO3, offload=Offload.OPTIMIZER))
    with pytest.raises(UnsupportedError, match="recipe"):
        estimate_memory(BIG, Strategy(method=Method.QLORA, recipe=Recipe.PLAIN, gpus=2,
                                      sharding=Sharding.FSDP))
