"""Parsers for decoder families whose hub repositories ship their own modeling code.

Qwen-1 (``qwen``, QWenLMHeadModel), Baichuan 2 (``baichuan``), ChatGLM2/3 (``chatglm``),
InternLM2 / InternLM2.5 (``internlm2``) and Kimi-K2 (``kimi_k2``): transformers cannot build
them without running the repository's code (``trust_remote_code``), which tuneplan never
does. Their config.json keys are mapped onto the analytic decoder here, the module layout and
names read from each repository's ``modeling_*.py`` (Hugging Face hub, files named below), so
adapter targets are the modules' real names (``c_attn``, ``W_pack``, ``query_key_value``,
``wqkv``). Pure.
"""

from __future__ import annotations

import dataclasses

from tuneplan.core.models.blocks import MLP, DimKeys, block, lin, read_dims
from tuneplan.core.models.config import ConfigReader
from tuneplan.core.models.decoders import deepseek_v3_spec, finish
from tuneplan.core.models.spec import MlpKind, ModelSpec, NormKind

_RMS = NormKind.RMSNORM


def parse_qwen1(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """Qwen-1 (Qwen/Qwen-7B modeling_qwen.py): fused ``c_attn`` (hidden -> 3 x heads x
    kv_channels, bias always on), ``c_proj``; MLP ``w1``/``w2`` (hidden -> intermediate_size
    // 2 each; ``w1 * silu(w2)``) and ``c_proj`` back; RMSNorm ``ln_1``/``ln_2``/``ln_f``;
    untied ``lm_head``. Biases other than c_attn's follow ``no_bias`` (true in every release)."""
    d = read_dims(r, DimKeys(kv_heads=(), head_dim=("kv_channels",), max_pos=(
        "max_position_embeddings", "seq_length")))
    no_bias = r.get_bool("no_bias", default=True)
    full = r.get_int("intermediate_size", default=22016)
    r.check(full >= 2, ("intermediate_size",),
            f"intermediate_size={full} must be at least 2 (w1 and w2 are half of it)")
    inner = max(full // 2, 1)
    d = dataclasses.replace(d, inter=inner)
    proj = d.heads * d.head_dim
    linears = (lin("c_attn", d.hidden, 3 * proj, bias=True),
               lin("c_proj", proj, d.hidden, bias=not no_bias),
               lin("w1", d.hidden, inner, MLP, bias=not no_bias),
               lin("w2", d.hidden, inner, MLP, bias=not no_bias),
               lin("c_proj", inner, d.hidden, MLP, bias=not no_bias))
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 2 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=False), norm_kind=_RMS,
                  mlp_kind=MlpKind.GATED, act="silu",
                  embedding_params=d.vocab * d.hidden, final_norm_params=d.hidden,
                  notes=("Qwen-1 (remote code, not run): config keys mapped onto the analytic "
                         "decoder; intermediate_size is twice the MLP width (w1, w2 are "
                         "intermediate_size // 2 wide)",
                         "the MLP's w2 reads the block input (w1 * silu(w2)); the memory "
                         "model groups saved inputs by module name and counts it as a "
                         "down projection's (same tensors in full fine-tuning)"))


def parse_baichuan(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """Baichuan 2 (baichuan-inc/Baichuan2-7B-Base modeling_baichuan.py, 13B likewise with
    ALiBi): fused ``W_pack`` (hidden -> 3 x hidden, no bias), ``o_proj``, gated MLP
    ``gate_proj``/``up_proj``/``down_proj``, RMSNorms, untied ``NormHead`` (a vocab x hidden
    weight normalised in forward)."""
    d = read_dims(r, DimKeys(kv_heads=(), head_dim=(), max_pos=(
        "max_position_embeddings", "model_max_length")))
    linears = (lin("W_pack", d.hidden, 3 * d.hidden),
               lin("o_proj", d.hidden, d.hidden),
               lin("gate_proj", d.hidden, d.inter, MLP),
               lin("up_proj", d.hidden, d.inter, MLP),
               lin("down_proj", d.inter, d.hidden, MLP))
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 2 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=False), norm_kind=_RMS,
                  mlp_kind=MlpKind.GATED, act=r.get_str("hidden_act", default="silu"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=d.hidden,
                  notes=("Baichuan 2 (remote code, not run): config keys mapped onto the "
                         "analytic decoder; lm_head is a NormHead (not an nn.Linear), so "
                         "no adapter or 4-bit quantisation reaches it",))


