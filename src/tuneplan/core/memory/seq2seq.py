"""Encoder-decoder (T5 / mT5 / T0 / mT0, and BART) activations a training step saves, tensor by
tensor.

Read off transformers 5.24 ``models/t5/modeling_t5.py`` (T5LayerNorm, T5Attention with its
attention interface, T5DenseActDense / T5DenseGatedActDense, T5Block, T5Stack) and checked
tensor by tensor with autograd's saved-tensor hooks on tiny configs (fp32 and bf16, full and
LoRA, dropout on and off), then against the fake-tensor simulation
(``tests/core/memory/test_simulation_seq2seq.py``).

One job length: a seq2seq job has a source (encoder) and a target (decoder) length, and the job
vocabulary has one ``--seq-len``. Both are taken to be ``--seq-len`` (the decoder's cross
attention then attends S target positions to S source positions); a job with a shorter target
is over-estimated by its decoder's share.

Per T5 sublayer (self attention, cross attention, feed-forward), with T = B·S tokens:

- T5LayerNorm: ``x.to(fp32).pow(2)`` saves the fp32 input (the residual itself when it is
  fp32, else a copy), ``x * rsqrt`` saves the residual ``x`` (a second tensor when it is not
  fp32) and the fp32 rsqrt (T·4); ``weight * h`` saves ``h`` when the weight trains; its output
  is the sublayer's linear input (saved when a linear there trains or a LoRA reads it);
- eager attention (T5's own ``eager_attention_forward``): q and k (``q @ kᵀ``), the softmax
  output B·heads·S·S_kv in the compute dtype (no fp32 upcast in T5), the dropout mask and the
  dropout output when ``dropout_rate`` > 0, v, and the contiguous output (o's input);
- SDPA: the position bias is an additive float mask, so no flash kernel; CUDA's
  memory-efficient kernel saves q, k, v, the output, an fp32 logsumexp B·heads·S and the mask
  (1·heads·S·S_kv): a contiguous copy per encoder block and a ``torch.where`` per decoder self
  attention; the cross attention's all-zero bias is one tensor for the stack. Modelled from the
  kernel's signature (``_efficient_attention_backward`` takes the bias), not simulated: on the
  CPU a mask that needs a gradient sends SDPA to the math kernel instead;
- feed-forward: ``relu`` saves its output; ``gelu_new`` (``gated-gelu``: NewGELUActivation,
  a composite of pow/tanh/mul) saves x, tanh(·), 0.5·x and 1 + tanh(·), then the gate product
  saves both factors (6·T·I); the dropout output is wo's input (its mask beside it);
- sublayer output dropout: one mask of T·H per sublayer, and per stack one for the embedding
  and one after the final norm.

The encoder's output is one tensor that every decoder block's cross-attention k and v read:
saved once (when k or v train or carry a LoRA), not per block.

BART (transformers 5.24 ``models/bart/modeling_bart.py``) differs where its blocks do: post
``nn.LayerNorm`` (each saves its input, the residual sum, and fp32 mean and rstd; its output is
the next sublayer's input), fused ``gelu`` (saves its input), its own dropout rates
(``dropout`` on sublayer outputs and the embedding, ``attention_dropout``, ``activation_dropout``),
no position bias (SDPA takes the flash kernel), no final norm, and each stack's
``layernorm_embedding`` recording its input only when the embedding's output needs a gradient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tuneplan.core.job.methods import targeted_linears, ties_head
from tuneplan.core.job.strategy import Attention, Checkpointing, Strategy
from tuneplan.core.memory.activations import (
    Shape,
    Widths,
    _lora_saved,
    first_norm_without_grad,
    norm_saved,
)
from tuneplan.core.models import LayerSpec, Linear, LinearRole, ModelSpec

#: transformers 5.24 ``T5Config.dropout_rate`` default (configuration_t5.py / _mt5.py).
T5_DROPOUT_DEFAULT = 0.1
_O = frozenset({"o", "out_proj"})
_FF_OUT = frozenset({"wo", "fc2"})


def _extra(model: ModelSpec, key: str, default: float) -> float:
    value = model.extra.get(key, default)
    return float(value) if isinstance(value, int | float) else default


def dropout_rate(model: ModelSpec) -> float:
    """The sublayer-output dropout: T5's ``dropout_rate`` (everywhere), BART's ``dropout``
    (the parsers keep them in ``extra``)."""
    if is_bart(model):
        return _extra(model, "dropout", 0.1)
    return _extra(model, "dropout_rate", T5_DROPOUT_DEFAULT)


def attention_dropout(model: ModelSpec) -> float:
    return _extra(model, "attention_dropout", 0.0) if is_bart(model) else dropout_rate(model)


def activation_dropout(model: ModelSpec) -> float:
    return _extra(model, "activation_dropout", 0.0) if is_bart(model) else dropout_rate(model)


def is_bart(model: ModelSpec) -> bool:
    """BART's post-LayerNorm blocks (else T5's pre-norm T5LayerNorm blocks)."""
    return model.model_type == "bart"


def forced_tie_note(model: ModelSpec, s: Strategy) -> str | None:
    """Why the estimate holds a tied head where the checkpoint has a separate one."""
    if not ties_head(model, s) or model.tie_word_embeddings:
        return None
    return (f"transformers {'.'.join(map(str, s.stack.transformers))} ties {model.name}'s "
            "lm_head to its shared embedding (T5Config forces tie_word_embeddings=True from "
            "5.0): the step holds and trains one V·H matrix, not the checkpoint's two")


def length_note(model: ModelSpec, s: Strategy) -> str | None:
    """The one-length assumption (and the checkpointing gap), in words."""
    if not model.is_encoder_decoder:
        return None
    note = (f"{model.name} is an encoder-decoder: source and target are both --seq-len "
            "tokens (encoder and decoder each run B·S tokens; cross attention S x S)")
    if s.checkpointing is not Checkpointing.NONE:
        note += ("; with checkpointing the estimate is held to the simulated T5 step within "
                 "3 % for full fine-tuning, and was 3 % under to 10 % over it for LoRA "
                 "(the recomputed block's transients are not fully modelled)")
    return note


def _short(lin: Linear) -> str:
    return lin.name.rsplit(".", 1)[-1]


def _norm(model: ModelSpec, t: int, w: Widths, trains: bool) -> int:
    """T5LayerNorm's own saved tensors (its output, the linear input, is counted apart);
    BART's nn.LayerNorm: its input (the residual sum) and the fp32 mean and rstd."""
    if is_bart(model):
        return norm_saved(model, t, w)
    h = model.hidden_size
    fp32_in = t * h * 4
    residual = 0 if w.residual == 4 else t * h * w.residual
    normalized = t * h * w.norm_out if trains else 0
    return fp32_in + residual + t * 4 + normalized


