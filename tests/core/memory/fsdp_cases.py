"""The FSDP configurations simulated by ``test_simulation_fsdp`` (shared with its runner)."""

from __future__ import annotations

from typing import Any

from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Checkpointing, Precision, Sharding, Strategy

# Hidden 256, vocabulary 4k: big enough that FSDP's per-unit buffers, not fixed bytes, count.
CONFIG: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 4096,
    "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}

# (FSDP version, method, batch, seq, checkpointing, grad accumulation)
Case = tuple[int, str, int, int, bool, int]
CASES: list[Case] = [
    (v, m, b, s, ck, ga)
    for v in (1, 2) for m in ("full", "lora") for ck in (False, True) for ga in (1, 2)
    for b, s in [(2, 128) if ck else (1, 128)]]


def strategy(case: Case, world: int) -> Strategy:
    _, method, b, s, ckpt, ga = case
    return Strategy(method=Method(method), recipe=Recipe.PLAIN, precision=Precision.FP32,
                    sharding=Sharding.FSDP, gpus=world, batch_size=b, seq_len=s, grad_accum=ga,
                    checkpointing=Checkpointing.FULL if ckpt else Checkpointing.NONE,
                    lora_rank=8, lora_alpha=16, lora_targets=("all-linear",))


def case_id(case: Case, world: int) -> str:
    v, m, b, s, ck, ga = case
    return f"fsdp{v}-{m}-w{world}-b{b}s{s}-{'ckpt' if ck else 'nockpt'}-ga{ga}"
