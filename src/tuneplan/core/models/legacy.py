"""Parsers for the LayerNorm-era decoder families: gpt2, gpt_neox, opt, bloom, falcon, phi,
stablelm.

Each mirrors the transformers 5 module layout (HF module names) and config-class defaults.
Nothing here reads files.
"""

from __future__ import annotations

import dataclasses

from tuneplan.core.models.blocks import (
    MLP,
    DimKeys,
    Dims,
    block,
    gated_mlp,
    lin,
    qkvo,
    read_dims,
)
from tuneplan.core.models.config import MAX_POSITIONS, ConfigReader
from tuneplan.core.models.decoders import finish
from tuneplan.core.models.spec import Linear, MlpKind, ModelSpec, NormKind

LN = NormKind.LAYERNORM
_MHA = DimKeys(kv_heads=(), head_dim=())   # classic multi-head attention, head_dim = h // heads


def _fused_qkv_block(d: Dims, qkv_out: int, *, attn_bias: bool, mlp_bias: bool
                     ) -> tuple[Linear, ...]:
    """The GPT-NeoX / BLOOM / Falcon block: fused ``query_key_value``, ``dense``, and a plain
    MLP ``dense_h_to_4h`` / ``dense_4h_to_h``."""
    return (lin("query_key_value", d.hidden, qkv_out, bias=attn_bias),
            lin("dense", d.hidden, d.hidden, bias=attn_bias),
            lin("dense_h_to_4h", d.hidden, d.inter, MLP, bias=mlp_bias),
            lin("dense_4h_to_h", d.inter, d.hidden, MLP, bias=mlp_bias))


def parse_gpt2(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """GPT-2: Conv1D c_attn/c_proj/c_fc with biases, learned positions, tied head."""
    d = read_dims(r, DimKeys(hidden=("n_embd", "hidden_size"), layers=("n_layer",
                             "num_hidden_layers"), heads=("n_head", "num_attention_heads"),
                             kv_heads=(), head_dim=(), inter=(),
                             max_pos=()))
    inter = r.get_int("n_inner", default=4 * d.hidden, why="gpt2: null means 4 x n_embd")
    positions = r.get_int("n_positions", "max_position_embeddings", default=1024,
                          hi=MAX_POSITIONS)
    d = dataclasses.replace(d, inter=inter, max_pos=positions)
    linears = (lin("c_attn", d.hidden, 3 * d.hidden, bias=True),
               lin("c_proj", d.hidden, d.hidden, bias=True),
               lin("c_fc", d.hidden, inter, MLP, bias=True),
               lin("c_proj", inter, d.hidden, MLP, bias=True))
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 4 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=True), norm_kind=LN,
                  mlp_kind=MlpKind.PLAIN, act=r.get_str("activation_function", default="gelu_new"),
                  embedding_params=(d.vocab + positions) * d.hidden,
                  final_norm_params=2 * d.hidden,
                  notes=("Conv1D weights are stored transposed (in x out)",))


def parse_gpt_neox(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """GPT-NeoX / Pythia / StableLM-alpha: fused query_key_value, two LayerNorms per block."""
    d = read_dims(r, _MHA)
    bias = r.get_bool("attention_bias", default=True)
    linears = _fused_qkv_block(d, 3 * d.hidden, attn_bias=bias, mlp_bias=True)
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 4 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=False), norm_kind=LN,
                  mlp_kind=MlpKind.PLAIN, act=r.get_str("hidden_act", default="gelu"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=2 * d.hidden)


def parse_opt(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """OPT: learned positions with an offset of 2, optional project_in/out, tied head."""
    d = read_dims(r, dataclasses.replace(_MHA, inter=("ffn_dim",)))
    proj = r.get_int("word_embed_proj_dim", default=d.hidden, why="hidden_size")
    bias = r.get_bool("enable_bias", default=True)
    affine = r.get_bool("layer_norm_elementwise_affine", default=True, note=False)
    pre_norm = r.get_bool("do_layer_norm_before", default=True)
    removed = r.get_bool("_remove_final_layer_norm", default=False, note=False)
    positions = r.get_int("max_position_embeddings", default=2048, hi=MAX_POSITIONS)
    d = dataclasses.replace(d, max_pos=positions)
    ln = 2 * d.hidden if affine else 0
    linears = (*qkvo(d, qkv_bias=bias, o_bias=bias, names=("q_proj", "k_proj", "v_proj",
                                                            "out_proj")),
               lin("fc1", d.hidden, d.inter, MLP, bias=bias),
               lin("fc2", d.inter, d.hidden, MLP, bias=bias))
    project = 2 * proj * d.hidden if proj != d.hidden else 0   # project_in + project_out
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 2 * ln, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=True), norm_kind=LN,
                  mlp_kind=MlpKind.PLAIN, act=r.get_str("activation_function", default="relu"),
                  embedding_params=d.vocab * proj + (positions + 2) * d.hidden + project,
                  final_norm_params=ln if pre_norm and not removed else 0,
                  head_in_features=proj)


def parse_bloom(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """BLOOM: ALiBi (no position table), LayerNorm after the embedding, tied head."""
    d = read_dims(r, DimKeys(hidden=("hidden_size", "n_embed"), layers=("n_layer",
                             "num_hidden_layers"), heads=("n_head", "num_attention_heads"),
                             kv_heads=(), head_dim=(), inter=(), max_pos=()))
    d = dataclasses.replace(d, inter=4 * d.hidden)
    linears = _fused_qkv_block(d, 3 * d.hidden, attn_bias=True, mlp_bias=True)
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 4 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=True), norm_kind=LN,
                  mlp_kind=MlpKind.PLAIN, act="gelu",
                  embedding_params=d.vocab * d.hidden + 2 * d.hidden,
                  final_norm_params=2 * d.hidden)


