"""Unsloth's memory layout (``--recipe unsloth``): the moments of its LoRA/QLoRA fast path.

Modelled from source, not simulated: Unsloth's kernels need CUDA and Triton, so no probe holds
these figures to a run. Read from unsloth 2026.8.19 (commit 015bdef0) ``kernels/fast_lora.py``,
``kernels/rms_layernorm.py``, ``kernels/rope_embedding.py``, ``models/llama.py`` and
unsloth-zoo 2026.8.13 (commit ce232d6c) ``gradient_checkpointing.py`` and
``fused_losses/cross_entropy_loss.py``. What differs from the HF/PEFT layout:

- ``LoRA_QKV`` / ``LoRA_W`` / ``LoRA_MLP`` autograd functions save only their input ``X``
  (and, for the MLP, the gate and up outputs ``e``, ``g``) besides the A/B weights: the frozen
  (4-bit) weights are dequantised again in backward, the T·r intermediates recomputed, and
  ``swiglu_DWf_DW_dfg_kernel`` writes its gradients over ``e``/``g`` in place.
- ``Fast_RMS_Layernorm`` saves its input ``X`` (compute dtype) and ``r`` (fp32, one per row):
  no fp32 copy of the activations.
- ``fast_rope_embedding`` rotates q and k in place (``Fast_RoPE_Embedding`` without position
  ids, ``Fast_RoPE_Embedding_QK`` with them): no rotated copies saved.
- attention (``utils/attention_dispatch.py``: flash-attn, else xformers, else SDPA) saves q,
  the kv-head k and v, the output and the fp32 logsumexp; the output is ``LoRA_W``'s (o_proj)
  input too, counted once. Version- and install-dependent: the xformers path, and SDPA on a
  torch without ``enable_gqa``, expand k/v to every head first (more than modelled here).
- ``UnslothFusedLoss`` computes the loss and its gradient in the forward, chunk by chunk (never
  the full logits): it keeps the hidden-state gradient T·H·bytes until backward.
- ``--offload-activations``: ``UnslothCheckpointFunction`` (unsloth-zoo; what the llama fast
  forward's ``torch.utils.checkpoint.checkpoint`` resolves to once unsloth patched it) copies
  each layer's input to pinned host buffers (``host/offloaded_checkpoints``); the device keeps
  one layer's recompute. ``offload_layout`` follows its rules (the speed model and the host
  RAM read the same): below ``OFFLOAD_MIN_SEQ`` unsloth falls back to standard checkpointing
  (every layer input on the device, no host copies); a layer input of at most
  ``OFFLOAD_MIN_BYTES`` stays on the device; from the second step on the last layer's input
  stays on the device (``LAST_GC_INDEX``); the restored input lands in one of two persistent
  GPU buffers (``GPU_BUFFERS`` / ``GPU_BUFFERS_B``, double buffering), each grown to one layer
  input and never shrunk; the host holds ``INITIAL_CPU_BUFFER_COUNT`` pinned buffers, the first
  L grown to one layer input (the first step offloads every layer).
  ``--gradient-checkpointing``: the launch bundle passes ``use_gradient_checkpointing=True``
  (not ``"unsloth"``), modelled as layer inputs kept on the device.
QLoRA weights are bitsandbytes 4-bit, as in the hf layout (``core.memory.weights``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuneplan.core.job.methods import Method
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

#: the default unsloth / unsloth-zoo versions (the fetched snapshots' ``__version__``).
VERSION = "unsloth 2026.8.19 (015bdef0), unsloth-zoo 2026.8.13 (ce232d6c)"
SOURCE = f"{VERSION}: modelled from kernel source, not simulated"
_LORA = f"unsloth 2026.8.19 kernels/fast_lora.py ({SOURCE})"
_NORM = f"unsloth 2026.8.19 kernels/rms_layernorm.py Fast_RMS_Layernorm ({SOURCE})"
_LOSS = f"unsloth-zoo 2026.8.13 fused_losses/cross_entropy_loss.py UnslothFusedLoss ({SOURCE})"
_CKPT = f"unsloth-zoo 2026.8.13 gradient_checkpointing.py ({SOURCE})"
#: unsloth-zoo ``_get_chunk_multiplier``: target_gb = min(free VRAM / 2, 4.0) GiB per chunk.
CHUNK_TARGET_GIB = 4.0
#: ``models/llama.py`` fast forward: LoRA_QKV, LoRA_W and LoRA_MLP need every projection.
TARGETS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"})
LLAMA_LIKE = frozenset({"llama", "mistral", "qwen2"})


def uncovered(model: ModelSpec, s: Strategy) -> str | None:
    """Why this job falls outside the modelled Unsloth fast path, or None when inside."""
    checks = [
        (model.model_type not in LLAMA_LIKE or model.norm_kind is not NormKind.RMSNORM
         or model.mlp_kind is not MlpKind.GATED or model.num_experts > 0,
         f"{model.model_type} is not a llama-style dense decoder"),
        (s.method not in (Method.LORA, Method.QLORA), f"--method {s.method}"),
        (s.task is not Task.CAUSAL_LM, f"--task {s.task}"),
        (s.precision is Precision.FP32, "--precision fp32 (the kernels run in bf16/fp16)"),
        (s.attention is Attention.EAGER, "--attention eager"),
        (s.world_size > 1 or s.sharding is not Sharding.DDP, "more than one GPU or sharding"),
        (s.grad_accum > 1, "--grad-accum > 1"),
        (s.loss is Loss.STANDARD, "--loss standard"),
        (s.packing or s.compile or s.optimizer_in_backward,
         "--packing, --compile or --optimizer-in-backward"),
        (bool(s.trainable_modules), "--trainable-modules"),
        (s.lora_dropout > 0, "LoRA dropout (the fast LoRA kernels need dropout 0)"),
        (not s.all_linear and not set(s.lora_targets) >= TARGETS,
         "LoRA on fewer than all seven projections (the fast kernels need all of them)"),
        (not s.all_linear and "lm_head" in s.lora_targets, "LoRA on the output"),
    ]
    return next((why for bad, why in checks if bad), None)


#: unsloth 2026.8.19 ``models/_utils.py`` ``apply_unsloth_gradient_checkpointing``: below this
#: ``max_seq_length`` ``use_gradient_checkpointing="unsloth"`` unpatches the smart checkpointer
#: and returns ``True`` (standard checkpointing, no host copies): "offloading not worth it".
OFFLOAD_MIN_SEQ = 512
#: unsloth-zoo 2026.8.13 ``initialize_unsloth_gradient_checkpointing``: ``MINIMUM_SIZE = 2 MiB
#: // dtype bytes`` elements; ``UnslothCheckpointFunction.forward`` offloads a layer input only
#: when ``numel() > MINIMUM_SIZE``.
OFFLOAD_MIN_BYTES = 2 * 1024 * 1024
#: unsloth-zoo 2026.8.13 ``gradient_checkpointing.py``: ``INITIAL_GPU_BUFFER_SIZE`` (elements of
#: each of the two GPU buffers), ``INITIAL_CPU_BUFFER_SIZE`` and ``INITIAL_CPU_BUFFER_COUNT``
#: (the pinned host buffers ``initialize_unsloth_gradient_checkpointing`` makes), in the
#: compute dtype; a buffer is ``resize_``d up to a layer input when one is larger.
INITIAL_GPU_BUFFER_ELEMENTS = 2 * 256 * 2048
INITIAL_CPU_BUFFER_ELEMENTS = 128 * 1024
INITIAL_CPU_BUFFER_COUNT = 200


@dataclass(frozen=True, slots=True)
class OffloadLayout:
    """Where ``--offload-activations`` puts the layer inputs on Unsloth's fast path (the
    second step on: the first offloads every layer)."""

    offloaded: int        # layer inputs copied to the host per step
    on_device: int        # layer inputs kept on the device (saved as plain checkpoints)
    gpu_buffers: int      # bytes of GPU_BUFFERS + GPU_BUFFERS_B (0: smart checkpointer off)
    host_buffers: int     # bytes of the pinned CPU_BUFFERS (0: smart checkpointer off)
    why: str


def offload_layout(model: ModelSpec, s: Strategy) -> OffloadLayout:
    """``UnslothCheckpointFunction`` under ``use_gradient_checkpointing="unsloth"``, from
    unsloth 2026.8.19 ``models/_utils.py`` and unsloth-zoo 2026.8.13
    ``gradient_checkpointing.py`` (the module docstring lists the rules)."""
    d = dims(model, s)
    numel = d.t * d.h
    if s.seq_len < OFFLOAD_MIN_SEQ:
        return OffloadLayout(0, d.layers, 0, 0, (
            f"--seq-len {s.seq_len} < {OFFLOAD_MIN_SEQ}: apply_unsloth_gradient_checkpointing "
            "falls back to standard checkpointing (no host copies)"))
    if numel <= OFFLOAD_MIN_BYTES // d.c:
        return OffloadLayout(0, d.layers, 2 * INITIAL_GPU_BUFFER_ELEMENTS * d.c,
                             INITIAL_CPU_BUFFER_COUNT * INITIAL_CPU_BUFFER_ELEMENTS * d.c, (
            f"a layer input of {numel * d.c} B is not above MINIMUM_SIZE "
            f"({OFFLOAD_MIN_BYTES} B): UnslothCheckpointFunction keeps it on the device"))
    # each layer takes the next pinned buffer (grown to its input); past the initial count
    # one more is made per layer
    host = (min(d.layers, INITIAL_CPU_BUFFER_COUNT) * max(numel, INITIAL_CPU_BUFFER_ELEMENTS)
            + max(INITIAL_CPU_BUFFER_COUNT - d.layers, 0) * INITIAL_CPU_BUFFER_ELEMENTS
            + max(d.layers - INITIAL_CPU_BUFFER_COUNT, 0) * numel) * d.c
    return OffloadLayout(d.layers - 1, 1, 2 * max(numel, INITIAL_GPU_BUFFER_ELEMENTS) * d.c,
                         host, (
        "every layer but the last (LAST_GC_INDEX: the last layer's input stays on the device "
        "from the second step on)"))


def offloaded_layers(model: ModelSpec, s: Strategy) -> tuple[int, str]:
    """Layer inputs ``UnslothCheckpointFunction`` (unsloth-zoo 2026.8.13 gradient_checkpointing.py,
    what ``torch.utils.checkpoint.checkpoint`` resolves to once unsloth patched it; the llama
    fast forward calls it per decoder layer) copies to the host per step, and why that many:
    every layer but the last from the second step on (``LAST_GC_INDEX``: "don't offload the
    last layer"), none below ``OFFLOAD_MIN_SEQ`` or when a layer input is at most
    ``OFFLOAD_MIN_BYTES``. Only meaningful under ``--offload-activations`` on the fast path."""
    layout = offload_layout(model, s)
    return layout.offloaded, layout.why


def dims(model: ModelSpec, s: Strategy) -> BlockDims:
    return BlockDims(**block_dims(model, s))


def norm_saved(d: BlockDims) -> int:
    """``Fast_RMS_Layernorm.forward``: ``ctx.save_for_backward(X, W, r)``: X in the compute
    dtype, r fp32 per row (W is the weight)."""
    return d.t * d.h * d.c + d.t * 4


def block_saved(d: BlockDims) -> dict[str, int]:
    """One decoder layer's tensors kept for backward (no checkpointing), by component."""
    t, c = d.t, d.c
    return {
        "norms": 2 * norm_saved(d),
        # LoRA_QKV saves X (the input norm's output); LoRA_W (o_proj) saves the attention
        # output, the same tensor attention saves
        "qkv_input": t * d.h * c,
        # q, k, v (kv heads, RoPE'd in place), output, fp32 logsumexp B·heads·S
        "attention": 2 * t * d.qd * c + 2 * t * d.kvd * c + d.b * d.heads * d.s * 4,
        # LoRA_MLP saves X, e (gate out), g (up out); h = swiglu(e, g) is not saved
        "mlp": t * d.h * c + 2 * t * d.inter * c,
    }


def chunks(d: BlockDims, target_gib: float = CHUNK_TARGET_GIB) -> int:
    """unsloth-zoo ``get_chunk_size(bsz, qlen, vocab, target_gb)``, exactly."""
    multiplier = (d.vocab * 4 / 1024 / 1024 / 1024) / target_gib / 4
    exact = d.t * multiplier * 4
    if exact <= 1.0 + 1e-9:
        return 1
    return math.ceil(exact / 4 - 1e-9) * 4


def loss_transient(d: BlockDims) -> int:
    """The running chunk inside ``torch.func.grad_and_value``: its logits in the compute dtype,
    their fp32 upcast and the fp32 gradient of the logits (rows·V·(bytes + 8)); the exact set
    of temporaries is torch.func's, not unsloth's, so this is an estimate."""
    rows = -(-d.t // chunks(d))
    return rows * d.vocab * (d.c + 8)


def moments(model: ModelSpec, s: Strategy, resident: list[Item], grads: list[Item],
            step: list[Item], dequant: list[Item] | None = None) -> dict[str, list[Item]]:
    """The moments of one Unsloth LoRA/QLoRA step (the second: optimizer state exists).
    ``dequant``: one dequantised weight (QLoRA), given by the caller in the hf layout's size."""
    d = dims(model, s)
    # QLoRA: matmul_lora's forward dequantises into a global WEIGHT_BUFFER that stays allocated
    # (kernels/utils.py fast_dequantize(use_global_buffer=True)); backward dequantises again
    # into a fresh tensor (fast_lora.py: fast_dequantize(W.t(), W_quant), no global buffer)
    kept = [part("activations/dequant_global_buffer", int(p.value),
                 "unsloth's global WEIGHT_BUFFER: the largest dequantised weight, kept",
                 f"unsloth 2026.8.19 kernels/utils.py fast_dequantize ({SOURCE})",
                 confidence="medium") for p in dequant or []]
    again = [part("activations/dequant_backward", int(p.value),
                  "backward's own dequantised weight (no global buffer)", _LORA,
                  confidence="medium") for p in dequant or []]
    one = block_saved(d)
    th = d.t * d.h * d.c
    inputs = part("activations/inputs", 2 * d.t * 8, "tokens + labels 2·T·8 (int64)", SOURCE,
                  confidence="medium")
    base: list[Item] = [*resident, inputs, *kept]
    layer = sum(one.values())
    if s.checkpointing is Checkpointing.NONE:
        blocks = part("activations/blocks", d.layers * layer,
                      f"{d.layers} layers · (Fast_RMS_Layernorm X + r ×2, LoRA_QKV X, q/k/v/"
                      "out + lse, LoRA_MLP X, e, g); k/v at kv heads as flash-attn or SDPA "
                      "enable_gqa keep them (xformers expands them: more)", _LORA,
                      confidence="medium")
    elif s.checkpointing is Checkpointing.OFFLOAD:
        layout = offload_layout(model, s)
        blocks = part("activations/checkpoints", layout.on_device * th,
                      f"layer inputs kept on the device: {layout.on_device} · T·H·bytes; "
                      f"{layout.offloaded} on the host (UnslothCheckpointFunction: "
                      "x.copy_(arg, non_blocking=True) into pinned CPU_BUFFERS, see host "
                      f"RAM): {layout.why}", _CKPT, confidence="medium", layers=layout.on_device)
        if layout.gpu_buffers:
            base.append(part("activations/offload_gpu_buffers", layout.gpu_buffers,
                             "GPU_BUFFERS + GPU_BUFFERS_B (double buffering): two persistent "
                             "buffers, each max(one layer input T·H, 2·256·2048) elements · "
                             "bytes; a restored input is recomputed from one of them", _CKPT,
                             confidence="medium"))
    else:
        blocks = part("activations/checkpoints", d.layers * th,
                      "layer inputs kept on the device: L·T·H·bytes (the bundle passes "
                      "use_gradient_checkpointing=True, not 'unsloth')", _CKPT,
                      confidence="low")
    head = part("activations/head", norm_saved(d), "final Fast_RMS_Layernorm X + r", _NORM,
                confidence="medium")
    grad_in = part("logits/fused_grad_inputs", th,
                   "UnslothFusedLoss saves grad_inputs T·H·bytes (the loss gradient is made in "
                   "the forward; no T·V logits kept)", _LOSS, confidence="medium")
    n = chunks(d)
    fwd = part("logits/fused_chunk", loss_transient(d),
               f"one of {n} vocabulary-row chunks (get_chunk_size, {CHUNK_TARGET_GIB:g} GiB "
               "target: min(free/2, 4); a GPU with < 8 GiB free uses more chunks): logits·bytes "
               "+ fp32 upcast + fp32 gradient", _LOSS, confidence="low")
    out: dict[str, list[Item]] = {
        "forward-logits": [*base, blocks, head, grad_in, fwd],
        "backward-start": [*base, blocks, head, grad_in, *again, part(
            "activations/arriving_gradient", th, "grad_inputs · grad_output: T·H·bytes",
            _LOSS, confidence="low")],
        "optimizer": [*base, *grads, *step],
    }
    if s.checkpointing is not Checkpointing.NONE:
        # an offloaded input comes back into a GPU buffer (in ``base``), a kept one is in
        # ``blocks``: neither adds here
        out["backward-recompute"] = [*base, blocks, *again, part(
            "activations/recomputed_layer", layer + th,
            "one layer recomputed: its saved tensors + the arriving T·H gradient", _CKPT,
            confidence="low")]
    return out
