"""Parsers for models with an encoder: t5/mt5 (encoder-decoder), bert (encoder, counted as
BertForMaskedLM) and gemma3 (text model plus its SigLIP vision tower and projector).

Mirrors transformers 5 module layouts and config defaults; nothing here reads files.
"""

from __future__ import annotations

import dataclasses

from tuneplan.core.models.blocks import (
    MLP,
    DimKeys,
    block,
    lin,
    qkvo,
    read_dims,
)
from tuneplan.core.models.config import MAX_LAYERS, MAX_POSITIONS, ConfigReader
from tuneplan.core.models.decoders import finish, parse_llama_like
from tuneplan.core.models.spec import LayerSpec, Linear, LinearRole, MlpKind, ModelSpec, NormKind

CROSS = LinearRole.CROSS_ATTENTION


def _t5_ff(r: ConfigReader, model_type: str) -> tuple[bool, str]:
    """(gated, activation) from ``feed_forward_proj`` ("relu", "gated-gelu", ...)."""
    default = "gated-gelu" if model_type == "mt5" else "relu"
    proj = r.get_str("feed_forward_proj", default=default)
    if not r.has("feed_forward_proj"):
        r.default("feed_forward_proj", default)
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or not parts[-1]:
        r.problem("feed_forward_proj", f"must be 'ACT' or 'gated-ACT', got {proj[:30]!r}")
        return False, "relu"
    act = parts[-1]
    return len(parts) == 2, "gelu_new" if proj == "gated-gelu" else act


