"""tuneplan's parameter counts against real transformers modules built on the meta device.

Each case is a tiny config.json (2-3 layers, hidden 64) that exercises one feature; the model
is built with ``torch.device("meta")`` (no memory; accelerate's init_empty_weights would untie
embeddings) and every parameter is mapped to a tuneplan component by its module path.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tuneplan.core.models import count_parameters, parse_model_config

pytestmark = pytest.mark.probe
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_BASE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 64}


def _cfg(model_type: str, **over: Any) -> dict[str, Any]:
    return {"model_type": model_type, **_BASE, **over}


_DS = dict(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
           qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=4,
           n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
           first_k_dense_replace=1, n_group=1, topk_group=1)
_GEMMA3_TEXT = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2,
                "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "vocab_size": 128}
_SIGLIP = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28,
           "patch_size": 14}

CASES: dict[str, dict[str, Any]] = {
    # GQA 4/2, explicit head_dim != hidden/heads, attention and MLP biases, untied head
    "llama-gqa-bias": _cfg("llama", num_key_value_heads=2, head_dim=32, attention_bias=True,
                           mlp_bias=True, tie_word_embeddings=False),
    # keys missing: kv heads = heads, head_dim = hidden/heads, no biases, untied by default
    "llama-defaults": _cfg("llama"),
    "llama-tied": _cfg("llama", num_key_value_heads=1, tie_word_embeddings=True),
    "mistral": _cfg("mistral", num_key_value_heads=2, sliding_window=16),
    "mixtral": _cfg("mixtral", num_key_value_heads=2, num_local_experts=4,
                    num_experts_per_tok=2),
    # Q/K/V biases with no config key; tied
    "qwen2": _cfg("qwen2", num_key_value_heads=2, tie_word_embeddings=True),
    # shared expert + gate, sparse step 2 and an mlp-only layer: dense and MoE blocks mixed
    "qwen2_moe": _cfg("qwen2_moe", num_hidden_layers=4, num_key_value_heads=2, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, decoder_sparse_step=2,
                      mlp_only_layers=[3]),
    "qwen3": _cfg("qwen3", num_key_value_heads=2, head_dim=24, tie_word_embeddings=True),
    "qwen3_moe": _cfg("qwen3_moe", num_key_value_heads=2, head_dim=16, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=32),
    "gemma": _cfg("gemma", num_key_value_heads=1, head_dim=32),
    "gemma2": _cfg("gemma2", num_key_value_heads=2, head_dim=16),
    "gemma3_text": dict(_GEMMA3_TEXT),
    # multimodal: text model + SigLIP tower (with and without the pooling head) + projector
    "gemma3": {"model_type": "gemma3", "mm_tokens_per_image": 4, "text_config": _GEMMA3_TEXT,
               "vision_config": {**_SIGLIP, "vision_use_head": False}},
    "gemma3-head": {"model_type": "gemma3", "mm_tokens_per_image": 4,
                    "text_config": _GEMMA3_TEXT, "vision_config": _SIGLIP},
    "phi": _cfg("phi", qk_layernorm=True),
    "phi3": _cfg("phi3", num_key_value_heads=2, pad_token_id=0),
    # MLA with q LoRA, one dense block then routed + shared experts
    "deepseek_v3": _cfg("deepseek_v3", **_DS),
    "deepseek_v3-no-q-lora": _cfg("deepseek_v3", **{**_DS, "q_lora_rank": None,
                                                     "attention_bias": True}),
    # V2: softmax router (group-limited here), MLP biases, two shared experts
    "deepseek_v2": _cfg("deepseek_v2", **{**_DS, "mlp_bias": True, "n_shared_experts": 2,
                                           "topk_method": "group_limited_greedy", "n_group": 2,
                                           "topk_group": 1}),
    # attention sinks, biases everywhere, router bias, 3-D experts with biases
    "gpt_oss": _cfg("gpt_oss", num_key_value_heads=2, head_dim=16, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=8),
    "gpt_neox": _cfg("gpt_neox"),
    "gpt_neox-nobias-tied": _cfg("gpt_neox", attention_bias=False, tie_word_embeddings=True),
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": None,
             "n_positions": 32, "vocab_size": 128},
    # word_embed_proj_dim < hidden: project_in/out, smaller head input
    "opt": _cfg("opt", ffn_dim=96, word_embed_proj_dim=32),
    "opt-postnorm": _cfg("opt", ffn_dim=96, do_layer_norm_before=False,
                         tie_word_embeddings=False),
    "bloom": {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4,
              "vocab_size": 128},
    "falcon-old-mqa": _cfg("falcon", multi_query=True, new_decoder_architecture=False),
    "falcon-old-serial-bias": _cfg("falcon", multi_query=False, parallel_attn=False,
                                   bias=True, new_decoder_architecture=False),
    "falcon-new-gqa": _cfg("falcon", new_decoder_architecture=True, num_kv_heads=2,
                           ffn_hidden_size=128),
    "stablelm": _cfg("stablelm", num_key_value_heads=2, use_qkv_bias=True, qk_layernorm=True),
    "stablelm-parallel": _cfg("stablelm", num_key_value_heads=4, use_parallel_residual=True),
    "t5-relu-tied": {"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 96,
                     "num_layers": 2, "num_decoder_layers": 3, "num_heads": 4,
                     "vocab_size": 128, "feed_forward_proj": "relu"},
    "mt5-gated-untied": {"model_type": "mt5", "d_model": 64, "d_kv": 8, "d_ff": 96,
                         "num_layers": 2, "num_heads": 4, "vocab_size": 128,
                         "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
    "bert": _cfg("bert", type_vocab_size=2),
    # RobertaForMaskedLM: BERT's modules (lm_head for cls.predictions), 514 positions
    "roberta": _cfg("roberta", type_vocab_size=1, max_position_embeddings=66, pad_token_id=1),
    # multi-query c_attn (hidden + 2 x head_dim), nn.Linear, learned positions, tied
    "gpt_bigcode-mqa": {"model_type": "gpt_bigcode", "n_embd": 64, "n_layer": 2, "n_head": 4,
                        "n_inner": 96, "n_positions": 32, "vocab_size": 128},
    "gpt_bigcode-mha": {"model_type": "gpt_bigcode", "n_embd": 64, "n_layer": 2, "n_head": 4,
                        "multi_query": False, "vocab_size": 128, "n_positions": 32},
    "starcoder2": _cfg("starcoder2", num_key_value_heads=2),
    "starcoder2-nobias-untied": _cfg("starcoder2", num_key_value_heads=2, use_bias=False,
                                     tie_word_embeddings=False),
    # q_norm / k_norm over the whole projections (GQA: k_norm is kv_heads x head_dim wide)
    "olmo2": _cfg("olmo2", num_key_value_heads=2),
    "granite": _cfg("granite", num_key_value_heads=2, tie_word_embeddings=True),
    "smollm3": _cfg("smollm3", num_key_value_heads=2, pad_token_id=0),
    "bart": {"model_type": "bart", "d_model": 64, "encoder_ffn_dim": 96, "decoder_ffn_dim": 96,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_layers": 2,
             "decoder_layers": 3, "vocab_size": 128, "max_position_embeddings": 64},
    "bart-untied": {"model_type": "bart", "d_model": 64, "encoder_ffn_dim": 96,
                    "decoder_ffn_dim": 96, "encoder_attention_heads": 4,
                    "decoder_attention_heads": 4, "encoder_layers": 1, "decoder_layers": 1,
                    "vocab_size": 128, "max_position_embeddings": 64,
                    "tie_word_embeddings": False},
}

#: Families whose modeling code lives in their hub repositories (remote code, never run): no
#: transformers module to compare with; their bundled totals are held to published counts.
REMOTE_CODE_TYPES = frozenset({"qwen", "baichuan", "chatglm", "internlm2", "kimi_k2"})

# transformers >= 5 forces tie_word_embeddings=True for t5/mt5 (see T5Config.__post_init__),
# while the T5 v1.1 / mT5 / T0 / mT0 checkpoints ship a separate lm_head, which tuneplan counts
# (their published totals include it). Parameters tuneplan counts beyond transformers 5's module:
_CHECKPOINT_ONLY = {"mt5-gated-untied": {"lm_head": 128 * 64}}

_EMBED = re.compile(r"embed_tokens|\bwte\b|\bwpe\b|embed_in|word_embeddings|embed_positions|"
                    r"(^|\.)shared\.|project_in|project_out|position_embeddings|token_type|"
                    r"embeddings\.LayerNorm|layernorm_embedding")
_LAYER = re.compile(r"\.(layers|h|block|layer)\.\d+\.")


def _component(name: str, seq2seq: bool = False) -> str:
    """Map a transformers parameter path to tuneplan's by_component key."""
    if "multi_modal_projector" in name:
        return "multi_modal_projector"
    if "vision_tower" in name:
        if _LAYER.search(name):
            return "vision/layers/" + _inside_layer(name)
        return "vision/" + next(k for k in ("embeddings", "post_layernorm", "head") if k in name)
    if name.startswith(("lm_head", "embed_out", "cls.")) or ".lm_head" in name:
        return "lm_head"
    if _EMBED.search(name):
        return "embeddings"
    if not _LAYER.search(name):
        return "final_norm"
    prefix = "encoder" if "encoder." in name else "decoder" if (
        "decoder.block" in name or (seq2seq and "decoder.layers" in name)) else "layers"
    return f"{prefix}/{_inside_layer(name)}"


