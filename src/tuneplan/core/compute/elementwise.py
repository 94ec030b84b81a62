"""Bytes the memory-bound elementwise kernels of a training step move, per token (or per
parameter for the weight casts), forward and backward: norms, rotary embedding, the MLP
activation, residual adds, dropout and the casts of mixed precision. Pure.

Each op's bytes are the reads and writes of the kernels eager PyTorch launches for it, at
the widths the memory model already knows (``core.memory.activations.widths``: residual
stream, norm output, compute, MLP and adapter widths; the dropout mask's width from
``MemoryAssumptions``): one place per fact. The step model times them as bytes / (HBM
bandwidth x ``elementwise_bandwidth_efficiency``), the share the other memory-bound kernels
use (``core.compute.step``).

Sources (transformers 5 / PEFT 0.21 as installed):
- RMSNorm: ``LlamaRMSNorm.forward`` (models/llama/modeling_llama.py): ``x.to(float32)``,
  ``pow(2).mean(-1)``, ``x * rsqrt(var + eps)``, ``.to(input_dtype)``, ``weight *``;
  backward is autograd of those five ops.
- LayerNorm: ``torch.nn.functional.layer_norm`` (one fused ``native_layer_norm`` kernel; in
  autocast's fp32 list, so its input is cast to fp32 first); backward: one kernel for the
  input's gradient, one for gamma/beta.
- Rotary: ``apply_rotary_pos_emb`` (modeling_llama.py): ``q * cos + rotate_half(q) * sin``
  for q and k; ``rotate_half`` is a slice, a negation and a ``cat``.
- Activation: ``LlamaMLP`` ``act_fn(gate_proj(x)) * up_proj(x)`` (one SiLU kernel, one mul);
  a plain MLP one activation kernel (GELU/ReLU).
- Residual adds: two per block (``hidden_states = residual + hidden_states``); in backward
  autograd sums the skip's and the branch's gradients, one add each.
- Dropout: PEFT ``lora.Linear.forward``'s ``dropout(x)`` per adapted linear when
  ``--lora-dropout`` > 0 (``native_dropout`` writes its output and a bool mask); T5's
  ``dropout_rate`` on its three residual branches per block.
- Adapter output: PEFT ``lora.Linear.forward``'s ``result + lora_B(lora_A(x)) * scaling``
  (LoRA, QLoRA, LoRA on int8): the scale and the add around the frozen GEMM, and in backward
  the scaled gradient and the sum of the input's two gradients.
- Casts: PEFT's ``_cast_input_dtype(x, lora_A.weight.dtype)`` (tuners_utils.py) upcasts each
  adapted linear's input to the fp32 adapter and autocast casts it back for the GEMM; under
  autocast an fp32 weight is cast to the compute dtype once per forward (autocast's cache
  lives inside the autocast region: a recompute casts again) and its gradient cast back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneplan.core.compute.unsloth import fast_path
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Checkpointing, Strategy
from tuneplan.core.models import MlpKind, NormKind

if TYPE_CHECKING:
    from tuneplan.core.compute.throughput import ModelShape

#: Model types whose positions are not rotary (learned, relative bias or ALiBi).
NO_ROTARY_TYPES = frozenset({"gpt2", "bert", "roberta", "distilbert", "opt", "t5", "mt5",
                             "umt5", "bloom", "mpt", "gpt_bigcode", "xlm-roberta",
                             "deberta", "deberta-v2", "electra", "bart", "mbart"})


@dataclass(frozen=True, slots=True)
class OpBytes:
    """One elementwise op of a micro-batch: bytes per forward and per backward, in all layers
    (``count`` units of ``per_unit`` elements each: tokens, or parameters for weight casts)."""

    name: str
    forward: float        # bytes per unit, one forward pass, all layers
    backward: float       # bytes per unit, the backward, all layers
    per: str              # "token" or "micro-batch" (weight casts: independent of tokens)
    formula: str
    source: str
    # the op's own input and output only (first read, last write of its kernel chain): what
    # reaches DRAM when its intermediates stay in the L2 cache; and the bytes per token of
    # the largest intermediate one kernel writes and the next rereads (whether it fits)
    boundary_forward: float = 0.0
    boundary_backward: float = 0.0
    working_set: float = 0.0
    # an op of the adapters' own path (PEFT's lora.Linear around the frozen GEMM), which a
    # full fine-tune does not run: timed at ``adapter_exposed_share``, not the generic share
    adapter: bool = False


def _cast(a: int, b: int) -> int:
    """Bytes per element of ``.to()`` from width a to width b: nothing when they match."""
    return 0 if a == b else a + b


def elementwise_ops(model: ModelShape, s: Strategy) -> list[OpBytes]:
    """The elementwise ops of one micro-batch with their bytes (see the module docstring)."""
    from tuneplan.core.compute.throughput import adapted_linears
    from tuneplan.core.job.recipes import precision_plan
    from tuneplan.core.memory.activations import widths
    from tuneplan.core.memory.assumptions import MemoryAssumptions

    spec = model.spec
    plan = precision_plan(s)
    w = widths(s, plan, MemoryAssumptions().dropout_mask_bytes)
    h, r, n, c, m = model.hidden_size, w.residual, w.norm_out, w.compute, w.mlp
    layers = model.num_layers
    norms = 2 * layers + 1        # two per block and the final norm
    ops: list[OpBytes] = []
    if spec.norm_kind is NormKind.RMSNORM:
        up = _cast(r, 4)
        fwd = up + 8 + 4 + 8 + _cast(4, r) + r + n
        bwd = (2 * r + n) + _cast(r, 4) + 8 + 8 + 8 + 12 + _cast(4, r) + (
            n + r if w.norm_trains else 0)
        ops.append(OpBytes("norms", norms * h * fwd, norms * h * bwd, "token",
                           f"{norms} RMSNorms x hidden x ({fwd} B forward, {bwd} B backward)",
                           "LlamaRMSNorm: fp32 upcast, pow, mean, x*rsqrt, cast back, weight "
                           "mul (transformers modeling_llama.py); backward: autograd of each",
                           boundary_forward=norms * h * (r + n),
                           boundary_backward=norms * h * (n + 4 + r),
                           working_set=h * 4))
    else:
        x = 4 if w.autocast else r
        cast = _cast(r, 4) if w.autocast else 0
        fwd = cast + x + n
        bwd = cast + 2 * (n + x) + x
        ops.append(OpBytes("norms", norms * h * fwd, norms * h * bwd, "token",
                           f"{norms} LayerNorms x hidden x ({fwd} B forward, {bwd} B backward)",
                           "native_layer_norm (fp32 under autocast): read x, write y; "
                           "backward: input-gradient and gamma/beta kernels",
                           boundary_forward=norms * h * (r + n),
                           boundary_backward=norms * h * (n + x + r),
                           working_set=h * x))
    if spec.model_type not in NO_ROTARY_TYPES and not spec.is_encoder_decoder:
        rotated = (spec.num_heads + spec.num_kv_heads) * spec.head_dim
        ops.append(OpBytes("rotary", layers * rotated * 10 * c, layers * rotated * 8 * c,
                           "token", "layers x (heads + kv heads) x head_dim x (10, 8) x "
                                    "compute bytes",
                           "apply_rotary_pos_emb: q*cos (3), rotate_half's neg (1) and cat "
                           "(2), *sin (2), add (3) minus the shared read = 10 per element; "
                           "backward: two muls, neg, the sum of both paths = 8",
                           boundary_forward=layers * rotated * 2 * c,
                           boundary_backward=layers * rotated * 2 * c,
                           working_set=rotated * c))
    inter = 0.0
    for layer in spec.layers:
        if layer.num_experts:
            width = spec.moe_intermediate_size or spec.intermediate_size
            inter += layer.count * layer.experts_per_token * width
        else:
            inter += layer.count * spec.intermediate_size
    if spec.mlp_kind is MlpKind.GATED:
        ops.append(OpBytes("activation", inter * 5 * m, inter * 9 * m, "token",
                           "intermediate x layers x (5, 9) x MLP bytes",
                           "act_fn(gate) * up: SiLU read+write (2), mul read 2 write 1 (3); "
                           "backward: the mul's two gradients (6), silu_backward (3)",
                           boundary_forward=inter * 3 * m, boundary_backward=inter * 5 * m,
                           working_set=inter / max(layers, 1) * m))
    else:
        ops.append(OpBytes("activation", inter * 2 * m, inter * 3 * m, "token",
                           "intermediate x layers x (2, 3) x MLP bytes",
                           "one activation kernel (GELU/ReLU): read, write; backward reads "
                           "the gradient and the input, writes one",
                           boundary_forward=inter * 2 * m, boundary_backward=inter * 3 * m,
                           working_set=inter / max(layers, 1) * m))
    ops.append(OpBytes("residual-adds", layers * 2 * 3 * h * r, layers * 2 * 3 * h * r,
                       "token", "layers x 2 adds x 3 x hidden x residual bytes",
                       "residual + branch (read 2, write 1); backward: autograd sums the "
                       "skip's and the branch's gradients",
                       boundary_forward=layers * 2 * 3 * h * r,
                       boundary_backward=layers * 2 * 3 * h * r, working_set=h * r))
    adapted = adapted_linears(model, s)
    a = w.adapter
    lora_in = sum(lin.in_features * lin.modules for lin in adapted)
    drop_fwd = drop_bwd = 0.0
    if s.lora_dropout > 0 and adapted:
        drop_fwd += lora_in * (2 * a + w.dropout_mask)
        drop_bwd += lora_in * (2 * a + w.dropout_mask)
    rate = float(spec.extra.get("dropout_rate", 0.0) or 0.0)
    if rate > 0:
        drop_fwd += layers * 3 * h * (2 * r + w.dropout_mask)
        drop_bwd += layers * 3 * h * (2 * r + w.dropout_mask)
    # unsloth's matmul_lora (kernels/utils.py) folds the scale and add into
    # out.addmm_(XA, B, alpha=s): no such kernels on its fast path
    lora_out = sum(lin.out_features * lin.modules for lin in adapted)
    if lora_out and s.method in ADAPTER_OUTPUT_METHODS and not fast_path(model, s):
        fwd, bwd = lora_out * 5 * c, lora_out * 2 * c + lora_in * 3 * c
        ops.append(OpBytes("adapter-output", fwd, bwd, "token",
                           "adapted outputs x 5 x compute bytes forward; outputs x 2 + "
                           "inputs x 3 x compute bytes backward",
                           "PEFT lora.Linear.forward: result + lora_B(lora_A(x)) * scaling: "
                           "the scale (read, write) and the add into the frozen GEMM's output "
                           "(read 2, write 1); backward: the gradient times the scale (read, "
                           "write) and autograd's sum of the input's two gradients, the frozen "
                           "GEMM's and lora_A's (read 2, write 1); torchtune LoRALinear and "
                           "LitGPT LoRALinear run the same ops",
                           boundary_forward=fwd, boundary_backward=bwd,
                           working_set=max((lin.out_features for lin in adapted), default=0)
                           * c, adapter=True))
    if drop_fwd:
        ops.append(OpBytes("dropout", drop_fwd, drop_bwd, "token",
                           "dropped elements x (read + write + mask), each way",
                           "native_dropout: writes its output and a bool mask; backward "
                           "reads the gradient and the mask (PEFT lora dropout; T5 "
                           "dropout_rate)", boundary_forward=drop_fwd,
                           boundary_backward=drop_bwd, working_set=drop_fwd / layers,
                           adapter=rate <= 0))
    cast_tok = 0.0
    if w.autocast and adapted and a != c:
        cast_tok = lora_in * (_cast(c, a) + _cast(a, c))
    if cast_tok:
        ops.append(OpBytes("mixed-precision-casts", cast_tok, cast_tok, "token",
                           "adapted inputs x (c->fp32 + fp32->c)",
                           "PEFT _cast_input_dtype upcasts each adapted linear's input to "
                           "the fp32 adapter; autocast casts it back for lora_A",
                           boundary_forward=lora_in * 2 * c, boundary_backward=lora_in * 2 * c,
                           working_set=max((lin.in_features for lin in adapted), default=0)
                           * a, adapter=True))
    if w.autocast and plan.trainable_weight_bytes == 4 and s.method.trains_base:
        weights = model.stored_block_params + model.vocab_size * model.hidden_size
        per = _cast(4, c)
        ops.append(OpBytes("weight-casts", weights * per, weights * per, "micro-batch",
                           f"matmul weights x {per} B per forward, {per} B backward",
                           "autocast casts each fp32 weight to the compute dtype per forward "
                           "(its cache is cleared on leaving autocast); the weight gradient "
                           "is cast back to fp32", boundary_forward=weights * per,
                           boundary_backward=weights * per))
    return ops


#: Methods whose adapted linears run PEFT's ``lora.Linear`` forward (scale and add around the
#: frozen GEMM); DoRA's magnitude path and the other tuners' layers are their own.
ADAPTER_OUTPUT_METHODS = frozenset({Method.LORA, Method.QLORA, Method.LORA8BIT})


def forward_passes(s: Strategy) -> int:
    """Forwards per micro-batch: a recomputed one under activation checkpointing."""
    return 1 if s.checkpointing is Checkpointing.NONE else 2
