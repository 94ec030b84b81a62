"""Unsloth's own speed terms (``--recipe unsloth``), each from its kernels' source, on the
fast path the memory model uses (``core.memory.unsloth.uncovered``: one place per fact);
outside it the hf timing stands, with a note. Pure.

Read from unsloth 2026.8.19 (commit 015bdef0) and unsloth-zoo 2026.8.13 (commit ce232d6c),
the versions ``core.memory.unsloth`` models:

- offloaded checkpoints: ``UnslothCheckpointFunction`` (unsloth-zoo gradient_checkpointing.py)
  copies each layer's input device->host on a side stream (``EXTRA_STREAM.wait_stream(MAIN)``,
  ``x.copy_(arg, non_blocking=True)`` into pinned ``CPU_BUFFERS``) while the main stream runs
  that layer's forward, and the main stream waits for the copy at the layer's end; in backward
  it copies the input back into a GPU buffer on the side stream and the main stream waits for
  it before the recompute. With double buffering (``USE_DOUBLE_BUFFER``: switched on after the
  first backward when more than ``DOUBLE_BUFFER_HEADROOM`` = 512 MiB is free, off on unified
  memory) the copy back waits only for the compute that last used its buffer, two layers
  earlier, so it runs beside the next-higher layer's recompute and backward.
- QLoRA: ``matmul_lora`` (kernels/utils.py) dequantises each 4-bit weight with
  ``fast_dequantize`` in forward, and ``LoRA_MLP`` / ``LoRA_QKV`` / ``LoRA_W`` ``.backward``
  (kernels/fast_lora.py) dequantise it again (``fast_dequantize(W.t(), W_quant)``): no weight is
  kept between the passes; the recomputed forward dequantises once more.
- elementwise kernels: ``Fast_RMS_Layernorm`` (kernels/rms_layernorm.py), one Triton kernel
  each way; ``Fast_RoPE_Embedding`` (kernels/rope_embedding.py) rotates q and k in place;
  ``swiglu_fg_kernel`` / ``swiglu_DWf_DW_dfg_kernel`` (kernels/swiglu.py) fuse SiLU(e)·g and its
  backward, writing over their inputs; ``matmul_lora`` casts the adapter weights to the input's
  dtype (``A.to(dtype)``), never the activations.

Not derived (left as the hf timing): the host overhead of the fused autograd functions. Their
kernel launches per adapted linear could be counted from the source, but the host model's
per-adapter cost (``host_overhead_s_per_adapter_pass``) is fitted per PEFT linear, not per
launch, so no seconds follow from a count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.core.job.strategy import Checkpointing, Strategy
from tuneplan.explain import Term

if TYPE_CHECKING:
    from tuneplan.core.catalog.hardware import GpuSpec
    from tuneplan.core.compute.assumptions import ThroughputAssumptions
    from tuneplan.core.compute.step import MicroBatch
    from tuneplan.core.compute.throughput import ModelShape

_ZOO = "unsloth-zoo 2026.8.13 (ce232d6c)"
_UNSLOTH = "unsloth 2026.8.19 (015bdef0)"
_CKPT = f"{_ZOO} gradient_checkpointing.py UnslothCheckpointFunction"
#: the host copies of unsloth's offloaded checkpoints (a host-link limit in ``bound_seconds``)
OFFLOAD_TERM = "micro-batch/unsloth-checkpoint-offload-exposed"
#: the elementwise terms each fusion replaces (``core.compute.elementwise`` op names).
FUSED_OPS = ("norms", "rotary", "activation", "mixed-precision-casts")


def fast_path(model: ModelShape, s: Strategy) -> bool:
    """``--recipe unsloth`` on the fast path the memory model covers."""
    from tuneplan.core.job.recipes import Recipe
    from tuneplan.core.memory.unsloth import uncovered

    return s.recipe is Recipe.UNSLOTH and uncovered(model.spec, s) is None


def note(model: ModelShape, s: Strategy) -> str:
    """What ``--recipe unsloth`` changes in the speed model for this job, in words."""
    from tuneplan.core.memory.unsloth import offloaded_layers, uncovered

    why = uncovered(model.spec, s)
    if why is not None:
        return (f"--recipe unsloth: outside unsloth's modelled fast path ({why}): timed with "
                "the hf kernels but its fused loss (micro-batch/loss); no unsloth terms")
    out = ("--recipe unsloth: timed with its own terms from kernel source: micro-batch/"
           "unsloth-fused-* (Fast_RMS_Layernorm, in-place RoPE, fused SwiGLU, no adapter input "
           "casts: bytes saved vs the hf kernels, counted at elementwise_exposed_share)")
    if s.checkpointing is Checkpointing.OFFLOAD:
        layers, why_layers = offloaded_layers(model.spec, s)
        out += (", micro-batch/unsloth-checkpoint-offload-exposed" if layers
                else f"; no checkpoint copies: {why_layers} (the memory estimate still "
                     "counts them in host RAM)")
    out += ("; its QLoRA dequantisation passes and fused loss keep the hf terms' names; host "
            "overhead stays hf's (no per-launch cost to derive it from)")
    return out


def offload_term(model: ModelShape, s: Strategy, a: ThroughputAssumptions, mb: MicroBatch,
                 gpu_s: float) -> Term | None:
    """The host copies of the checkpoints ``UnslothCheckpointFunction`` makes per micro-batch,
    beyond what its streams hide: each offloaded layer input (T·H·bytes) goes device->host
    beside that layer's forward and host->device beside the next-higher layer's recompute and
    backward (double buffering), so each copy shows only where it is longer than its window.
    The windows are the GPU compute ``gpu_s`` (matmul + attention) split by FLOPs: one
    forward's share for the forward, the rest (recompute + backward) for the backward, over
    the layers (the head's GEMMs are spread over them too: a small overstatement of the
    window)."""
    if not fast_path(model, s) or s.checkpointing is not Checkpointing.OFFLOAD:
        return None
    from tuneplan.core.memory.unsloth import offloaded_layers

    layers, why = offloaded_layers(model.spec, s)
    if not layers:
        return None
    per_layer = mb.tokens * model.hidden_size * s.precision.compute_bytes
    moved = 2 * layers * per_layer
    copy_s = per_layer / a.host_link_bytes_per_s
    share = mb.forward_flops / mb.flops if mb.flops else 0.0
    forward_window = gpu_s * share / model.num_layers
    backward_window = gpu_s * (1 - share) / model.num_layers
    exposed = layers * (max(0.0, copy_s - forward_window) + max(0.0, copy_s - backward_window))
    return Term(
        path=OFFLOAD_TERM, value=exposed, unit="s",
        formula="offloaded layers x (max(0, T·H·bytes / host link - layer forward) + max(0, "
                "T·H·bytes / host link - layer recompute+backward)); bytes moved = 2 x "
                "offloaded layers x T·H·bytes",
        inputs={"bytes": moved, "bytes_per_layer": per_layer, "offloaded_layers": layers,
                "offloaded_layers_basis": why, "host_link_bytes_per_s": a.host_link_bytes_per_s,
                "copy_s_per_layer": copy_s, "forward_window_s": forward_window,
                "backward_window_s": backward_window, "forward_flops_share": round(share, 4),
                "overlap": "per layer: D2H beside its own forward (side stream, waited at the "
                           "layer's end); H2D beside the layer above's recompute+backward "
                           "(double buffering, steady state when > 512 MiB is free)",
                "confidence": "medium"},
        source=f"{_CKPT}: forward x.copy_(arg, non_blocking=True) on EXTRA_STREAM into pinned "
               "CPU_BUFFERS, MAIN_STREAM.wait_stream(EXTRA_STREAM) after the layer; backward "
               "buffer.copy_(x, non_blocking=True) after EXTRA_STREAM.wait_event(the buffer's "
               "last compute), MAIN_STREAM.wait_stream(EXTRA_STREAM) before the recompute; "
               "modelled from source, not measured")


DEQUANT_SOURCE = (
    f"{_UNSLOTH} kernels/utils.py matmul_lora -> fast_dequantize in forward (into the global "
    "WEIGHT_BUFFER), kernels/fast_lora.py LoRA_MLP/LoRA_QKV/LoRA_W.backward -> "
    "fast_dequantize(W.t(), W_quant) again (no weight kept), the recomputed forward once more "
    "under checkpointing: 2 passes, 3 with recompute; bitsandbytes' own cdequantize_blockwise "
    "kernels, reading 0.5 B + absmax and writing the compute-dtype weight, as MatMul4Bit does")


def _fused_bytes(model: ModelShape, s: Strategy) -> dict[str, tuple[float, float, str, str]]:
    """Per token, all layers: (forward bytes, backward bytes, formula, source) of unsloth's
    kernel for each elementwise op it replaces (``FUSED_OPS``), in the compute dtype: unsloth
    loads the model in it, so the residual stream, q/k and the MLP's e, g are that wide."""
    spec = model.spec
    c = s.precision.compute_bytes
    h, layers = model.hidden_size, model.num_layers
    norms = 2 * layers + 1
    rotated = (spec.num_heads + spec.num_kv_heads) * spec.head_dim
    inter = layers * spec.intermediate_size
    return {
        "norms": (norms * (2 * c * h + 4), norms * (3 * c * h + 4),
                  f"{norms} norms x (hidden x 2 x {c} + 4, hidden x 3 x {c} + 4) B",
                  f"{_UNSLOTH} kernels/rms_layernorm.py _rms_layernorm_forward: load X, store "
                  "Y and the fp32 inv_var r per row; _rms_layernorm_backward: load dY, X, r, "
                  "store dX (the weight is frozen: no weight gradient)"),
        "rotary": (layers * rotated * 2 * c, layers * rotated * 2 * c,
                   f"layers x (heads + kv heads) x head_dim x (2, 2) x {c} B",
                   f"{_UNSLOTH} kernels/rope_embedding.py fast_rope_embedding without "
                   "position ids (models/llama.py passes none unless the batch carries them; "
                   "--packing is off the fast path): Fast_RoPE_Embedding on Q.transpose(1, 2)"
                   ".contiguous(), a view of the (batch, seq, heads, head_dim) projection, so no "
                   "copy, rotated in place by _rope_embedding (load, store: 2 per element), "
                   "backward the same kernel on dY; the cos/sin rows it loads per group of 4 "
                   "heads are left out. With position ids (Fast_RoPE_Embedding_QK) it clones "
                   "the non-contiguous q and k first: 2 more per element, not counted"),
        "activation": (inter * 3 * c, inter * 6 * c,
                       f"intermediate x layers x (3, 6) x {c} B",
                       f"{_UNSLOTH} kernels/swiglu.py _fg_kernel: load e, g, store h; "
                       "_DWf_DW_dfg_kernel: load DW, e, g, store h, df, de over them"),
        "mixed-precision-casts": (0.0, 0.0, "0: no activation casts",
                                  f"{_UNSLOTH} kernels/utils.py matmul_lora: X @ A.to(dtype), "
                                  "the adapter weights cast per call (rank x (in + out), not "
                                  "per token: left out), never the input"),
    }