def _attention(model: ModelSpec, s: Strategy, w: Widths, shape: Shape, p: float,
               kind: str) -> int:
    """One attention's saved tensors without its linears' inputs (q/k/v outputs, scores)."""
    c, b = w.compute, shape.batch
    inner = model.num_heads * model.head_dim
    t_q, t_kv = b * shape.seq_q, b * shape.seq_kv
    scores = b * model.num_heads * shape.seq_q * shape.seq_kv
    qkv = (t_q + 2 * t_kv) * inner * c
    if s.attention is Attention.EAGER:
        drop = scores * (w.dropout_mask + c) if p > 0 else 0
        return qkv + scores * c + drop
    lse = b * model.num_heads * shape.seq_q * 4
    # T5's position bias is SDPA's float mask; BART has none (is_causal / no mask)
    mask = model.num_heads * shape.seq_q * shape.seq_kv * c if (
        kind != "cross" and not is_bart(model)) else 0
    return qkv + t_q * inner * c + lse + mask


def _mlp(model: ModelSpec, layer: LayerSpec, w: Widths, t: int, p: float) -> int:
    """Feed-forward tensors saved besides the wi inputs: activation internals, gate product
    factors, and with dropout its mask (wo's input, the dropout output, is counted apart)."""
    inter = model.intermediate_size
    gated = any(_short(lin) == "wi_0" for lin in layer.linears)
    act = model.hidden_act
    # NewGELUActivation's composite ops: 4; relu (its output) or fused gelu (its input): 1
    inside = 4 if act == "gelu_new" else 1
    saved = (inside + 2 if gated else inside) * t * inter * w.compute
    return saved + (t * inter * w.dropout_mask if p > 0 else 0)


