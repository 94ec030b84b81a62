"""Logits and loss: the output head's saved input, the B·S·V logits, the fp32 upcast,
log-softmax and its gradients, for standard, chunked (torchtune) and fused (Unsloth) losses.

Returns terms for three moments: kept until backward, alive only at the loss forward, and
alive only at the start of backward. Sources: transformers ``ForCausalLMLoss`` (logits.float(),
cross_entropy saving the fp32 log-softmax), torchtune ``CEWithChunkedOutputLoss``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tuneplan.core.job.methods import outer_targets
from tuneplan.core.job.recipes import PrecisionPlan, Recipe
from tuneplan.core.job.strategy import Loss, Strategy, Task
from tuneplan.core.job.versions import hf_loss_layout, loss_follows_transformers
from tuneplan.core.memory import encoder
from tuneplan.core.memory.activations import Shape, Widths, norm_saved, outer_lora_saved
from tuneplan.core.memory.parts import Piece, part
from tuneplan.core.models import LinearRole, ModelSpec

_SRC = "transformers loss_utils.ForCausalLMLoss; torch log_softmax saves its fp32 output"


class LossMoments(NamedTuple):   # a tuple: made once per estimate, cheaply
    kept: tuple[Piece, ...]          # saved from the end of forward until backward starts
    forward_only: tuple[Piece, ...]  # alive only while the loss is computed
    backward_only: tuple[Piece, ...]  # gradients alive at the start of backward
    #: with a LoRA on the output head: all that is alive while the head adds its update to
    #: the base logits, before the loss runs (the head's own moment; empty otherwise)
    head: tuple[Piece, ...] = ()


def effective_loss(strategy: Strategy, plan: PrecisionPlan) -> Loss:
    if strategy.loss is not None:
        return strategy.loss
    return Loss.CHUNKED if plan.fused_loss_default or strategy.recipe is Recipe.TORCHTUNE \
        else Loss.STANDARD


def loss_moments(model: ModelSpec, strategy: Strategy, plan: PrecisionPlan, w: Widths,
                 shape: Shape, head_trains: bool, chunks: int) -> LossMoments:
    """Loss-side tensors at the end of forward and the start of backward (bytes), with a
    LoRA on the output head (``--lora-targets lm_head``) where there is one."""
    out = _loss_moments(model, strategy, plan, w, shape, head_trains, chunks)
    head = [lin for lin in outer_targets(model, strategy) if lin.role is LinearRole.OUTPUT_HEAD]
    if not head:
        return out
    lin, t = head[0], shape.tokens
    saved, shared = outer_lora_saved(lin, t, w.norm_out, w, strategy)
    kept = [part("activations/head_lora", saved, "LoRA on the output head: its input cast "
                 "(or dropout mask and output) T·H·bytes + A's output T·r·bytes",
                 "peft lora.Linear.forward", tokens=t, rank=strategy.lora_rank)]
    if shared and not head_trains:
        kept.append(part("activations/head_input", t * model.hidden_size * w.norm_out,
                         "output head input T·H·bytes (saved by its LoRA A)", tokens=t))
    inner = w.compute if w.autocast else w.adapter
    cast = t * lin.in_features * w.adapter if (w.autocast and w.norm_out != w.adapter) else 0
    # result = base_layer(x) + lora_B(lora_A(x)) * scaling: the base logits, the scaled
    # update and their sum are alive together; then the two addends are freed (the sum is the
    # logits the loss reads), so this moment comes before the loss, not on top of it.
    cl = _logit_bytes(plan, w, head_trains)
    before_loss = [p for p in out.kept if p.path in ("activations/final_norm",
                                                     "activations/head_input")]
    head_moment = (*before_loss, *kept,
                   part("logits/head_base", t * lin.out_features * cl,
                        "base head output T·V·logit_bytes", "peft lora.Linear.forward",
                        tokens=t, vocab=lin.out_features),
                   part("logits/head_lora_update", t * lin.out_features * inner + cast,
                        "scaled LoRA update T·V·bytes (+ the input cast T·H·bytes)",
                        "peft lora.Linear.forward", tokens=t, vocab=lin.out_features),
                   part("logits/head_sum", t * lin.out_features * cl,
                        "their sum, the logits T·V·logit_bytes", "peft lora.Linear.forward",
                        tokens=t, vocab=lin.out_features))
    return LossMoments(kept=(*out.kept, *kept), forward_only=out.forward_only,
                       backward_only=out.backward_only, head=head_moment)


def _logit_bytes(plan: PrecisionPlan, w: Widths, head_trains: bool) -> int:
    """Width of the logits: the compute dtype under autocast, else the head weight's."""
    return w.compute if w.autocast else (4 if plan.kbit_upcast else (
        plan.trainable_weight_bytes if head_trains else plan.frozen_weight_bytes))