def parse_falcon(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """Falcon: old (multi-query, one LayerNorm) and new (GQA, ln_attn + ln_mlp) decoders."""
    new_arch = r.get_bool("new_decoder_architecture", default=False)
    multi_query = r.get_bool("multi_query", default=True)
    d = read_dims(r, dataclasses.replace(_MHA, kv_heads=("num_kv_heads",) if new_arch else (),
                                         inter=()))
    d = dataclasses.replace(d, inter=r.get_int("ffn_hidden_size", default=4 * d.hidden,
                                               why="4 x hidden_size"))
    if not new_arch:
        d = dataclasses.replace(d, kv_heads=1 if multi_query else d.heads)
    bias = r.get_bool("bias", default=False)
    parallel = r.get_bool("parallel_attn", default=True)
    n_ln = r.opt_int("num_ln_in_parallel_attn", hi=2)  # 1 or 2
    n_ln = (2 if new_arch else 1) if n_ln is None else n_ln
    norms = 2 if not parallel or n_ln == 2 else 1
    qkv_out = (d.heads + 2 * d.kv_heads) * d.head_dim
    linears = _fused_qkv_block(d, qkv_out, attn_bias=bias, mlp_bias=bias)
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, norms * 2 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=True), norm_kind=LN,
                  mlp_kind=MlpKind.PLAIN, act=r.get_str("activation", default="gelu"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=2 * d.hidden)


def parse_phi(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """Phi-1/1.5/2: parallel attention + MLP with one LayerNorm, biases everywhere, head bias."""
    d = read_dims(r, DimKeys(head_dim=()))
    qk_norm = r.get_bool("qk_layernorm", default=False)
    linears = (*qkvo(d, qkv_bias=True, o_bias=True, names=("q_proj", "k_proj", "v_proj",
                                                           "dense")),
               lin("fc1", d.hidden, d.inter, MLP, bias=True),
               lin("fc2", d.inter, d.hidden, MLP, bias=True))
    norms = 2 * d.hidden + (4 * d.head_dim if qk_norm else 0)
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, norms, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=False), norm_kind=LN,
                  mlp_kind=MlpKind.PLAIN, act=r.get_str("hidden_act", default="gelu_new"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=2 * d.hidden,
                  head_bias=True)


def parse_stablelm(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """StableLM (2, Zephyr): LayerNorms, gated MLP, optional QKV bias and per-head q/k norms."""
    d = read_dims(r, DimKeys(kv_default=32, head_dim=()))
    qkv_bias = r.get_bool("use_qkv_bias", default=False)
    parallel = r.get_bool("use_parallel_residual", default=False)
    qk_norm = r.get_bool("qk_layernorm", default=False)
    linears = (*qkvo(d, qkv_bias=qkv_bias, o_bias=False), *gated_mlp(d.hidden, d.inter))
    norms = (1 if parallel else 2) * 2 * d.hidden
    norms += (d.heads + d.kv_heads) * d.head_dim if qk_norm else 0   # bias-free per-head norms
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, norms, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=False), norm_kind=LN,
                  mlp_kind=MlpKind.GATED, act=r.get_str("hidden_act", default="silu"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=2 * d.hidden)



def parse_gpt_bigcode(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """GPT-BigCode (StarCoder, SantaCoder; transformers 5.24 modeling_gpt_bigcode.py): GPT-2
    with nn.Linear (not Conv1D) and, with ``multi_query``, one shared key/value head:
    ``c_attn`` is hidden -> hidden + 2 x head_dim; learned positions; tied head."""
    d = read_dims(r, DimKeys(hidden=("n_embd", "hidden_size"), layers=("n_layer",
                             "num_hidden_layers"), heads=("n_head", "num_attention_heads"),
                             kv_heads=(), head_dim=(), inter=(), max_pos=()))
    inter = r.get_int("n_inner", default=4 * d.hidden, why="gpt_bigcode: null means 4 x n_embd")
    positions = r.get_int("n_positions", "max_position_embeddings", default=1024,
                          hi=MAX_POSITIONS)
    multi_query = r.get_bool("multi_query", default=True)
    kv = 1 if multi_query else d.heads
    d = dataclasses.replace(d, inter=inter, max_pos=positions, kv_heads=kv)
    linears = (lin("c_attn", d.hidden, d.hidden + 2 * kv * d.head_dim, bias=True),
               lin("c_proj", d.hidden, d.hidden, bias=True),
               lin("c_fc", d.hidden, inter, MLP, bias=True),
               lin("c_proj", inter, d.hidden, MLP, bias=True))
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 4 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=True), norm_kind=LN,
                  mlp_kind=MlpKind.PLAIN,
                  act=r.get_str("activation_function", default="gelu_pytorch_tanh"),
                  embedding_params=(d.vocab + positions) * d.hidden,
                  final_norm_params=2 * d.hidden)


def parse_starcoder2(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """StarCoder2 (transformers 5.24 modeling_starcoder2.py): separate q/k/v/o with GQA and
    biases (``use_bias``), plain MLP ``c_fc``/``c_proj`` with biases, LayerNorms with bias,
    tied head by default."""
    d = read_dims(r, DimKeys(kv_default=2, head_dim=()))
    bias = r.get_bool("use_bias", default=True)
    linears = (*qkvo(d, qkv_bias=bias, o_bias=bias),
               lin("c_fc", d.hidden, d.inter, MLP, bias=bias),
               lin("c_proj", d.inter, d.hidden, MLP, bias=bias))
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 4 * d.hidden, count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=True), norm_kind=LN,
                  mlp_kind=MlpKind.PLAIN, act=r.get_str("hidden_act", default="gelu_pytorch_tanh"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=2 * d.hidden)
