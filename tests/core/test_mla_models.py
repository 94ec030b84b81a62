"""DeepSeek-V3 (multi-head latent attention, dense first blocks, routed + shared experts): the
exact parameter count against transformers itself (meta device, the bundled config) and the
FLOPs per token the speed model charges."""

from __future__ import annotations

import pytest

from tuneplan.adapters.hub import find_bundled, load_bundled_config, resolve_model
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.throughput import flops_per_token, model_shape_from_spec
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Attention, Strategy
from tuneplan.core.models import count_parameters
from tuneplan.core.models.latent import mla_dims, qkv_dims, rope_dim, score_dim

NAME = "deepseek-ai/DeepSeek-V3"


def test_mla_sizes_of_the_bundled_config() -> None:
    spec = resolve_model(NAME)
    d = mla_dims(spec)
    assert d is not None and (d.q_rank, d.kv_rank, d.nope, d.rope, d.v) == (1536, 512, 128, 64,
                                                                           128)
    assert qkv_dims(spec) == (128 * 192, 128 * 192, 128 * 128)
    assert rope_dim(spec) == 64
    assert score_dim(spec) == 128 * (192 + 128) // 2 == 20_480
    assert spec.extra["n_group"] == 8 and spec.extra["topk_group"] == 4


def test_attention_and_matmul_flops_per_token() -> None:
    spec = resolve_model(NAME)
    shape = model_shape_from_spec(spec)
    counts = count_parameters(spec)
    # every matmul a token passes through: the active parameters less the embedding lookup
    # and the norm weights (37.6B active: 3 dense blocks, 58 x (8 of 256 routed + 1 shared))
    norms = counts.by_component["layers/norms"] + counts.by_component["final_norm"]
    assert shape.matmul_params == counts.active_per_token - counts.by_component[
        "embeddings"] - norms
    assert 37_000_000_000 < counts.active_per_token < 38_000_000_000
    strategy = Strategy(method=Method.LORA, seq_len=4096, attention=Attention.SDPA)
    a = ThroughputAssumptions()
    flops = flops_per_token(shape, strategy, a, context=4096)
    attention = flops.value("forward/attention")
    # QK^T 2·s·H·192 plus AV 2·s·H·128 per token and block, causal
    assert attention == 61 * (2 * 4096 * 128 * 192 + 2 * 4096 * 128 * 128) * \
        a.causal_attention_factor


@pytest.mark.probe
def test_exact_count_equals_transformers_on_the_meta_device() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = dict(load_bundled_config(find_bundled(NAME)))   # type: ignore[arg-type]
    config.pop("quantization_config", None)   # FP8 storage: not what training builds
    hf = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for n, b in model.named_buffers() if n.endswith(
        "e_score_correction_bias"))
    counts = count_parameters(resolve_model(NAME))
    assert params == counts.total == 671_026_404_352
    # the multi-token-prediction layer (num_nextn_predict_layers) is not built by transformers;
    # the routers' score-correction biases are buffers: 58 MoE blocks x 256 experts
    assert buffers == 58 * 256 == resolve_model(NAME).extra["e_score_correction_bias_elements"]


#: DeepSeek-V2-Lite style (plain q_proj, 2 shared experts) and V2 style (q LoRA, MLP biases,
#: group-limited routing, a dense first block)
V2_CONFIGS = {
    "lite": {"model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 3,
             "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 128,
             "q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
             "qk_rope_head_dim": 8, "v_head_dim": 24, "n_routed_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "grouped": {"model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96,
                "vocab_size": 128, "q_lora_rank": 24, "kv_lora_rank": 16, "mlp_bias": True,
                "attention_bias": True, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                "v_head_dim": 12, "n_routed_experts": 4, "n_shared_experts": 1,
                "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "first_k_dense_replace": 1, "topk_method": "group_limited_greedy",
                "n_group": 2, "topk_group": 1, "tie_word_embeddings": True},
}


@pytest.mark.probe
@pytest.mark.parametrize("variant", sorted(V2_CONFIGS))
def test_deepseek_v2_count_equals_transformers(variant: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tuneplan.core.models import parse_model_config

    config = V2_CONFIGS[variant]
    hf = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    spec = parse_model_config(config, name=variant)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(spec).total
    assert mla_dims(spec) is not None


def test_deepseek_v2_refuses_an_unknown_topk_method_and_a_missing_top_k() -> None:
    from tuneplan.core.models import parse_model_config
    from tuneplan.errors import ModelConfigError

    bad = {**V2_CONFIGS["lite"], "topk_method": "noaux_tc"}
    with pytest.raises(ModelConfigError, match="topk_method"):
        parse_model_config(bad, name="bad")
    missing = {k: v for k, v in V2_CONFIGS["lite"].items() if k != "num_experts_per_tok"}
    with pytest.raises(ModelConfigError, match="num_experts_per_tok"):
        parse_model_config(missing, name="missing")