def parse_chatglm(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """ChatGLM2/3 (THUDM/chatglm3-6b modeling_chatglm.py): ``query_key_value`` (hidden ->
    heads x kv_channels + 2 x multi_query_group_num x kv_channels, bias ``add_qkv_bias``),
    ``dense``; MLP ``dense_h_to_4h`` (hidden -> 2 x ffn_hidden_size, SwiGLU halves) and
    ``dense_4h_to_h``; RMSNorms (``rmsnorm``); ``final_layernorm`` (``post_layer_norm``);
    untied ``output_layer``."""
    d = read_dims(r, DimKeys(layers=("num_layers", "num_hidden_layers"), kv_heads=(),
                             head_dim=("kv_channels",), inter=("ffn_hidden_size",),
                             vocab=("padded_vocab_size", "vocab_size"),
                             max_pos=("seq_length",)))
    groups = (r.get_int("multi_query_group_num", default=1)
              if r.get_bool("multi_query_attention", default=False) else d.heads)
    r.check(d.heads % groups == 0, ("multi_query_group_num",),
            f"multi_query_group_num={groups} must divide num_attention_heads={d.heads}")
    d = dataclasses.replace(d, kv_heads=groups)
    qkv_bias = r.get_bool("add_qkv_bias", default=False)
    bias = r.get_bool("add_bias_linear", default=False)
    rms = r.get_bool("rmsnorm", default=True)
    norm = d.hidden if rms else 2 * d.hidden
    linears = (lin("query_key_value", d.hidden, (d.heads + 2 * groups) * d.head_dim,
                   bias=qkv_bias),
               lin("dense", d.heads * d.head_dim, d.hidden, bias=bias),
               lin("dense_h_to_4h", d.hidden, 2 * d.inter, MLP, bias=bias),
               lin("dense_4h_to_h", d.inter, d.hidden, MLP, bias=bias))
    final = norm if r.get_bool("post_layer_norm", default=True) else 0
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 2 * norm, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=False),
                  norm_kind=_RMS if rms else NormKind.LAYERNORM, mlp_kind=MlpKind.GATED,
                  act="swiglu", embedding_params=d.vocab * d.hidden, final_norm_params=final,
                  notes=("ChatGLM (remote code, not run): config keys mapped onto the "
                         "analytic decoder; multi-query groups are its KV heads",))


def parse_internlm2(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """InternLM2 (internlm/internlm2-7b modeling_internlm2.py): ``attention.wqkv`` (hidden ->
    (heads + 2 x kv_heads) x head_dim, bias ``bias``), ``attention.wo``; MLP
    ``feed_forward.w1`` (gate), ``w3`` (up), ``w2`` (down); RMSNorms ``attention_norm``,
    ``ffn_norm``, ``norm``; ``output`` head (untied)."""
    d = read_dims(r, DimKeys(head_dim=()))
    bias = r.get_bool("bias", default=True)
    linears = (lin("wqkv", d.hidden, (d.heads + 2 * d.kv_heads) * d.head_dim, bias=bias),
               lin("wo", d.heads * d.head_dim, d.hidden, bias=bias),
               lin("w1", d.hidden, d.inter, MLP),
               lin("w3", d.hidden, d.inter, MLP),
               lin("w2", d.inter, d.hidden, MLP))
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 2 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=False), norm_kind=_RMS,
                  mlp_kind=MlpKind.GATED, act=r.get_str("hidden_act", default="silu"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=d.hidden,
                  notes=("InternLM2 (remote code, not run): config keys mapped onto the "
                         "analytic decoder",))


def parse_kimi_k2(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """Kimi-K2 (moonshotai/Kimi-K2-Instruct): DeepSeek-V3's own modeling_deepseek.py
    (``DeepseekV3ForCausalLM`` via auto_map), not transformers' deepseek_v3 module. Same MLA
    (``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``, ``kv_a_proj_with_mqa``,
    ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``) and block plan; the routed experts are an
    nn.ModuleList of DeepseekV3MLP, each with its own ``gate_proj``/``up_proj``/``down_proj``
    nn.Linear (so bitsandbytes quantizes them and PEFT wraps each as a lora.Linear); the router
    ``MoEGate`` holds ``weight`` and ``e_score_correction_bias`` as nn.Parameters (no
    nn.Linear) and computes its logits in fp32."""
    return deepseek_v3_spec(r, model_type, name, per_expert_linears=True, notes=(
        "Kimi-K2 (remote code, not run): DeepSeek-V3's own modeling code; routed experts "
        "are one nn.Linear per expert and projection",
        "multi-token-prediction layers (num_nextn_predict_layers) excluded: not built by "
        "the modeling code",
        "router e_score_correction_bias counted: an nn.Parameter of MoEGate",
        "the published modeling code does not train as shipped: MoEGate asserts not "
        "self.training under topk_method noaux_tc and DeepseekV3MoE.forward has no training "
        "branch; the estimate assumes a patched forward that keeps this module layout"))