def _loss_moments(model: ModelSpec, strategy: Strategy, plan: PrecisionPlan, w: Widths,
                  shape: Shape, head_trains: bool, chunks: int) -> LossMoments:
    t, v = shape.tokens, model.vocab_size
    if model.is_encoder_only:   # post-LN, no final norm; the head reads the first token
        head_input, scores = encoder.head_terms(model, strategy, w, shape)
        return LossMoments(kept=(head_input,), forward_only=(scores,), backward_only=())
    final = 0 if model.is_encoder_decoder and not model.final_norm_params else (
        norm_saved(model, t, w))   # BART has no final norm
    kept = [part("activations/final_norm", final,
                 "final norm: fp32 input T·H·4 + rsqrt T·4 (+ normalized if it trains)",
                 tokens=t, hidden=model.hidden_size)]
    if head_trains:
        width = w.compute if w.autocast else w.norm_out
        kept.append(part("activations/head_input", t * model.hidden_size * width,
                         "output head input T·H·bytes (its weight trains)", tokens=t))
    if strategy.task is Task.SEQ_CLS:
        logits = t * strategy.num_labels * 4
        return LossMoments(kept=tuple(kept), forward_only=(part(
            "logits/scores", logits, "T·labels·4", tokens=t),), backward_only=())
    cl = _logit_bytes(plan, w, head_trains)
    ins: dict[str, Any] = {"tokens": t, "vocab": v, "logit_bytes": cl}
    loss = effective_loss(strategy, plan)
    if loss is Loss.CHUNKED and strategy.recipe is Recipe.UNSLOTH:
        # Unsloth's fused CE keeps the logits for an in-place backward and a T-sized logsumexp.
        kept.append(part("logits/logits", t * v * cl, "T·V·logit_bytes, reused in place in "
                         "backward", "unsloth fast_cross_entropy_loss", **ins))
        return LossMoments(kept=tuple(kept), forward_only=(), backward_only=())
    if loss is Loss.CHUNKED:
        return _chunked(kept, t, v, cl, chunks, ins)
    if model.is_encoder_decoder:
        return _seq2seq(kept, t, v, cl, w.autocast, ins)
    layout = hf_loss_layout(strategy) if loss_follows_transformers(strategy) else "pad-labels"
    if layout != "pad-labels":
        return _shifted(kept, t, shape.batch * (shape.seq_q - 1) * v, v, cl, w.autocast,
                        layout, ins)
    return _standard(kept, t, v, cl, ins)


def _seq2seq(kept: list[Piece], t: int, v: int, cl: int, autocast: bool,
             ins: dict[str, Any]) -> LossMoments:
    """T5ForConditionalGeneration (transformers 5.24): ``CrossEntropyLoss`` on the lm_head's
    logits as they are, no ``.float()`` (its decoder labels are not shifted either), so
    without autocast the log-softmax is kept in the logits' dtype; autocast runs it in fp32."""
    src = "transformers T5ForConditionalGeneration.forward (CrossEntropyLoss, no upcast)"
    width = 4 if autocast else cl
    kept.append(part("logits/log_softmax", t * v * width,
                     "log-softmax saved by cross_entropy T·V·bytes", src, **ins))
    fwd = (part("logits/logits", t * v * cl, "T·V·logit_bytes, held by the model output", src,
                **ins),
           part("logits/upcast", t * v * 4 if autocast and cl != 4 else 0,
                "autocast's fp32 copy of the logits T·V·4", src, **ins))
    bwd = (part("logits/loss_grads", 2 * t * v * width,
                "nll_loss and log_softmax gradients 2·T·V·bytes (logits freed: output dropped)",
                src, **ins),)
    return LossMoments(kept=tuple(kept), forward_only=fwd, backward_only=bwd)


