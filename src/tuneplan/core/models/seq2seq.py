"""Parser for BART-style encoder-decoders (``bart``): learned positions, post-LayerNorm blocks
with biases everywhere, cross attention in every decoder block, a head tied to the shared
embedding. Mirrors transformers 5.24 ``models/bart/modeling_bart.py`` (BartEncoderLayer,
BartDecoderLayer, BartLearnedPositionalEmbedding with its offset of 2, ``layernorm_embedding``
in each stack, no final LayerNorm) and ``BartConfig``'s defaults. ``final_logits_bias`` is a
buffer (not learned): not counted. T5 / mT5 are parsed in ``encoders.py``.
"""

from __future__ import annotations

import dataclasses

from tuneplan.core.models.blocks import MLP, DimKeys, block, lin, qkvo, read_dims
from tuneplan.core.models.config import MAX_LAYERS, MAX_POSITIONS, ConfigReader
from tuneplan.core.models.decoders import finish
from tuneplan.core.models.spec import LinearRole, MlpKind, ModelSpec, NormKind

#: BartLearnedPositionalEmbedding: ``num_embeddings + 2`` rows (the offset of 2).
POSITION_OFFSET = 2


def parse_bart(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """BART (BartForConditionalGeneration): encoder and decoder stacks of their own widths."""
    d = read_dims(r, DimKeys(hidden=("d_model", "hidden_size"),
                             layers=("encoder_layers", "num_hidden_layers"),
                             heads=("encoder_attention_heads", "num_attention_heads"),
                             kv_heads=(), head_dim=(), inter=("encoder_ffn_dim",), max_pos=(),
                             fallback={"hidden": 1024, "layers": 12, "heads": 16,
                                       "inter": 4096, "vocab": 50265}))
    dec_layers = r.get_int("decoder_layers", default=12, hi=MAX_LAYERS)
    dec_heads = r.get_int("decoder_attention_heads", default=16)
    dec_inter = r.get_int("decoder_ffn_dim", default=4096)
    positions = r.get_int("max_position_embeddings", default=1024, hi=MAX_POSITIONS)
    r.check(d.hidden % dec_heads == 0, ("d_model", "decoder_attention_heads"),
            f"d_model={d.hidden} is not divisible by decoder_attention_heads={dec_heads}")
    r.check(dec_heads == d.heads and dec_inter == d.inter,
            ("decoder_attention_heads", "decoder_ffn_dim"),
            "decoder_attention_heads / decoder_ffn_dim differing from the encoder's are not "
            "modelled (one head count and MLP width per model)")
    d = dataclasses.replace(d, max_pos=positions)
    h, ln = d.hidden, 2 * d.hidden
    attn = qkvo(d, qkv_bias=True, o_bias=True,
                names=("q_proj", "k_proj", "v_proj", "out_proj"))
    cross = tuple(dataclasses.replace(x, role=LinearRole.CROSS_ATTENTION) for x in attn)
    mlp = (lin("fc1", h, d.inter, MLP, bias=True), lin("fc2", d.inter, h, MLP, bias=True))
    layers = (block(attn + mlp, 2 * ln, kind="encoder", count=d.layers),
              block(attn + cross + mlp, 3 * ln, kind="decoder-cross", count=dec_layers))
    tie = r.get_bool("tie_word_embeddings", default=True)
    rates = {key: r.get_rate(key, default) for key, default in _RATES.items()}
    # shared token embedding + two position tables + two layernorm_embedding
    embedding = d.vocab * h + 2 * (positions + POSITION_OFFSET) * h + 2 * ln
    notes = ["final_logits_bias is a buffer (not learned): not counted"]
    if not tie:   # _tied_weights_keys ties the stacks' embed_tokens to shared only when tied
        embedding += 2 * d.vocab * h
        notes.append("tie_word_embeddings=false: transformers 5.24 builds the encoder's and "
                     "the decoder's embed_tokens apart from shared (3 V x H tables + lm_head)")
    return finish(r, name=name, model_type=model_type, d=d, layers=layers, tie=tie,
                  norm_kind=NormKind.LAYERNORM, mlp_kind=MlpKind.PLAIN,
                  act=r.get_str("activation_function", default="gelu"),
                  embedding_params=embedding, final_norm_params=0, is_encoder_decoder=True,
                  num_decoder_layers=dec_layers, extra=rates, notes=tuple(notes))


#: BartConfig's dropout defaults (transformers 5.24 configuration_bart.py).
_RATES = {"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0}


