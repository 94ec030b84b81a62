"""torchtune's memory layout (``--recipe torchtune``): the moments of torchtune 0.6.1's step.

Read from torchtune v0.6.1 ``recipes/{lora,full}_finetune_single_device.py`` (``_loss_step``,
``train``), ``modules/{transformer,attention,rms_norm,feed_forward}.py``,
``modules/peft/lora.py``, ``modules/loss/ce_chunked_output_loss.py`` and
``models/llama3_1/_position_embeddings.py``, held to the simulation of that code
(``adapters/probe/torchtune_step.py``). What differs from the HF/PEFT layout:

- one dtype for everything (``training.set_default_dtype``): no autocast, no fp32 masters,
  LoRA A/B and AdamW states in the recipe dtype (``core.job.recipes``).
- RMSNorm runs ``F.rms_norm(x.float(), ...).to(x.dtype)``: it saves an fp32 input and the
  rstd (T·4), and the fp32 normalized tensor when its scale trains.
- RoPE multiplies by a fp32 cache buffer (``max_seq_len``·head_dim·4, built once at the
  builder's ``max_seq_len``); its fp32 products are not saved.
- GQA k/v ``expand(...).flatten`` copies to every head, saved by SDPA with q, the output and
  the fp32 logsumexp.
- ``LoRALinear``: ``lora_a`` saves its input (shared with a trained base's), ``lora_b`` the
  T·r output of ``lora_a``; a frozen base saves nothing.
- The model returns 8 logits chunks (``set_num_output_chunks``): all T·V in the compute dtype
  exist before the loss; ``CEWithChunkedOutputLoss`` upcasts each chunk (a copy unless fp32)
  and saves its fp32 log-softmax; ``del logits`` frees the compute-dtype chunks before backward.
  ``--loss standard``: ``output(h).float()`` and ``nn.CrossEntropyLoss`` on the whole T·V.
- ``--packing``: the packed batch's ``input_pos`` (B×S, int64) reaches every RoPE call, which
  then gathers ``cache[input_pos]`` (a new fp32 T·head_dim tensor instead of a view of the
  cache), saved by its products wherever q or k needs a gradient. Flex attention over the
  packed ``BlockMask`` (CUDA) saves what SDPA saves; the BlockMask's block tables are not
  counted.
- ``--offload-activations`` (LoRA; ``enable_activation_offloading`` with checkpointing, the
  recipe's ``get_act_offloading_ctx_manager``): every layer input goes to the host; the
  forward stash keeps the newest ``OFFLOAD_STASH`` offloads' device copies (the final norm's
  four and one layer input) until backward starts; the output projection's saved input stays
  (``NoOpManager``); in backward each brought-back tensor lives until the next node that
  brings one back has run, so a layer reruns beside the input of the layer above it (the top
  layer beside the final norm's fp32 input). Full fine-tuning offloaded is not modelled here.
- ``--method qlora`` (``quantize_base=True``: every block linear a torchao ``NF4Tensor``, the
  embedding and a tied head in the recipe dtype; ``--quant nf4 --double-quant`` only):
  ``LinearNF4`` saves only its weight, and eagerly each ``weight.to(bf16)`` unpacks the nibbles
  as int64 (``nf4_dequant_bytes``: 14 bytes a parameter of the weight at hand), which sets the
  rerun's (and the top layer's) peak at down_proj; compiled, inductor fuses it away, and the
  compiled partitioner's saved set of an NF4 layer is modelled only under checkpointing.
- ``--compile`` (``training.compile_model``, per layer, before checkpointing wraps it;
  ``compile_loss``): each layer saves the min-cut partitioner's set (``_compiled_saved``), the
  compiled cross-entropy keeps its input (every chunk, or the fp32 logits) and two fp32
  values per row. Held to the simulation at the end of forward (the state backward starts
  from); transients inside compiled graphs are counted as inductor's fused kernels leave them
  (a kernel's output, no pointwise intermediates), which the simulation, running the
  partitioned graphs eagerly, bounds from above. The full recipe drops the compiled standard
  loss (``training.compile_loss(self._loss_fn)``, the result unused): it runs eagerly there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.strategy import (
    Attention,
    Checkpointing,
    Loss,
    Precision,
    Sharding,
    Strategy,
    Task,
)
from tuneplan.core.memory.dims import BlockDims, block_dims
from tuneplan.core.memory.parts import Item, part
from tuneplan.core.models import MlpKind, ModelSpec, NormKind

SOURCE = "torchtune 0.6.1 recipes + modules (transformer, attention, rms_norm, peft/lora, loss)"
NF4_SOURCE = "torchao 0.16 dtypes/nf4tensor.py (LinearNF4, NF4Tensor.get_original_weight)"
OFFLOAD_SOURCE = ("torchtune 0.6.1 training/_activation_offloading.py (OffloadActivations, "
                  "get_act_offloading_ctx_manager)")
COMPILE_SOURCE = ("torchtune 0.6.1 training/_compile.py (compile_model per layer, compile_loss) "
                  "+ torch 2.13 inductor decompositions and min-cut partitioner")
#: torchtune ``CEWithChunkedOutputLoss(num_output_chunks=8)`` (modules/loss, the default).
OUTPUT_CHUNKS = 8
#: torchtune ``OffloadActivations()`` defaults (training/_activation_offloading.py):
#: ``max_fwd_stash_size``, the offloaded tensors whose device copy stays alive behind the
#: newest offload.
OFFLOAD_STASH = 5
#: torchtune's LoRA builders: ``apply_lora_to_mlp`` adapts w1, w2 and w3 together.
MLP_TARGETS = frozenset({"gate_proj", "up_proj", "down_proj"})
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def qlora_quant_problem(s: Strategy) -> str | None:
    """Why a QLoRA job's quantization is not torchtune's (torchao NF4 with its block scales
    quantized again: ``to_nf4``'s ``scaler_block_size``), or None: the layout and the
    simulation refuse the same."""
    if s.method is Method.QLORA and (s.quant is not Quant.NF4 or not s.double_quant):
        return (f"--quant {s.quant}{'' if s.double_quant else ' --no-double-quant'} "
                "(torchtune's QLoRA is torchao NF4, its block scales quantized again: "
                "--quant nf4 --double-quant)")
    return None


def uncovered(model: ModelSpec, s: Strategy) -> str | None:
    """Why this job falls outside the modelled torchtune layout, or None when inside."""
    lora = s.method.is_lora
    quant = qlora_quant_problem(s)
    checks = [
        (model.model_type != "llama" or model.norm_kind is not NormKind.RMSNORM
         or model.mlp_kind is not MlpKind.GATED or model.num_experts > 0 or model.head_bias,
         f"{model.model_type} is not a llama-3-style dense decoder"),
        (model.head_dim * model.num_heads != model.hidden_size,
         "head_dim other than hidden / heads (torchtune's llama-3 builders)"),
        (s.method not in (Method.FULL, Method.LORA, Method.QLORA), f"--method {s.method}"),
        (quant is not None, quant or ""),
        # what the min-cut partitioner keeps of an NF4 layer (its dequantized weights among
        # it) is not modelled; under checkpointing nothing of a layer is kept
        (s.method is Method.QLORA and s.compile and s.checkpointing is Checkpointing.NONE,
         "--compile with qlora without checkpointing"),
        (s.task is not Task.CAUSAL_LM, f"--task {s.task}"),
        (s.precision not in (Precision.BF16, Precision.FP32),
         f"--precision {s.precision} (torchtune trains in one dtype)"),
        (s.attention is Attention.EAGER, "--attention eager (torchtune runs SDPA)"),
        (s.world_size > 1 or s.sharding is not Sharding.DDP, "more than one GPU or sharding"),
        (s.grad_accum > 1, "--grad-accum > 1"),
        (s.optimizer_in_backward, "--optimizer-in-backward"),
        (s.checkpointing is Checkpointing.OFFLOAD and not lora,
         f"--offload-activations with --method {s.method} (modelled for LoRA: a full "
         "fine-tune's backward peaks where its gradients and the brought-back inputs meet)"),
        (bool(s.trainable_modules), "--trainable-modules"),
        (lora and s.lora_dropout > 0, "LoRA dropout"),
        (lora and not s.all_linear and "lm_head" in s.lora_targets, "LoRA on the output"),
        (lora and not s.all_linear and 0 < len(MLP_TARGETS & set(s.lora_targets)) < 3,
         "LoRA on part of the MLP (apply_lora_to_mlp wraps w1, w2 and w3 together)"),
    ]
    return next((why for bad, why in checks if bad), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Dims(BlockDims):
    full: bool
    rank: int
    attn: tuple[bool, bool, bool, bool]   # LoRA on q, k, v, output_proj
    mlp: bool
    packed: bool    # input_pos given: each RoPE call gathers its own fp32 T·head_dim cache
    compiled: bool  # --compile: each layer's saved set is the min-cut partitioner's
    nf4: bool       # qlora: every block linear a torchao NF4Tensor


def _dims(model: ModelSpec, s: Strategy) -> _Dims:
    lora = s.method.is_lora
    names = set(_ATTN) if s.all_linear else set(s.lora_targets)
    attn = tuple(lora and n in names for n in _ATTN)
    return _Dims(**block_dims(model, s), full=s.method.trains_base, rank=s.lora_rank,
                 attn=(attn[0], attn[1], attn[2], attn[3]),
                 mlp=lora and (s.all_linear or bool(MLP_TARGETS & names)), packed=s.packing,
                 compiled=s.compile, nf4=s.method is Method.QLORA)


def rope_gathers(d: _Dims, *, q: bool = True, k: bool = True) -> int:
    """Packed rows: ``cache[input_pos]`` (T·head_dim·4, fp32) for the q and the k call, each
    saved by its products when that side needs a gradient; 0 unpacked (a view of the cache)."""
    return (int(q) + int(k)) * d.t * (d.qd // d.heads) * 4 if d.packed else 0


def norm_saved(d: _Dims) -> int:
    """RMSNorm: the fp32 input and rstd, and the fp32 normalized tensor if the scale trains."""
    return d.t * d.h * 4 + d.t * 4 + (d.t * d.h * 4 if d.full else 0)


def block_saved(d: _Dims) -> dict[str, int]:
    """One layer's tensors kept for backward (no checkpointing), by component."""
    t, c = d.t, d.c
    q, k, v, _ = d.attn
    adapters = sum(d.attn) + (3 if d.mlp else 0)
    if d.compiled:
        return _compiled_saved(d, adapters)
    return {
        "norms": 2 * norm_saved(d),
        # the norm outputs read by lora_a (and a trained base): one tensor each side
        "linear_inputs": (t * d.h * c if d.full or q or k or v else 0)
        + (t * d.h * c if d.full or d.mlp else 0),
        # q, the expanded k and v, the output (also output_proj's input) + fp32 logsumexp
        "attention": 4 * t * d.qd * c + d.b * d.heads * d.s * 4,
        # w1's output (silu input), silu's output, w3's output; their product if w2 saves it
        "mlp": 3 * t * d.inter * c + (t * d.inter * c if d.full or d.mlp else 0),
        "lora": adapters * t * d.rank * c,
        "rope": rope_gathers(d),
    }


def _compiled_saved(d: _Dims, adapters: int) -> dict[str, int]:
    """A compiled layer's saved set (``--compile``: torchtune's ``compile_model`` compiles
    each layer; inductor's decompositions, joint-graph passes and min-cut partitioner, read
    off the partitioned forward graph's outputs under torch 2.13): the layer's input and the
    two rstd, from which both norms (and their fp32 casts) are recomputed; the normed
    inputs of trained or adapted linears; q, the expanded k and v, the attention output and
    its fp32 logsumexp; the residual after attention; w1's and w3's outputs (silu is
    recomputed) and their product where w2 trains or is adapted; the LoRA A outputs. RoPE is
    recomputed from the cache (and ``input_pos``): nothing of it is saved."""
    t, c = d.t, d.c
    q, k, v, _ = d.attn
    return {
        "norms": t * d.h * c + 2 * t * 4,
        "linear_inputs": (t * d.h * c if d.full or q or k or v else 0)
        + (t * d.h * c if d.full or d.mlp else 0),
        "attention": 4 * t * d.qd * c + d.b * d.heads * d.s * 4,
        "residual": t * d.h * c,
        "mlp": 2 * t * d.inter * c + (t * d.inter * c if d.full or d.mlp else 0),
        "lora": adapters * t * d.rank * c,
    }


def _chunk_rows(d: _Dims) -> list[int]:
    """Rows (B · positions) of each logits chunk: ``Tensor.chunk(8, dim=1)`` sizes."""
    size = -(-d.s // OUTPUT_CHUNKS)
    lens = [min(size, d.s - i) for i in range(0, d.s, size)]
    return [d.b * n for n in lens]


class _Loss(NamedTuple):
    """The logits and loss at the step's moments: bytes, with their formulas and source."""

    forward: int        # the forward's peak
    kept: int           # held as backward begins
    backward: int       # the start of backward
    forward_how: str
    kept_how: str
    backward_how: str
    source: str


def _compiled_loss(d: _Dims, chunked: bool) -> _Loss:
    """The compiled loss (``compile_loss``): cross-entropy's partitioned forward saves its input
    (the logits, or each chunk, which ``del logits`` then cannot free) and two fp32 values per
    row (amax, log-sum-exp); its backward makes the input's gradient in one fused kernel."""
    rows = 2 * d.t * 4
    if chunked:
        held = d.t * d.vocab * d.c + rows
        how = ("every logits chunk T·V·c, saved by the compiled cross-entropy, + amax and "
               "log-sum-exp 2·T·4")
        return _Loss(held, held, held + _chunk_rows(d)[-1] * d.vocab * d.c, how, how,
                     "the saved chunks and rows + the last chunk's gradient", COMPILE_SOURCE)
    tv4 = d.t * d.vocab * 4
    return _Loss(max(d.t * d.vocab * (d.c + 4) if d.c != 4 else 0, tv4 + rows), tv4 + rows,
                 2 * tv4 + rows, "output(h).float(): T·V·(bytes + 4) for a moment",
                 "the fp32 logits saved by the compiled cross-entropy + amax and log-sum-exp "
                 "2·T·4", "the saved fp32 logits and rows + their gradient T·V·4",
                 COMPILE_SOURCE)


def _eager_loss(d: _Dims, chunked: bool) -> _Loss:
    """The loss run eagerly: what its log-softmax keeps (T·V·4 in either form: ``del logits``
    frees the logits) and the moments around it."""
    tv4 = d.t * d.vocab * 4
    kept = "the fp32 log-softmax T·V·4 (the logits freed by del logits)"
    if not chunked:
        # output(h) (T·V·c) then .float(): both alive for a moment; log_softmax of the fp32
        # logits; backward: nll's gradient and log_softmax's gradient beside its output
        fwd = max(d.t * d.vocab * (d.c + 4) if d.c != 4 else 0, 2 * tv4)
        return _Loss(fwd, tv4, 3 * tv4, "output(h).float() + log_softmax: 2·T·V·4", kept,
                     "log_softmax output + nll and log_softmax gradients 3·T·V·4", SOURCE)
    rows = _chunk_rows(d)
    done, fwd = 0, 0
    for r in rows:
        done += r
        fwd = max(fwd, done * d.vocab * 4 + (r * d.vocab * 4 if d.c != 4 else 0))
    fwd += d.t * d.vocab * d.c
    # backward runs the last chunk first: every log-softmax output still saved
    return _Loss(fwd, tv4, tv4 + 2 * rows[-1] * d.vocab * 4,
                 "all chunks T·V·c + their fp32 log-softmax (+ the running chunk's fp32 copy)",
                 kept, "fp32 log-softmax of every chunk + the last chunk's two gradients", SOURCE)


def moments(model: ModelSpec, s: Strategy, resident: list[Item], grads: list[Item],
            step: list[Item], grads_top: list[Item] | None = None) -> dict[str, list[Item]]:
    """The moments of one recipe step (the second: optimizer state exists)."""
    d = _dims(model, s)
    one = block_saved(d)
    inputs = part("activations/inputs", (3 if d.packed else 2) * d.t * 8 + d.b * 8,
                  ("tokens, labels, input_pos 3·T·8" if d.packed else "tokens + labels 2·T·8")
                  + " + the recipe's ignore_labels_cache B·8 (int64)", SOURCE)
    # the builder's max_seq_len: the config's positions (torchtune's 8192 default without one)
    positions = model.max_position_embeddings or 8192
    rope = part("weights/rope_cache", positions * model.head_dim * 4 + model.head_dim // 2 * 4,
                "RoPE cache max_seq_len·head_dim·4 + theta (the builder's fp32 buffers, "
                "booked with the weights as the probe books buffers)",
                "torchtune models/llama3_1/_position_embeddings.py")
    shifted = part("activations/shifted_labels", d.t * 8,
                   "torch.hstack of the shifted labels T·8 (int64)", SOURCE)
    base: list[Item] = [*resident, inputs, rope, shifted]
    ckpt = s.checkpointing is not Checkpointing.NONE
    offload = s.checkpointing is Checkpointing.OFFLOAD
    if offload:
        stashed = offload_stashed_layers(d)
        blocks = part("activations/checkpoints", stashed * d.t * d.h * d.c,
                      f"layer inputs offloaded to the host (OffloadActivations); the forward "
                      f"stash keeps the newest {OFFLOAD_STASH} offloads alive: {stashed} layer "
                      f"input(s) T·H·bytes among them", OFFLOAD_SOURCE)
    elif ckpt:
        blocks = part("activations/checkpoints", d.layers * d.t * d.h * d.c,
                      "layer inputs kept by non-reentrant checkpointing: L·T·H·bytes", SOURCE)
    else:
        blocks = part("activations/blocks", d.layers * sum(one.values()) - _first_unsaved(d),
                      f"{d.layers} layers · saved tensors (torchtune layout"
                      + (", compiled layers)" if d.compiled else ")"),
                      COMPILE_SOURCE if d.compiled else SOURCE)
    head = part("activations/head", norm_saved(d) + (d.t * d.h * d.c if d.full else 0),
                "final norm's fp32 input + rstd (+ the output projection's input chunks)",
                SOURCE)
    chunked = s.loss is not Loss.STANDARD
    # compile_loss: the chunked loss is compiled in place; any other is returned compiled,
    # which the LoRA recipe assigns and the full recipe drops
    compiled_loss = d.compiled and (chunked or not d.full)
    loss = _compiled_loss(d, chunked) if compiled_loss else _eager_loss(d, chunked)
    out: dict[str, list[Item]] = {
        "forward-logits": [*base, blocks, head, part("logits/forward", loss.forward,
                                                     loss.forward_how, loss.source)],
        # the step's state as backward begins: what the simulation holds to the byte
        "forward-end": [*base, blocks, head, part("logits/saved", loss.kept, loss.kept_how,
                                                  loss.source)],
        "backward-start": [*base, blocks, head, part("logits/backward_start", loss.backward,
                                                     loss.backward_how, loss.source)],
        "backward-head": [*base, blocks, head, _head_backward(d, chunked)],
        "backward-final-norm": [*base, blocks, head, part(
            "activations/norm_backward", 5 * d.t * d.h * 4 - d.t * 8 - d.t * 4 - (
                d.t * d.h * 4 + d.t * d.h * d.c - d.vocab * d.h * d.c if d.full else 0),
            "the final RMSNorm's backward: 5 fp32 T·H temporaries at its widest, its rstd and "
            "the shifted labels already released (a trained head: its input chunks and the "
            "fp32 normalized tensor freed, its V·H weight gradient made)",
            "torch 2.13 rms_norm autograd decomposition (pow/mean/rsqrt/mul nodes), as "
            "simulated")],
        "optimizer": [*base, *grads, *step],
    }
    # what the top layer reruns beside: every layer input, or (offloaded) its own brought
    # back from the host and the final norm's fp32 input brought back before it, still in the
    # backward stash (a tensor brought back lives until the next node that brings one back
    # has run); the layer below reruns beside the top layer's input
    top_inputs = part(
        "activations/checkpoints", d.t * d.h * d.c + d.t * d.h * 4,
        "the top layer's input brought back from the host T·H·bytes + the final norm's fp32 "
        "input brought back before it T·H·4 (the backward stash)", OFFLOAD_SOURCE
    ) if offload else blocks
    if offload:
        out["backward-recompute"] = [*base, top_inputs, _recompute(d)]
        if d.layers > 1:
            out["backward-recompute-below-top"] = [*base, part(
                "activations/checkpoints", 2 * d.t * d.h * d.c,
                "the layer below the top's input brought back + the top layer's, still in the "
                "backward stash 2·T·H·bytes", OFFLOAD_SOURCE), _recompute(d)]
    elif ckpt:
        out["backward-recompute"] = [*base, blocks, _recompute(d)]
    if d.nf4 and not d.compiled:
        dequant = part("activations/nf4_dequant", nf4_dequant_bytes(d.inter * d.h),
                       "torchao's eager NF4Tensor.get_original_weight of the largest block "
                       "weight (n = I·H): two int64 index tensors 8n, their bf16 lookups, the "
                       "scaled halves and the stacked result 6n, the scales n/32",
                       NF4_SOURCE)
        if ckpt:
            # the top layer rerun as far as down_proj's base dequantizes its weight
            out["backward-recompute-dequant"] = [*base, top_inputs, part(
                "activations/recomputed_layer", sum(one.values())
                - (d.t * d.rank * d.c if d.mlp else 0)
                + (0 if d.full or d.mlp else d.t * d.inter * d.c) + 4 * d.t * d.h * d.c,
                "the top layer recomputed up to down_proj: its saved tensors but down's "
                "LoRA output, down's input T·I·bytes (saved by nothing when down is not "
                "adapted) + residual, attention output and arriving gradients 4·T·H·bytes",
                SOURCE), dequant]
        else:
            # the top layer's down_proj forward: every layer's saved tensors but its LoRA
            # output still to come, its input alive (saved by nothing unless adapted)
            saved_mlp = d.full or d.mlp
            out["forward-top-dequant"] = [*base, blocks, part(
                "activations/top_layer_in_flight", (0 if saved_mlp else d.t * d.inter * d.c)
                - (d.t * d.rank * d.c if d.mlp else 0)
                + (3 if saved_mlp else 4) * d.t * d.h * d.c,
                "the top layer's forward at down_proj: its input, attention output and "
                "residual T·H·bytes each, the MLP norm's output and down's input T·I·bytes "
                "where no LoRA saves them (less down's LoRA output T·r·bytes, not made yet)",
                SOURCE), dequant]
            # the top layer's down_proj backward: grad_output @ weight.to(bf16)
            out["backward-top-dequant"] = [*base, blocks, part(
                "activations/output_grad", d.t * d.h * d.c,
                "the gradient arriving at the top layer T·H·bytes", SOURCE), dequant]
    if d.full:
        # the top layer's MLP backward: its product freed, three T·I gradients, the gradient
        # arriving, the gradients made so far
        rerun = [_recompute_saved(d)] if ckpt else []
        out["backward-top-mlp"] = [*base, blocks, *rerun, *(grads_top or []), part(
            "activations/top_mlp_backward", 2 * d.t * d.inter * d.c + d.t * d.h * d.c
            + 4 * d.inter * d.h * d.c,
            "the top layer's MLP backward: gradients of the product, silu and w3 outputs "
            "(3·T·I, the freed product's place counted once less), the arriving T·H gradient "
            "and its w1/w2/w3 weight gradients", SOURCE)]
    return out


def nf4_dequant_bytes(n: int) -> int:
    """The peak of torchao's eager ``NF4Tensor.get_original_weight`` for an n-parameter weight
    (torchao 0.16 dtypes/nf4tensor.py, what ``weight.to(bf16)`` runs in ``LinearNF4``'s forward
    and backward): the high and low nibbles as int64 (4n bytes each), looked up in the bf16 NF4
    table (n each), scaled by the dequantized block scales (n each, the scales n/32) and
    stacked (2n), all alive as ``torch.stack`` returns: 14n + n/32 bytes (measured to the byte
    on the CPU, where the same Python code runs)."""
    return 14 * n + n // 32


def offload_stashed_layers(d: _Dims) -> int:
    """Layer inputs whose device copy the forward stash still holds as the forward ends
    (LoRA: the scale of the final norm is frozen).

    Each checkpointed layer saves one tensor through the offload hooks (its input, by
    ``_NoopSaveInputs``); the final RMSNorm then saves, in order (``F.rms_norm(x.float(),
    weight=scale)``: an fp32 input and a bf16 scale differ in dtype, so torch runs the
    composite; the simulation's CPU run does so in fp32 too, while CUDA's fused kernel would
    take fewer ids there and leave one or two more layer inputs in the stash): x (pow), rstd
    (rsqrt), rstd and x (x·rstd), then the frozen scale (a Parameter: kept as is). The stash
    holds the offloads whose id is within ``OFFLOAD_STASH`` of the last offload's (the norm's
    fourth); the output projection runs under a ``NoOpManager``, the loss outside the
    context."""
    return max(0, min(d.layers, OFFLOAD_STASH - 4))


def _first_unsaved(d: _Dims) -> int:
    """What the first layer saves less than the others (negative: more). A trained embedding
    saves its int64 indices; a frozen one feeds the first norm a tensor without grad, so the
    norm saves nothing there (eager: its fp32 input and rstd; compiled: the layer's input and
    the first rstd), and eagerly q / k need a gradient there only when adapted (their RoPE
    gathers are freed otherwise)."""
    if d.full:
        return -d.t * 8
    if d.compiled:
        return d.t * d.h * d.c + d.t * 4
    return d.t * d.h * 4 + d.t * 4 + rope_gathers(d, q=not d.attn[0], k=not d.attn[1])


def _recompute_saved(d: _Dims) -> Item:
    one = block_saved(d)
    return part("activations/recomputed_layer", sum(one.values()) - d.t * d.h * d.c,
                "the top layer recomputed: its saved tensors (less one T·H norm output)",
                SOURCE)


def _head_backward(d: _Dims, chunked: bool) -> Item:
    """The loss's backward nodes all run before the output projection's (autograd runs the
    higher sequence numbers first): every chunk's logits gradient in the compute dtype is alive
    when the head's backward starts; a trained head then sums its chunks' V·H weight gradients
    (the running one, the sum so far and the new sum) while two chunks are consumed."""
    if not chunked or not d.full:
        return part("logits/gradients", d.t * d.vocab * d.c,
                    "the logits' gradient T·V·bytes at the head's backward", SOURCE)
    rows = _chunk_rows(d)
    held = (d.t - sum(rows[-2:])) * d.vocab * d.c if len(rows) > 2 else 0
    return part("logits/gradients", held + 3 * d.vocab * d.h * d.c,
                "the chunks' logits gradients not yet consumed (all but two) + the output "
                "weight gradient being summed 3·V·H·bytes", SOURCE)


def _recompute(d: _Dims) -> Item:
    """The top layer rerun in backward (non-reentrant checkpointing), at w3's output: what it
    has saved so far (all but the product and down's LoRA input), w3's base output and scaled
    LoRA update (T·I each, with LoRA on the MLP), the residual and attention output (T·H each)
    and the two T·H gradients arriving."""
    one = block_saved(d)
    later = (d.t * d.inter * d.c if d.full or d.mlp else 0) + (d.t * d.rank * d.c if d.mlp
                                                                else 0)
    size = sum(one.values()) - later + (2 * d.t * d.inter * d.c if d.mlp else 0) + (
        4 * d.t * d.h * d.c)
    return part("activations/recomputed_layer", size,
                "the top layer recomputed up to w3: its saved tensors so far + w3's outputs + "
                "residual, attention output and arriving gradients 4·T·H·bytes", SOURCE)
