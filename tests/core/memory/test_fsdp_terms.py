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


H, V = 256, 4096
BLOCK = 2 * H * H + 2 * H * 128 + 3 * H * 688 + 2 * H   # q, o, k, v, MLP, two norms


def test_fsdp2_prefetches_the_last_block_only_once_the_loss_backward_is_done() -> None:
    # the tail's pre-backward (hooked on the logits) runs after the loss's own backward
    # tensors are freed: the last block's all-gather joins the logits' gradient, the head's
    # gradient and its input's gradient, not the loss's log-softmax and its two gradients
    s = strategy((2, "full", 2, 128, True, 2), 2)
    est = estimate_memory(SPEC, s, MemoryAssumptions(fsdp_version=2, adamw_impl="fused",
                                                     fsdp_sync_each_batch=False))
    t = 2 * 128
    gap = est.phases["backward-head"] - est.phases["backward-start"]
    assert gap == BLOCK * 4 + V * H * 4 + t * H * 4 - 2 * t * V * 4
    assert est.peak_phase == "forward"


def test_fsdp1_block_gradient_is_concatenated_from_its_pieces() -> None:
    # split_with_sizes_backward: the per-parameter gradients and the flat gradient at once;
    # a LoRA block's frozen weights get gradients too (all views require grad)
    for method, params in (("full", BLOCK), ("lora", BLOCK + 8 * (
            2 * (H + H) + 2 * (H + 128) + 3 * (H + 688)))):
        est = estimate_memory(SPEC, strategy((1, method, 1, 128, False, 1), 2),
                              MemoryAssumptions(fsdp_version=1, adamw_impl="fused"))
        assert est.peak_phase == "backward-block-gradient"
        assert _value(est, "sharding/fsdp_block_gradient") == 2 * params * 4
