"""Attention FLOPs of an encoder-decoder (T5 / mT5): three kinds of score products.

Per token (a job's tokens are B·S source tokens, each with a target token: ``--seq-len`` is
both lengths, ``core/memory/seq2seq.py``), QKᵀ and AV cost 4·s·d_attn per attention layer, and
a T5 model has three kinds: encoder self attention (bidirectional: every score computed),
decoder self attention (causal: the kernel's causal factor), and decoder cross attention
(target to source, not causal). The matmuls (``2·N``) already count every linear once per
token: encoder linears on source tokens, decoder and cross-attention linears on target tokens,
cross k/v on the encoder output (source tokens).
"""

from __future__ import annotations

from tuneplan.core.models import ModelSpec


def attention_layers(spec: ModelSpec, causal_factor: float, eager: bool,
                     eager_factor: float) -> float:
    """Σ over attention layers of the share of S·S scores computed: L_enc·1 (bidirectional)
    + L_dec·causal_factor (decoder self) + L_dec·1 (cross); eager computes every score
    (``eager_factor``) in all three."""
    enc = sum(g.count for g in spec.layers if g.kind == "encoder")
    dec = sum(g.count for g in spec.layers if g.kind == "decoder-cross")
    if eager:
        return eager_factor * (enc + 2 * dec)
    return enc + dec * causal_factor + dec