def _inside_layer(name: str) -> str:
    rules = (("sinks", "attention_sinks"), ("relative_attention_bias", "relative_attention_bias"),
             ("norm", "norms"), ("ln_", "norms"), ("LayerNorm", "norms"),
             ("shared_expert_gate", "router"), ("shared_expert", "shared_experts"),
             ("experts.", "experts"), ("mlp.gate.", "router"), ("mlp.router.", "router"),
             ("EncDecAttention", "cross_attention"), ("encoder_attn", "cross_attention"),
             ("attn", "attention"),
             ("attention", "attention"), ("Attention", "attention"))
    return next((comp for key, comp in rules if key in name), "mlp")


def _build(config: dict[str, Any]) -> Any:
    cfg = dict(config)
    model_type = cfg.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
    auto = {"t5": transformers.AutoModelForSeq2SeqLM, "mt5": transformers.AutoModelForSeq2SeqLM,
            "bart": transformers.AutoModelForSeq2SeqLM,
            "bert": transformers.AutoModelForMaskedLM,
            "roberta": transformers.AutoModelForMaskedLM,
            "gemma3": transformers.Gemma3ForConditionalGeneration}
    with torch.device("meta"):
        factory = auto.get(model_type, transformers.AutoModelForCausalLM)
        return (factory(hf_config) if factory is transformers.Gemma3ForConditionalGeneration
                else factory.from_config(hf_config))


