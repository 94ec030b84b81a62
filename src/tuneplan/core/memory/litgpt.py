"""LitGPT's memory layout (``--recipe litgpt``): the moments of litgpt 0.5.13's fit loop.

Read from litgpt ``model.py`` / ``lora.py`` / ``utils.py`` / ``finetune/{lora,full}.py`` and
Lightning Fabric 2.6's precision plugins, held to the simulation of that code
(``adapters/probe/litgpt_step.py``). What differs from the HF/PEFT layout:

- RMSNorm computes in fp32 (``x.float()`` ... ``.to(dtype)``): it saves an fp32 input and
  rsqrt; the fp32 normalized tensor only when its weight trains.
- One fused ``qkv`` linear; RoPE multiplies by fp32 cos/sin buffers (S·head·4 each) and
  ``torch.cat`` copies q and k; GQA k/v are ``repeat_interleave``d to every head (copies,
  saved by SDPA); with as many kv heads as heads, v stays a view, keeping the fused qkv
  output alive.
- LoRA on the fused qkv (``LoRAQKVLinear``): ``after_A`` (T·r·enabled) saved by its conv1d.
- Fabric's 16-bit plugins cast the forward's outputs to fp32 (``convert_output``): logits get
  an fp32 copy; the loop variable ``logits`` lives through backward, the optimizer step and
  the next forward. ``chunked_cross_entropy`` saves each chunk's fp32 log-softmax.
- bf16-mixed keeps the whole module in fp32 (frozen base included) under autocast.
"""

from __future__ import annotations

from dataclasses import dataclass

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

#: litgpt finetune/lora.py: ``model(input_ids, lm_head_chunk_size=128)``;
#: ``chunked_cross_entropy(..., chunk_size=128)`` (utils.py default).
LM_HEAD_CHUNK = 128
SOURCE = "litgpt 0.5.13 model.py/lora.py/utils.py, lightning 2.6 fabric precision"


#: litgpt.lora.Config.lora_mlp adapts all three MLP linears at once.
MLP_TARGETS = frozenset({"gate_proj", "up_proj", "down_proj"})
#: model types whose litgpt build is the llama layout modelled here (fused qkv, LLaMAMLP).
LLAMA_LIKE = frozenset({"llama", "mistral"})