def _shared_act_output(layer: LayerSpec, p: float) -> bool:
    """Without dropout a plain (relu) feed-forward's activation output is wo's input itself
    (``F.dropout`` with p = 0 returns its input), so it is saved once."""
    return p == 0 and model_act_saves_output(layer) and not any(
        _short(lin) == "wi_0" for lin in layer.linears)


def model_act_saves_output(layer: LayerSpec) -> bool:
    """T5's plain feed-forward (``wi``) is relu, which saves its output; BART's fc1 is gelu,
    which saves its input."""
    return any(_short(lin) == "wi" for lin in layer.linears)


def _group(lin: Linear) -> str:
    name = _short(lin)
    if lin.role is LinearRole.CROSS_ATTENTION:
        return "cross_o_in" if name in _O else "kv_in" if name in ("k", "v") else "cross_in"
    if lin.role is LinearRole.ATTENTION:
        return "o_in" if name in _O else "attn_in"
    return "down_in" if name in _FF_OUT else "mlp_in"


def _linear_inputs(model: ModelSpec, layer: LayerSpec, s: Strategy, w: Widths,
                   t: int) -> tuple[dict[str, int], bool]:
    """Inputs the block's linears save (its norms' outputs, o's and wo's inputs) and LoRA
    intermediates; second: whether a cross-attention k/v saves the encoder output."""
    h, inner, inter = model.hidden_size, model.num_heads * model.head_dim, model.intermediate_size
    targets = {id(lin) for lin in targeted_linears(model, s, layer)} if (
        s.method.is_lora) else set()
    out = {"linear_inputs_attn": 0, "linear_inputs_mlp": 0, "linear_inputs_down": 0,
           "adapters_attn": 0, "adapters_mlp": 0}
    width = {"attn_in": w.norm_out, "cross_in": w.norm_out, "mlp_in": w.norm_out,
             "kv_in": w.norm_out, "o_in": w.compute, "cross_o_in": w.compute,
             "down_in": w.compute}
    size = {"attn_in": h, "cross_in": h, "mlp_in": h, "kv_in": h, "o_in": inner,
            "cross_o_in": inner, "down_in": inter}
    read: set[str] = set()
    for lin in layer.linears:
        group = _group(lin)
        if s.method.trains_base:
            read.add(group)
        elif id(lin) in targets:
            side = "adapters_mlp" if lin.role is LinearRole.MLP else "adapters_attn"
            # PEFT lora.Linear: lora_A saves x (the tensor itself at equal widths, else a
            # cast copy per target) and lora_B the rank-r intermediate.
            out[side] += _lora_saved(lin, t, width[group], w, s, read, group)
    if s.attention is not Attention.EAGER:
        # SDPA's output is laid out (B, S, heads, d): o's input is a view of the output it
        # saves (counted with the attention), not a copy
        read -= {"o_in", "cross_o_in"}
    for group in read - {"kv_in"}:
        key = ("linear_inputs_down" if group == "down_in" else
               "linear_inputs_mlp" if group == "mlp_in" else "linear_inputs_attn")
        out[key] += t * size[group] * width[group]
    return out, "kv_in" in read


def block_saved(model: ModelSpec, layer: LayerSpec, s: Strategy, w: Widths, shape: Shape
                ) -> tuple[dict[str, int], bool]:
    """One T5 block's saved bytes by component, and whether it reads the encoder output."""
    t = shape.tokens
    p = dropout_rate(model)
    p_attn, p_act = attention_dropout(model), activation_dropout(model)
    cross = layer.kind == "decoder-cross"
    norms = (3 if cross else 2) * _norm(model, t, w, s.method.trains_base)
    attention = _attention(model, s, w, shape, p_attn, "self")
    cross_attention = _attention(model, s, w, shape, p_attn, "cross") if cross else 0
    sublayers = 3 if cross else 2
    masks = sublayers * t * model.hidden_size * w.dropout_mask if p > 0 else 0
    inputs, reads_encoder = _linear_inputs(model, layer, s, w, t)
    parts = {"norms": norms, "attention": attention, "cross_attention": cross_attention,
             "mlp": _mlp(model, layer, w, t, p_act), "mlp_tail": 0, "dropout_masks": masks}
    if inputs["linear_inputs_down"] and _shared_act_output(layer, p_act):
        parts["mlp"] -= t * model.intermediate_size * w.compute
    parts.update(inputs)
    if "relative_attention_bias" in layer.extra_params and s.method.trains_base:
        # the bucket lookup (S·S_kv int64 indices) that its embedding backward keeps
        parts["position_bias"] = shape.seq_q * shape.seq_kv * 8
    else:
        parts["position_bias"] = 0
    return parts, reads_encoder


