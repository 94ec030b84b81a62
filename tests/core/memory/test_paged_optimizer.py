"""Paged bitsandbytes optimizers: only the states of tensors of at least 1e5 elements live in
CUDA managed memory (``optimizer/paged_states``); the rest stay ordinary allocations."""

from __future__ import annotations

from dataclasses import replace

from tuneplan.core.job.methods import Method, count_trainable
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Optimizer, Precision, Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.memory.optimizer import PAGED_MIN_ELEMENTS
from tuneplan.core.models import parse_model_config

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
         "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 2,
         "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}


def test_lora_paged_state_is_only_the_large_adapters() -> None:
    spec = parse_model_config(LLAMA, name="llama")
    s = Strategy(method=Method.LORA, lora_rank=32, optimizer=Optimizer.PAGED_ADAMW32BIT)
    est = estimate_memory(spec, s)
    mats = count_trainable(spec, s).matrices
    # A 32 x 1024 = 32,768 and B 1024 x 32 stay unpaged; 4096 x 32 = 131,072 pages
    big = sum(r * c * k for r, c, k in mats if r * c >= PAGED_MIN_ELEMENTS)
    assert 0 < big < count_trainable(spec, s).total
    paged = est.breakdown.value("optimizer/paged_states")
    assert paged == 2 * big * 4
    assert est.breakdown.value("optimizer/states") == 2 * count_trainable(spec, s).total * 4 \
        - paged
    plain = estimate_memory(spec, Strategy(method=Method.LORA, lora_rank=32))
    assert plain.breakdown.value("optimizer/states") == 2 * count_trainable(spec, s).total * 4


def test_paged_8bit_full_pages_the_matrices() -> None:
    """Every matrix's state is paged; the token embedding's is fp32 under the HF Trainer
    (transformers 5.24 ``Trainer.create_optimizer`` registers ``optim_bits=32`` for every
    nn.Embedding), 8-bit under torchtune, whose recipe builds bitsandbytes' class itself."""
    spec = parse_model_config(LLAMA, name="llama")
    s = Strategy(method=Method.FULL, optimizer=Optimizer.PAGED_ADAMW8BIT)
    est = estimate_memory(spec, s)
    big = sum(r * c * k for r, c, k in count_trainable(spec, s).matrices
              if r * c >= PAGED_MIN_ELEMENTS)
    embedding = 32000 * 1024
    assert est.breakdown.value("optimizer/paged_states") == \
        int((big - embedding) * (2 + 2 * 4 / 256)) + embedding * 8
    tune = estimate_memory(spec, replace(s, recipe=Recipe.TORCHTUNE, precision=Precision.BF16))
    assert tune.breakdown.value("optimizer/paged_states") == int(big * (2 + 2 * 4 / 256))