def uncovered(model: ModelSpec, s: Strategy) -> str | None:
    """Why this job falls outside the modelled LitGPT layout, or None when it is inside."""
    checks = [
        (model.model_type not in LLAMA_LIKE or model.norm_kind is not NormKind.RMSNORM
         or model.mlp_kind is not MlpKind.GATED or model.num_experts > 0,
         f"{model.model_type} is not a llama-style dense decoder"),
        (model.tie_word_embeddings or model.head_bias, "a tied or biased head"),
        (s.method not in (Method.FULL, Method.LORA, Method.QLORA), f"--method {s.method}"),
        (s.method is Method.QLORA and s.quant not in (Quant.NF4, Quant.FP4),
         f"--quant {s.quant} (litgpt quantizes with bitsandbytes: bnb.nf4 or bnb.fp4)"),
        (s.method is Method.QLORA and s.precision.is_mixed,
         "QLoRA under bf16-mixed (litgpt finetune/lora.py refuses quantization with mixed "
         "precision)"),
        (s.task is not Task.CAUSAL_LM, f"--task {s.task}"),
        (s.precision is Precision.FP16_MIXED, "--precision fp16-mixed"),
        (s.attention is Attention.EAGER, "--attention eager (litgpt runs SDPA)"),
        (s.world_size > 1 or s.sharding is not Sharding.DDP, "more than one GPU or sharding"),
        (s.grad_accum > 1, "--grad-accum > 1"),
        (s.checkpointing is Checkpointing.OFFLOAD, "--offload-activations"),
        (s.packing or s.compile or s.optimizer_in_backward,
         "--packing, --compile or --optimizer-in-backward"),
        (s.method in (Method.LORA, Method.QLORA) and bool(s.trainable_modules),
         "--trainable-modules"),
        (s.loss is Loss.STANDARD,
         "--loss standard (litgpt's finetune scripts always call chunked_cross_entropy)"),
        (s.method in (Method.LORA, Method.QLORA) and not s.all_linear
         and "lm_head" in s.lora_targets, "LoRA on lm_head"),
        (s.method in (Method.LORA, Method.QLORA) and not s.all_linear
         and 0 < len(MLP_TARGETS & set(s.lora_targets)) < 3,
         "LoRA on part of the MLP (litgpt's lora_mlp wraps fc_1, fc_2 and proj together)"),
    ]
    return next((why for bad, why in checks if bad), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class LitTargets:
    """Which linears carry LoRA (litgpt.lora.Config flags)."""

    query: bool = False
    key: bool = False
    value: bool = False
    projection: bool = False
    mlp: bool = False


_FLAG = {"q_proj": "query", "k_proj": "key", "v_proj": "value", "o_proj": "projection",
         "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


_LORA = (Method.LORA, Method.QLORA)


def lit_targets(s: Strategy) -> LitTargets:
    if s.method not in _LORA:
        return LitTargets()
    if s.all_linear:
        return LitTargets(query=True, key=True, value=True, projection=True, mlp=True)
    on = {_FLAG[n] for n in s.lora_targets if n in _FLAG}
    return LitTargets(**dict.fromkeys(on, True))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Dims(BlockDims):
    r: int          # residual / norm-output bytes (the module dtype)
    mixed: bool
    full: bool
    rank: int
    dropout: bool
    mask: int       # bytes per dropout-mask element


def _dims(model: ModelSpec, s: Strategy, mask_bytes: int = 1) -> _Dims:
    mixed = s.precision is Precision.BF16_MIXED
    c = s.precision.compute_bytes
    return _Dims(**block_dims(model, s), r=4 if (mixed or c == 4) else c, mixed=mixed,
                 full=s.method.trains_base, rank=s.lora_rank,
                 dropout=s.method in _LORA and s.lora_dropout > 0, mask=mask_bytes)


def _input_saves(d: _Dims, savers: int, shared_width: int) -> int:
    """A norm output read by ``savers`` saving linears: once (the tensor itself) without
    autocast, one bf16 cast copy per saving call under autocast."""
    if not savers:
        return 0
    if d.mixed:
        return savers * d.t * d.h * 2
    return d.t * d.h * shared_width


def norm_saved(d: _Dims) -> int:
    """litgpt RMSNorm: fp32 input (a copy unless the input is fp32), rsqrt, the fp32
    normalized tensor if the weight trains, and weight.float() (H·4)."""
    return d.t * d.h * 4 + d.t * 4 + (d.t * d.h * 4 if d.full else 0) + d.h * 4


def block_saved(d: _Dims, lt: LitTargets) -> dict[str, int]:
    """One block's tensors kept for backward (no checkpointing), by component."""
    t, c = d.t, d.c
    enabled = sum((lt.query, lt.key, lt.value))
    # Without dropout lora_A saves the linear's input itself (shared with a trained base); with
    # nn.Dropout it saves the dropout's output instead, and the mul saves its noise (mask).
    lora_reads = not d.dropout
    qkv_savers = (1 if d.full else 0) + (1 if enabled and lora_reads else 0)
    mlp_savers = 2 * (1 if d.full else 0) + (2 if lt.mlp and lora_reads else 0)
    attn = t * d.qd * c * 2 + 2 * t * d.qd * c + d.b * d.heads * d.s * 4  # q, k, v, out, lse
    if d.kvd == d.qd:
        # no repeat: v is a view of the fused qkv output, which SDPA keeps alive
        attn += t * (d.qd + 2 * d.kvd) * c - t * d.qd * c
    y_saved = d.full or (lt.projection and lora_reads)
    lora = t * d.rank * enabled * c + (t * d.rank * c if lt.projection else 0) + (
        3 * t * d.rank * c if lt.mlp else 0)
    product_saved = d.full or (lt.mlp and lora_reads)
    if 0 < enabled < 3:
        # zero_pad: index_copy_ of after_B (T·enabled outputs) into a zero T·qkv tensor keeps
        # after_B and the cloned int64 index (lora_ind) for backward (seen in the simulation)
        out_on = (d.qd if lt.query else 0) + (d.kvd if lt.key else 0) + (
            d.kvd if lt.value else 0)
        lora += t * out_on * c + 2 * out_on * 8
    if d.dropout:
        # per LoRA linear: the dropout output (its bf16 autocast copy under bf16-mixed) and
        # the mask, never wider than its input (CPU: noise in the input's dtype; CUDA: bool)
        normed = (d.h if enabled else 0) + (2 * d.h if lt.mlp else 0)   # norm outputs (r)
        inner = (d.qd if lt.projection else 0) + (d.inter if lt.mlp else 0)   # compute dtype
        lora += t * (normed + inner) * c + t * normed * min(d.mask, d.r) + (
            t * inner * min(d.mask, c))
    return {
        "norms": 2 * norm_saved(d),
        "linear_inputs": _input_saves(d, qkv_savers, d.r) + _input_saves(d, mlp_savers, d.r)
        + (t * d.qd * c if y_saved else 0) + (t * d.inter * c if product_saved else 0),
        "attention": attn,
        "mlp": 3 * t * d.inter * c,
        "lora": lora,
    }


def _head(d: _Dims, chunked: bool) -> dict[str, int]:
    """ln_f's saved tensors and lm_head's saved input; the logits held by the loop and the
    log-softmax outputs the chunked loss saves."""
    t, v = d.t, d.vocab
    head_in = 0
    if d.full:
        head_in = t * d.h * 2 if d.mixed else t * d.h * d.r
    shifted = d.b * (d.s - 1)
    return {"ln_f": d.t * d.h * 4 + d.t * 4 + (d.t * d.h * 4 if d.full else 0) + d.h * 4,
            "head_input": head_in, "logits_fp32": t * v * 4,
            "log_softmax": shifted * v * 4}


def _autocast_saved(d: _Dims, s: Strategy, chunked: bool) -> int:
    """bf16 weight copies alive from forward to backward under bf16-mixed (fp32 module)."""
    if not d.mixed:
        return 0
    qkv = d.h * (d.qd + 2 * d.kvd)
    block = qkv + d.qd * d.h + 3 * d.h * d.inter
    head = d.vocab * d.h
    if s.checkpointing is not Checkpointing.NONE:
        # checkpointed blocks save only their inputs; their casts are remade at recompute
        return head * (2 if d.full else 2 * (-(-d.s // LM_HEAD_CHUNK) if chunked else 1))
    if d.full:
        return (d.layers * block + head) * 2
    lt = lit_targets(s)
    enabled = sum((lt.query, lt.key, lt.value))
    adapters = (d.rank * d.h * enabled + d.rank * (
        (d.qd if lt.query else 0) + (d.kvd if lt.key else 0) + (d.kvd if lt.value else 0)))
    adapters += (d.rank * (d.qd + d.h) if lt.projection else 0) + (
        d.rank * (3 * d.h + 3 * d.inter) if lt.mlp else 0)
    # The first block's qkv input (norm of the frozen embedding) needs no gradient: its
    # frozen weight is not saved. Every other frozen linear saves its bf16 copy.
    chunks = -(-d.s // LM_HEAD_CHUNK) if chunked else 1
    return (d.layers * (block + adapters) - qkv + chunks * head) * 2


def moments(model: ModelSpec, s: Strategy, resident: list[Item], grads: list[Item],
            step: list[Item], dropout_mask_bytes: int = 1,
            dequant: list[Item] | None = None) -> dict[str, list[Item]]:
    """The moments of one fit-loop step (the second: state and the previous logits exist).

    QLoRA (``--quantize bnb.nf4``, not simulated: bitsandbytes' 4-bit matmul is CUDA-only
    here) is the bf16-true LoRA layout over 4-bit linears, ``lm_head`` included
    (``weights.head_quantized``): ``Linear4bit`` casts its input to the compute dtype (a no-op
    in bf16-true) and bitsandbytes >= 0.43.2 saves no input; ``dequant`` is the one weight
    dequantized at a time, the 4-bit head's V·H·2 while its chunks run."""
    d = _dims(model, s, dropout_mask_bytes)
    lt = lit_targets(s)
    chunked = s.method in _LORA
    one = block_saved(d, lt)
    per_block = sum(one.values())
    inputs = part("activations/inputs", 2 * d.t * 8, "input ids + targets 2·T·8 (int64)")
    rope = part("activations/rope", 2 * d.s * model.head_dim * 4,
                "RoPE cos/sin buffers 2·S·head·4 (fp32, rebuilt at max_seq_length)", SOURCE)
    base: list[Item] = [*resident, inputs, rope]
    ckpt = s.checkpointing is not Checkpointing.NONE
    if ckpt:
        blocks = part("activations/checkpoints", d.layers * d.t * d.h * d.r,
                      "block inputs kept by non-reentrant checkpointing: L·T·H·bytes", SOURCE)
    else:
        # a frozen embedding feeds the first norm a tensor without grad: it saves nothing
        first = 0 if d.full else d.t * d.h * 4 + d.t * 4 + d.h * 4
        if d.dropout and any((lt.query, lt.key, lt.value)):
            first += d.t * d.h * min(d.mask, d.r)   # no mask kept where the input needs no gradient
        blocks = part("activations/blocks", d.layers * per_block - first,
                      f"{d.layers} blocks · saved tensors (litgpt layout)", SOURCE)
    head = _head(d, chunked)
    ln_f = part("activations/head/ln_f", head["ln_f"] + head["head_input"],
                "ln_f's fp32 input + rsqrt (+ lm_head's saved input)", SOURCE)
    logits = part("logits/fp32_logits", head["logits_fp32"],
                  "the loop's logits T·V·4 (fp32: Fabric convert_output)", SOURCE)
    logsm = part("logits/log_softmax", head["log_softmax"],
                 "chunked_cross_entropy: each chunk's fp32 log-softmax B·(S-1)·V·4", SOURCE)
    previous = part("logits/previous_logits", head["logits_fp32"],
                    "the previous step's logits, still bound to the loop variable T·V·4",
                    SOURCE)
    new_logits = part("logits/compute_logits", d.t * d.vocab * d.c if d.c != 4 else 0,
                      "lm_head's compute-dtype logits before the fp32 copy T·V·bytes", SOURCE)
    shifted = d.b * (d.s - 1)
    if chunked:   # lm_head chunks of 128 positions per row, one loss chunk each
        rows = d.b * min(LM_HEAD_CHUNK, d.s - 1)
        transient = 2 * rows * d.vocab * 4
    else:         # full.py: loss chunks of 128 flattened rows of one logits tensor
        rows = min(LM_HEAD_CHUNK, shifted)
        # after every chunk, the slice logits[..., :-1, :] backs into a T·V·4 zero tensor
        transient = max(2 * rows, d.t) * d.vocab * 4
    grad = part("logits/backward_transient", transient,
                "the running loss chunk's nll and log-softmax gradients 2·rows·V·4 (chunks "
                "done hold their gradients in place of their freed log-softmax); full.py: "
                "or the T·V·4 gradient of the logits slice, whichever is larger",
                SOURCE)
    casts = part("weights/autocast_copies", _autocast_saved(d, s, chunked),
                 "bf16-mixed: autocast's bf16 weight copies the matmuls save (trainable ones "
                 "cached once; frozen ones cast per call: every block linear, lm_head per "
                 "chunk)", "torch autocast weight cache (leaf tensors that require grad)")
    out: dict[str, list[Item]] = {
        "forward-logits": [*base, blocks, ln_f, logits, previous, new_logits, casts],
        "backward-start": [*base, blocks, ln_f, logits, logsm, grad, casts],
        "optimizer": [*base, logits, *grads, *step],
    }
    if dequant:   # the last lm_head chunk runs with the head dequantized
        out["forward-head"] = [*base, blocks, ln_f, previous, new_logits, *dequant]
    return out
