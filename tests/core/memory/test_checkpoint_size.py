"""One resumable checkpoint, as the memory estimate counts it (``MemoryEstimate.checkpoint_bytes``
and ``checkpoint_weights_bytes``): what the HF Trainer, DeepSpeed and PEFT write, per
parameter of Llama-3.1-8B. The planner's cost model, its spot notice check and the launch
bundle's grace period and disk all read this figure; the plan file carries it to launch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneplan.adapters.hub import resolve_model
from tuneplan.adapters.plans import saved_plan_from_entry
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Optimizer, Precision, Sharding, Strategy
from tuneplan.core.launch.bundle import launch_spec
from tuneplan.core.memory import estimate_memory
from tuneplan.errors import InvalidValueError

MODEL = resolve_model("meta-llama/Llama-3.1-8B")
P = 8_030_261_248                  # every parameter
EMBED = 128_256 * 4_096            # the token embedding (the head is another matrix)
FIXTURE = Path(__file__).parents[2] / "fixtures" / "launch" / "plan_llama8b_qlora_aws.json"


def _sizes(**strategy: object) -> tuple[int, int]:
    est = estimate_memory(MODEL, Strategy(**strategy))  # type: ignore[arg-type]
    return est.checkpoint_bytes, est.checkpoint_weights_bytes


def test_full_fine_tuning_saves_weights_as_trained_and_the_optimizer_state() -> None:
    assert estimate_memory(MODEL, Strategy(method=Method.FULL)).total_params == P
    # HF Trainer, bf16 autocast: fp32 params (model.safetensors) + two fp32 moments
    assert _sizes(method=Method.FULL) == (12 * P, 4 * P)
    # DeepSpeed ZeRO-3 bf16: bf16 module weights + fp32 master copy + two fp32 moments,
    # every rank's shard together
    assert _sizes(method=Method.FULL, sharding=Sharding.ZERO3, gpus=8) == (14 * P, 2 * P)
    # pure bf16: bf16 params, and torch AdamW's moments in the params' dtype
    assert _sizes(method=Method.FULL, precision=Precision.BF16) == (6 * P, 2 * P)


def test_an_8bit_optimizer_under_the_trainer_saves_its_fp32_embedding_state() -> None:
    """transformers' Trainer keeps the token embedding's AdamW state 32-bit
    (``register_module_override``), so its checkpoint holds 8 B there, not 2 + 8/256 B as
    under ZeRO-2 (no override there; its fp32 master copy, 4 B per parameter, beside)."""
    with_t, without_t = _sizes(method=Method.FULL, optimizer=Optimizer.ADAMW8BIT)
    with_z, without_z = _sizes(method=Method.FULL, optimizer=Optimizer.ADAMW8BIT,
                               sharding=Sharding.ZERO2, gpus=8)
    assert (with_t - without_t) - (with_z - without_z - 4 * P) == EMBED * (8 * 32 - 65) // 32


@pytest.mark.parametrize("method", [Method.LORA, Method.QLORA])
def test_peft_saves_its_fp32_adapters_and_their_state_only(method: Method) -> None:
    est = estimate_memory(MODEL, Strategy(method=method))
    t = est.trainable_params
    assert 0 < t < P // 100
    assert (est.checkpoint_bytes, est.checkpoint_weights_bytes) == (12 * t, 4 * t)


def _entry(**memory: object) -> dict[str, object]:
    doc = json.loads(FIXTURE.read_text())
    entry = doc["plans"][0]
    return {"job": doc["job"], **entry, "memory": {**entry["memory"], **memory}}


def test_the_plan_file_carries_the_figure_to_the_launch_bundle() -> None:
    carried = launch_spec(saved_plan_from_entry(_entry(checkpoint_bytes=123_456_789)))
    assert carried.checkpoint_bytes == 123_456_789
    # a plan file written before plans carried it: the per-parameter rule of thumb
    old = _entry()  # the fixture predates the figure
    assert "checkpoint_bytes" not in old["memory"]  # type: ignore[operator]
    trainable = old["memory"]["trainable_params"]  # type: ignore[index]
    assert launch_spec(saved_plan_from_entry(old)).checkpoint_bytes == trainable * 12


@pytest.mark.parametrize("bad", [-1, 0, 1.5, "10", True, 2**61])
def test_a_bad_checkpoint_size_in_a_plan_file_is_refused_in_one_line(bad: object) -> None:
    with pytest.raises(InvalidValueError, match=r"memory\.checkpoint_bytes"):
        saved_plan_from_entry(_entry(checkpoint_bytes=bad))