def fused_terms(model: ModelShape, s: Strategy, gpu: GpuSpec, a: ThroughputAssumptions,
                mb: MicroBatch) -> list[Term]:
    """One term per elementwise op unsloth fuses: the hf kernels' seconds for it
    (``core.compute.step.elementwise_seconds``, as its own ``micro-batch/<op>`` term times it)
    minus unsloth's kernel bytes at DRAM (a fused kernel's bytes are its inputs and outputs),
    negative where unsloth saves; counted, like the elementwise terms, at
    ``elementwise_exposed_share`` (0 by default), the full figure in ``bandwidth_seconds``."""
    if not fast_path(model, s):
        return []
    from tuneplan.core.compute.elementwise import elementwise_ops, forward_passes
    from tuneplan.core.compute.step import elementwise_seconds

    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12) * a.elementwise_bandwidth_efficiency
    passes = forward_passes(s)
    ours = _fused_bytes(model, s)
    terms = []
    for op in elementwise_ops(model, s):
        if op.name not in ours or op.per != "token":
            continue
        fwd, bwd, formula, source = ours[op.name]
        hf_s, hf_bytes, _, _ = elementwise_seconds(op, gpu, a, mb, passes)
        fused = mb.tokens * (passes * fwd + bwd)
        fused_s = fused / bandwidth
        saved = hf_s - fused_s
        terms.append(Term(
            path=f"micro-batch/unsloth-fused-{op.name}",
            value=0.0 - saved * a.elementwise_exposed_share, unit="s",
            formula=f"-(hf {op.name} seconds - tokens x (forward passes x forward + backward) "
                    f"bytes / (HBM bandwidth x efficiency)), x exposed share (the share the "
                    f"elementwise terms are counted at); unsloth bytes: {formula}",
            inputs={"hf_bytes": round(hf_bytes), "unsloth_bytes": round(fused),
                    "saved_bytes": round(hf_bytes - fused), "hf_seconds": hf_s,
                    "unsloth_seconds": fused_s, "bandwidth_seconds": -saved,
                    "exposed_share": a.elementwise_exposed_share, "forward_passes": passes,
                    "confidence": "medium"},
            source=f"{source}; vs micro-batch/{op.name} ({op.source}); modelled from source"))
    return terms