def saved(model: ModelSpec, s: Strategy, w: Widths, shape: Shape) -> dict[str, int]:
    """Every block's saved bytes, summed by component, plus what each stack saves once: the
    encoder's final norm and output (read by every decoder block), the embeddings' dropout
    masks and, under SDPA, the cross attention's one all-zero position bias."""
    t, h = shape.tokens, model.hidden_size
    p = dropout_rate(model)
    total: dict[str, int] = {}
    reads_encoder = False
    for layer in model.layers:
        parts, reads = block_saved(model, layer, s, w, shape)
        reads_encoder = reads_encoder or reads
        for key, value in parts.items():
            total[key] = total.get(key, 0) + value * layer.count
    taken = first_norm_without_grad(model, s, w, shape)
    if is_bart(model):
        # no final norm or final dropout; each stack's layernorm_embedding records its input
        # only when something below it needs a gradient (the estimate takes ``taken`` off
        # for every model as if the first block's norm read the frozen embedding)
        once = taken + (0 if taken else 2 * norm_saved(model, t, w))
        once += 2 * t * h * w.dropout_mask if p > 0 else 0      # embedding dropouts
    else:
        once = _norm(model, t, w, s.method.trains_base)          # encoder final norm
        once += 4 * t * h * w.dropout_mask if p > 0 else 0       # embedding + final dropouts
        if s.attention is not Attention.EAGER:
            once += model.num_heads * shape.seq_q * shape.seq_kv * w.compute
        if taken:
            # Neither stack's first norm records anything when its input (the frozen
            # embedding's output) needs no gradient; the estimate takes ``taken`` off.
            once -= 2 * _norm(model, t, w, trains=False) - taken
    once += t * h * w.norm_out if reads_encoder else 0            # the encoder output
    total["stacks"] = once
    return total


def top_block(model: ModelSpec, s: Strategy, w: Widths, shape: Shape,
              keys: Iterable[str]) -> dict[str, int]:
    """The last decoder block's saved bytes (the first to run backward, and the largest),
    keyed like ``saved`` (``keys``)."""
    last = [layer for layer in model.layers if layer.kind == "decoder-cross"][-1]
    parts, _ = block_saved(model, dataclasses.replace(last, extra_params={}), s, w, shape)
    return {k: parts.get(k, 0) for k in keys}


def checkpoint_inputs(model: ModelSpec, s: Strategy, w: Widths, shape: Shape) -> int:
    """With checkpointing, what the T5 stacks keep beside the blocks' hidden states (measured
    live at the simulated step's peak): each stack's relative position bias (heads·S·S_kv,
    returned by its checkpointed first block and read by every other), the cross attention's
    all-zero bias (``requires_grad`` under checkpointing), the encoder output, the decoder's
    causal mask (eager: B·1·S·S), the bias buckets (S·S int64) when the bias trains, and the
    gradients the biases accumulate through the backward of every block (fp32 here)."""
    causal = shape.batch * shape.seq_q * shape.seq_kv * w.compute if (
        s.attention is Attention.EAGER) else 0
    if is_bart(model):   # no position bias: the encoder output and the causal mask
        return shape.tokens * model.hidden_size * w.norm_out + causal
    bias = model.num_heads * shape.seq_q * shape.seq_kv * w.compute
    trains = s.method.trains_base
    buckets = shape.seq_q * shape.seq_kv * 8 if trains else 0
    # two bias-sized gradients live in the decoder's backward (measured with LoRA as well as
    # full training; with full training one is the decoder bias's, one the zero cross bias's)
    grads = 2 * bias
    # three bias-sized tensors: the two stacks' bias lookups and the zero cross bias
    return 3 * bias + shape.tokens * model.hidden_size * w.residual + causal + buckets + grads