@pytest.mark.parametrize("case", sorted(CASES))
def test_counts_match_transformers_module(case: str) -> None:
    config = CASES[case]
    model = _build(config)
    real: dict[str, int] = {}
    for name, param in model.named_parameters():   # shared (tied) parameters appear once
        key = _component(name, seq2seq=config["model_type"] == "bart")
        real[key] = real.get(key, 0) + param.numel()
    for key, value in _CHECKPOINT_ONLY.get(case, {}).items():
        real[key] = real.get(key, 0) + value
    counts = count_parameters(parse_model_config(config, name=case))
    ours = {k: v for k, v in counts.by_component.items() if v}
    assert ours == real
    extra = sum(_CHECKPOINT_ONLY.get(case, {}).values())
    assert counts.total == sum(p.numel() for p in model.parameters()) + extra


def test_every_supported_type_has_a_case() -> None:
    from tuneplan.core.models import SUPPORTED_MODEL_TYPES

    covered = {c["model_type"] for c in CASES.values()}
    assert covered == set(SUPPORTED_MODEL_TYPES) - REMOTE_CODE_TYPES


def _bundled() -> list[str]:
    import csv
    from importlib import resources

    folder = resources.files("tuneplan.data") / "models"
    rows = csv.DictReader((folder / "INDEX.csv").read_text().splitlines())
    return sorted(r["file"] for r in rows if r["model_type"] not in REMOTE_CODE_TYPES)


@pytest.mark.parametrize("file", _bundled())
def test_bundled_config_total_matches_transformers(file: str) -> None:
    import json
    from importlib import resources

    config = json.loads((resources.files("tuneplan.data") / "models" / file).read_text())
    spec = parse_model_config(config, name=file)
    # the hub's quantization block and remote-code map are not architecture
    hf = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
    model = _build(hf)
    real = sum(p.numel() for p in model.parameters())
    # T0/mT0 ship an untied lm_head that transformers >= 5 ties away (see _CHECKPOINT_ONLY)
    untied_t5 = spec.model_type in ("t5", "mt5") and not spec.tie_word_embeddings
    head = spec.vocab_size * spec.hidden_size if untied_t5 else 0
    assert count_parameters(spec).total == real + head
