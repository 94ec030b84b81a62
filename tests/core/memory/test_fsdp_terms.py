"""FSDP's own terms (core/memory/fsdp.py), without torch: what each mechanism adds."""

from __future__ import annotations

from dataclasses import replace

from tests.core.memory.fsdp_cases import CONFIG, strategy

from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import parse_model_config

SPEC = parse_model_config(CONFIG, name="tiny-llama")


def _value(est: object, path: str) -> int:
    return int(est.breakdown.value(path))  # type: ignore[attr-defined]


def test_no_sync_keeps_every_gradient_unsharded_unless_each_batch_syncs() -> None:
    s = strategy((2, "full", 1, 128, False, 2), 4)
    a = MemoryAssumptions(fsdp_version=2, fsdp_sync_each_batch=False)  # a Trainer left as is
    est = estimate_memory(SPEC, s, a)
    # FSDP2 full fine-tuning: every trainable parameter's fp32 gradient, not a quarter of it
    assert _value(est, "sharding/fsdp_no_sync_gradients") == est.trainable_params * 4
    synced = estimate_memory(SPEC, s, replace(a, fsdp_sync_each_batch=True))
    assert _value(synced, "sharding/fsdp_no_sync_gradients") == 0
    assert synced.allocated_peak_bytes < est.allocated_peak_bytes


def test_fsdp1_root_unit_holds_embedding_norm_and_head() -> None:
    est = estimate_memory(SPEC, strategy((1, "full", 1, 128, False, 1), 2),
                          MemoryAssumptions(fsdp_version=1))
    assert _value(est, "sharding/fsdp_root_unit") == (2 * 4096 * 256 + 256) * 4
    assert _value(est, "sharding/gathered_blocks") == 0   # FSDP's units replace it