def parse_t5(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """T5 / mT5 / T0 / mT0: shared embedding, relative position bias in each stack's first
    block, weight-only RMS LayerNorms, ReLU or gated (wi_0/wi_1) feed-forward."""
    d = read_dims(r, DimKeys(hidden=("d_model", "hidden_size"), layers=("num_layers",
                             "num_hidden_layers"), heads=("num_heads", "num_attention_heads"),
                             kv_heads=(), head_dim=("d_kv",), head_dim_default=64,
                             inter=("d_ff",), max_pos=()))
    dec_layers = r.get_int("num_decoder_layers", default=d.layers, why="num_layers",
                           hi=MAX_LAYERS)
    buckets = r.get_int("relative_attention_num_buckets", default=32)
    gated, act = _t5_ff(r, model_type)
    inner = d.heads * d.head_dim
    attn = qkvo(d, qkv_bias=False, o_bias=False,
                names=("q", "k", "v", "o"))
    cross = tuple(dataclasses.replace(x, role=CROSS) for x in attn)
    ff: tuple[Linear, ...] = (
        (lin("wi_0", d.hidden, d.inter, MLP), lin("wi_1", d.hidden, d.inter, MLP)) if gated
        else (lin("wi", d.hidden, d.inter, MLP),)) + (lin("wo", d.inter, d.hidden, MLP),)
    dropout = _dropout_rate(r)
    rel = {"relative_attention_bias": buckets * d.heads}
    tie = r.get_bool("tie_word_embeddings", default=True)
    notes = () if tie else ("separate lm_head counted as the checkpoint stores it; transformers "
                            ">= 5 forces tie_word_embeddings=True for t5/mt5 and drops it",)
    layers = (*_stack("encoder", attn + ff, 2 * d.hidden, d.layers, rel),
              *_stack("decoder-cross", attn + cross + ff, 3 * d.hidden, dec_layers, rel))
    return finish(r, name=name, model_type=model_type, d=d, layers=layers, tie=tie, notes=notes,
                  norm_kind=NormKind.RMSNORM, mlp_kind=MlpKind.GATED if gated else MlpKind.PLAIN,
                  act=act, embedding_params=d.vocab * d.hidden, final_norm_params=2 * d.hidden,
                  is_encoder_decoder=True, num_decoder_layers=dec_layers,
                  extra={"inner_dim": inner, "relative_attention_num_buckets": buckets,
                         "dropout_rate": dropout})


def _dropout_rate(r: ConfigReader) -> float:
    """``dropout_rate`` in [0, 1): T5Config's default 0.1 (transformers 5.24) when absent;
    the training step keeps a dropout mask wherever it is above 0."""
    return r.get_rate("dropout_rate", 0.1)


def _stack(kind: str, linears: tuple[Linear, ...], norms: int, count: int,
           rel: dict[str, int]) -> tuple[LayerSpec, ...]:
    first = block(linears, norms, kind=kind, extra=rel)
    rest = block(linears, norms, kind=kind, count=count - 1)
    return (first, rest) if count > 1 else (first,)


def parse_bert(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """BERT / RoBERTa as *ForMaskedLM: word/position/token-type embeddings (+ LayerNorm),
    post-LN encoder blocks, MLM head (dense + LayerNorm + tied decoder with bias). No pooler.

    RoBERTa (transformers 5.24 ``models/roberta``) has the same modules and counts: its
    position table is ``max_position_embeddings`` (514 on the hub: padding offset 2) rows and
    its ``lm_head`` is BERT's ``cls.predictions``. The dropout rates are kept in ``extra``
    (BertConfig defaults 0.1); ``classifier_dropout`` None means ``hidden_dropout_prob``."""
    d = read_dims(r, DimKeys(kv_heads=(), head_dim=(), max_pos=()))
    positions = r.get_int("max_position_embeddings", default=512, hi=MAX_POSITIONS)
    types = r.get_int("type_vocab_size", default=2, hi=1_000_000)
    d = dataclasses.replace(d, max_pos=positions)
    hidden_p = r.get_rate("hidden_dropout_prob", 0.1)
    extra = {"hidden_dropout_prob": hidden_p,
             "attention_probs_dropout_prob": r.get_rate("attention_probs_dropout_prob", 0.1),
             "classifier_dropout": r.get_rate("classifier_dropout", hidden_p)}
    linears = (*qkvo(d, qkv_bias=True, o_bias=True, names=("query", "key", "value", "dense")),
               lin("intermediate.dense", d.hidden, d.inter, MLP, bias=True),
               lin("output.dense", d.inter, d.hidden, MLP, bias=True))
    return finish(r, name=name, model_type=model_type, d=d,
                  layers=(block(linears, 4 * d.hidden, kind="encoder", count=d.layers),),
                  tie=r.get_bool("tie_word_embeddings", default=True),
                  norm_kind=NormKind.LAYERNORM, mlp_kind=MlpKind.PLAIN,
                  act=r.get_str("hidden_act", default="gelu"),
                  embedding_params=(d.vocab + positions + types) * d.hidden + 2 * d.hidden,
                  final_norm_params=0, head_bias=True,
                  head_extra_params=d.hidden * d.hidden + 3 * d.hidden, extra=extra,
                  notes=(f"counted as {'Roberta' if model_type == 'roberta' else 'Bert'}"
                         "ForMaskedLM (MLM head, no pooler)",))


def parse_gemma3(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """Gemma 3 multimodal: the ``text_config`` language model plus the SigLIP vision tower and
    the multimodal projector (Gemma3ForConditionalGeneration)."""
    text = r.child("text_config", family="gemma3_text", why="Gemma3TextConfig defaults")
    tie = r.get_bool("tie_word_embeddings", default=True)
    spec = parse_llama_like(text, "gemma3_text", name)
    vision = r.child("vision_config", family="siglip_vision_model",
                     why="SiglipVisionConfig defaults")
    layers, extra = _siglip(vision, spec.hidden_size)
    return dataclasses.replace(
        spec, model_type=model_type, tie_word_embeddings=tie, vision_layers=layers,
        vision_extra_params=extra, defaults_applied=tuple(r.defaults),
        notes=("includes the SigLIP vision tower and multimodal projector",))


def _siglip(r: ConfigReader, text_hidden: int) -> tuple[tuple[LayerSpec, ...], dict[str, int]]:
    """SiglipVisionModel blocks and the rest (patch/position embeddings, post-LN, head,
    Gemma 3's projector weight + soft-embedding RMSNorm)."""
    d = read_dims(r, DimKeys(kv_heads=(), head_dim=(), vocab=(), max_pos=(), fallback={
        "hidden": 768, "inter": 3072, "layers": 12, "heads": 12}))
    channels = r.get_int("num_channels", default=3, hi=1_000)
    image = r.get_int("image_size", default=224, hi=1_000_000)
    patch = r.get_int("patch_size", default=16, hi=1_000_000)
    use_head = r.get_bool("vision_use_head", default=True)
    h, i = d.hidden, d.inter
    linears = (*qkvo(d, qkv_bias=True, o_bias=True, names=("q_proj", "k_proj", "v_proj",
                                                           "out_proj")),
               lin("fc1", h, i, MLP, bias=True), lin("fc2", i, h, MLP, bias=True))
    extra = {"vision/embeddings": channels * patch * patch * h + h + (image // patch) ** 2 * h,
             "vision/post_layernorm": 2 * h}
    if use_head:   # probe + nn.MultiheadAttention + LayerNorm + MLP
        extra["vision/head"] = h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (2 * h * i + i + h)
    extra["multi_modal_projector"] = h * text_hidden + h
    return (block(linears, 4 * h, kind="vision", count=d.layers),), extra