def _chunked(kept: list[Piece], t: int, v: int, cl: int, chunks: int,
             ins: dict[str, Any]) -> LossMoments:
    """Chunked/fused CE (torchtune CEWithChunkedOutputLoss under torch.compile, Liger): the
    compute-dtype logits are kept and each chunk's fp32 softmax is recomputed in backward,
    so only one chunk of fp32 work is alive at a time."""
    chunk = -(-t // chunks) * v
    kept.append(part("logits/logits", t * v * cl, "T·V·logit_bytes kept for the chunked "
                     "backward", "torchtune CEWithChunkedOutputLoss; Liger fused CE", **ins))
    fwd = (part("logits/chunk_fp32", 2 * chunk * 4, "one chunk's fp32 upcast + log-softmax "
                "2·⌈T/chunks⌉·V·4", **ins, chunks=chunks),)
    bwd = (part("logits/chunk_grads", 2 * chunk * 4 + chunk * cl,
                "one chunk's fp32 gradients + its logits gradient", **ins, chunks=chunks),)
    return LossMoments(kept=tuple(kept), forward_only=fwd, backward_only=bwd)


def _standard(kept: list[Piece], t: int, v: int, cl: int, ins: dict[str, Any]) -> LossMoments:
    """transformers ForCausalLMLoss: logits.float(), cross_entropy saving the fp32 log-softmax;
    the output object is dropped before backward (``model(...).loss.backward()``)."""
    fp32 = t * v * 4
    kept.append(part("logits/log_softmax", fp32, "fp32 log-softmax saved by cross_entropy T·V·4",
                     _SRC, **ins))
    fwd = (part("logits/logits", t * v * cl, "T·V·logit_bytes, held by the model output", _SRC,
                **ins),
           part("logits/upcast", fp32 if cl != 4 else 0,
                "logits.float() copy T·V·4 when logits are not fp32", _SRC, **ins))
    bwd = (part("logits/loss_grads", 2 * fp32,
                "nll_loss and log_softmax gradients 2·T·V·4 (logits freed: output dropped)",
                _SRC, **ins),)
    return LossMoments(kept=tuple(kept), forward_only=fwd, backward_only=bwd)


def _shifted(kept: list[Piece], t: int, shifted: int, v: int, cl: int, autocast: bool,
             layout: str, ins: dict[str, Any]) -> LossMoments:
    """transformers before 4.49 (``versions.HF_LOSS_LAYOUTS``): cross_entropy runs on a shifted
    copy of ``shifted`` = B·(S-1)·V logits. Up to 4.30 the copy is of the compute-dtype logits
    and autocast casts it to fp32 (without autocast the loss stays in that dtype); 4.31 to 4.45
    the model's fp32 logits replace its own; 4.46 to 4.48 both are alive."""
    src = f"transformers LlamaForCausalLM.forward / ForCausalLMLoss ({layout})"
    width = 4 if autocast or cl == 4 else cl
    kept.append(part("logits/log_softmax", shifted * width,
                     "log-softmax of the shifted logits saved by cross_entropy B·(S-1)·V·bytes",
                     src, **ins))
    if layout == "shift-then-cast":
        fwd = (part("logits/logits", t * v * cl, "T·V·logit_bytes, held by the model output",
                    src, **ins),
               part("logits/shift_copy", shifted * cl,
                    "logits[..., :-1, :].contiguous() B·(S-1)·V·logit_bytes", src, **ins),
               part("logits/upcast", shifted * 4 if width == 4 and cl != 4 else 0,
                    "autocast's fp32 cast of the shifted copy B·(S-1)·V·4", src, **ins))
    else:
        both = layout == "loss-float-shift" and cl != 4
        fwd = (part("logits/logits", t * v * (cl if both else 4),
                    "T·V·logit_bytes held by the model output" if both else
                    "the model's fp32 logits (logits.float() replaced its own) T·V·4", src,
                    **ins),
               part("logits/upcast", t * v * 4 if both else 0,
                    "ForCausalLMLoss logits.float() T·V·4", src, **ins),
               part("logits/shift_copy", shifted * 4,
                    "logits[..., :-1, :].contiguous() of the fp32 logits B·(S-1)·V·4", src,
                    **ins))
    bwd = (part("logits/loss_grads", 2 * shifted * width,
                "nll_loss and log_softmax gradients 2·B·(S-1)·V·bytes (logits freed: output "
                "dropped)", src, **ins),)
    return LossMoments(kept=tuple(kept), forward_only=fwd, backward_only=bwd)
