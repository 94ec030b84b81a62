"""Kimi-K2 (``kimi_k2``): DeepSeek-V3's own modeling code, routed experts one nn.Linear each."""

from __future__ import annotations

import pytest

from tuneplan.core.job.methods import Method, count_trainable
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.models import LinearRole, ModelSpec, count_parameters, parse_model_config

# moonshotai/Kimi-K2-Instruct config.json (the keys the parser reads)
KIMI = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                     "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
        "n_shared_experts": 1, "n_routed_experts": 384, "num_experts_per_tok": 8,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 163840, "max_position_embeddings": 131072,
        "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "norm_topk_prob": True,
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
        "torch_dtype": "bfloat16"}
H, E, M = 7168, 384, 2048
ATTN_IO = [(H, 1536), (1536, 64 * 192), (H, 512 + 64), (512, 64 * 256), (64 * 128, H)]


@pytest.fixture(scope="module")
def kimi() -> ModelSpec:
    return parse_model_config(KIMI, name="moonshotai/Kimi-K2-Instruct")


def test_parse_per_expert_linears_and_counts(kimi: ModelSpec) -> None:
    assert kimi.per_expert_linears and kimi.num_experts == E
    moe = kimi.layers[-1]
    experts = [(x.name, x.in_features, x.out_features, x.copies)
               for x in moe.linears if x.role is LinearRole.EXPERT]
    assert experts == [("gate_proj", H, M, E), ("up_proj", H, M, E), ("down_proj", M, H, E)]
    attn = sum(i * o for i, o in ATTN_IO)
    norms = 2 * H + 1536 + 512
    dense = attn + 3 * H * 18432 + norms
    sparse = attn + H * E + (E + 1) * 3 * H * M + norms + E   # + e_score_correction_bias
    counts = count_parameters(kimi)
    assert counts.total == 2 * 163840 * H + H + dense + 60 * sparse == 1_026_408_232_448
    assert counts.active_per_token == counts.total - 60 * (E - 8) * 3 * H * M \
        == 32_861_500_928


def test_all_linear_lora_wraps_every_expert(kimi: ModelSpec) -> None:
    r = 16
    attn = sum(i + o for i, o in ATTN_IO)
    expected = r * (61 * attn + 3 * (H + 18432) + 60 * (E + 1) * 3 * (H + M))
    assert count_trainable(kimi, Strategy(method=Method.LORA, lora_rank=r)).total == expected


def test_qlora_quantizes_the_experts(kimi: ModelSpec) -> None:
    lora = estimate_memory(kimi, Strategy(method=Method.LORA)).breakdown
    qlora = estimate_memory(kimi, Strategy(method=Method.QLORA)).breakdown
    assert qlora.value("weights/quantized") > 60 * E * 3 * H * M // 2
    qlora_weights = sum(qlora.value(k) for k in (
        "weights/quantized", "weights/quant_constants", "weights/unquantized"))
    assert qlora_weights < lora.value("weights/frozen") * 3 // 10
