"""Time of one optimizer step, term by term: matmul-bound compute, per-block host overhead,
memory-bound phases (QLoRA dequantization, DoRA norms, the optimizer step) and exposed
communication. Pure; reads the job's ``Strategy`` and the node's ``NodeLinks``; FLOPs per
token come from ``core.compute.throughput``, trainable parameters from
``core.job.methods.count_trainable`` (the memory model's count).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute import unsloth
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.communication import (
    KNOWN_SHARDING,
    PER_MICROBATCH_GRADS,
    SHARDED_PARAMS,
    Fabric,
    NodeLinks,
    collectives_per_step,
    communication_per_step,
    node_fabric,
)
from tuneplan.core.job.methods import (
    ESTIMATED_METHODS,
    Method,
    Quant,
    count_trainable,
    effective_quant,
)
from tuneplan.core.job.strategy import (
    Attention,
    Checkpointing,
    Loss,
    Offload,
    Optimizer,
    Precision,
    Sharding,
    Strategy,
    Task,
)
from tuneplan.core.models import LinearRole
from tuneplan.errors import UnsupportedError
from tuneplan.explain import Breakdown, Term

if TYPE_CHECKING:
    from tuneplan.core.compute.elementwise import OpBytes
    from tuneplan.core.compute.throughput import ModelShape

#: Optimizer state bytes per trainable parameter (moments), by optimizer.
#: GaLore's: those of its base optimizer, what its untargeted parameters keep; the targeted
#: ones keep less (``_galore_terms`` counts them; a checkpoint's size takes these as a bound).
STATE_BYTES = {"adamw": 8, "paged-adamw32bit": 8, "adamw8bit": 2, "paged-adamw8bit": 2,
               "adafactor": 0, "sgd": 4, "lion": 4, "galore-adamw": 8, "galore-adamw8bit": 2,
               "galore-adafactor": 0}


def weight_bytes(precision: Precision) -> int:
    """Bytes of a trainable weight as the optimizer updates it: fp32 masters unless pure bf16."""
    return 2 if precision is Precision.BF16 else 4


def compute_dtype_bytes(precision: Precision) -> int:
    return precision.compute_bytes


def recomputes(strategy: Strategy) -> bool:
    """Checkpointing (or offloading checkpoints, which also recomputes) adds a forward."""
    return strategy.checkpointing is not Checkpointing.NONE


def trainable_params(model: ModelShape, strategy: Strategy) -> int:
    """Parameters the optimizer updates: ``count_trainable(spec, strategy).total``, the memory
    model's count (PEFT 0.21 targets; raises UnsupportedError where it refuses). Methods it
    does not estimate: the other low-rank adapters as LoRA over the same targets; p-tuning,
    (llama-)adapter and layernorm tuning as one hidden-size vector per block, plus the head
    with ``--trainable-modules lm_head``. Cached on ``model`` per strategy."""
    s = strategy
    key = ("trainable", s.method, s.lora_rank, s.lora_targets, s.trainable_modules,
           s.trainable_layers, s.num_virtual_tokens, s.lisa_layers)
    found = model._cache.get(key)
    if found is None:
        if s.method in ESTIMATED_METHODS:
            found = count_trainable(model.spec, s).total
        elif s.method.is_low_rank:
            found = count_trainable(model.spec, replace(s, method=Method.LORA)).total
        else:
            head = (model.vocab_size * model.hidden_size if "lm_head" in s.trainable_modules
                    else 0)
            found = model.num_layers * model.hidden_size + head
        model._cache[key] = found
    assert isinstance(found, int)
    return found


PRE_AMPERE = ("Volta", "Turing")

#: The compute-bound step terms (``Throughput.bound`` reads them as ``compute``).
COMPUTE_TERMS = frozenset({"micro-batch/matmul", "micro-batch/attention",
                           "micro-batch/torch-compile"})


def job_class(s: Strategy) -> str:
    """The class of job a probe calibration is kept for: full or adapter training, and the
    precision (``ThroughputAssumptions.matmul_efficiency_by_gpu_job``)."""
    return f"{'full' if s.method.trains_base else 'adapter'}/{s.precision.value}"


def matmul_efficiency(gpu: GpuSpec, precision: Precision, peak: float,
                      a: ThroughputAssumptions, job: str | None = None
                      ) -> tuple[float, dict[str, object]]:
    """Fraction of the dense ``peak`` a training step's matmuls reach on ``gpu`` (before the
    hidden-size factor), and what it rests on: fp32 its own constant; a calibrated override
    for this GPU (a probe on it), else by architecture; else the GPU's matmul ceiling
    (``core.compute.ceiling``) times ``matmul_step_share`` (and ``pre_ampere_step_factor`` on
    Volta and Turing)."""
    if precision is Precision.FP32:
        return a.fp32_matmul_efficiency, {"efficiency_entry": "fp32 (CUDA cores)"}
    own = a.gpu_override(gpu.name, job)
    if own is not None:
        return own[0], {"efficiency_entry": f"calibrated ({gpu.name})", "calibration": own[1]}
    override = a.matmul_override(gpu.architecture)
    if override is not None:
        return override[0], {"efficiency_entry": f"calibrated ({override[1]})"}
    from tuneplan.core.compute.ceiling import matmul_ceiling

    ceiling = matmul_ceiling(gpu, peak, a)
    old = gpu.architecture.split()[0] in PRE_AMPERE if gpu.architecture else False
    factor = a.pre_ampere_step_factor if old else 1.0
    return ceiling.fraction * a.matmul_step_share * factor, {
        "efficiency_entry": f"ceiling {ceiling.basis}", "ceiling_flops_per_s": ceiling.flops_per_s,
        "ceiling_fraction": round(ceiling.fraction, 4), "ceiling_source": ceiling.source,
        "step_share": a.matmul_step_share, "pre_ampere_factor": factor}


@dataclass(frozen=True, slots=True, kw_only=True)
class MicroBatch:
    """What one micro-batch computes: all FLOPs, the attention-score share of them (QK^T and
    AV in every pass), and the attended shape (sequences x context) the kernels see."""

    flops: float
    attention_flops: float
    sequences: int
    context: int
    tokens: int
    #: one forward pass's FLOPs (the share of ``flops`` the first forward does); 0: not given
    forward_flops: float = 0.0


def uses_flash_kernel(gpu: GpuSpec, s: Strategy) -> bool:
    """FlashAttention-2 runs the scores: ``--attention flash``, or ``sdpa``, whose flash
    backend is FlashAttention-2 (PyTorch 2.2+) on sm80+ in fp16/bf16; eager, fp32 and
    pre-Ampere cards (no FA2 kernels) use batched GEMMs instead."""
    old = gpu.architecture.split()[0] in PRE_AMPERE if gpu.architecture else False
    return (s.attention is not Attention.EAGER and s.precision is not Precision.FP32
            and not old)


def _micro_batch_terms(model: ModelShape, s: Strategy, gpu: GpuSpec,
                       a: ThroughputAssumptions, peak: float, mb: MicroBatch) -> list[Term]:
    eff, basis = matmul_efficiency(gpu, s.precision, peak, a, job_class(s))
    size = 1.0 if s.precision is Precision.FP32 else (
        model.hidden_size / (model.hidden_size + a.hidden_size_half_efficiency))
    speed = peak * eff * size
    if s.method is Method.LORA8BIT:
        speed /= a.int8_matmul_slowdown
    matmul_s = (mb.flops - mb.attention_flops) / speed
    attention = _attention_term(s, gpu, a, peak, eff, speed, mb)
    compiled = _compile_term(s, a, matmul_s)
    gpu_s = matmul_s + float(attention.value) + (float(compiled.value) if compiled else 0.0)
    host_s, host_inputs = _host_seconds(model, s, a)
    p = a.host_overlap_exponent
    exposed = (gpu_s**p + host_s**p) ** (1 / p) - gpu_s
    terms = [
        Term(path="micro-batch/matmul", value=matmul_s, unit="s",
             formula="(FLOPs - attention FLOPs) per micro-batch / (peak x efficiency x "
                     "h/(h+h0))",
             inputs={"flops": mb.flops - mb.attention_flops, "peak_flops_per_s": peak,
                     "efficiency": eff, **basis, "size_factor": round(size, 4)},
             source="compute-bound linears: the GPU's matmul ceiling (measured or by the power "
                    "rule) x the share a training step reaches"),
        attention,
        Term(path="micro-batch/host-overhead-exposed", value=exposed, unit="s",
             formula="(gpu^p + host^p)^(1/p) - gpu", inputs={**host_inputs, "p": p},
             source="the CPU launches kernels while the GPU runs earlier ones: host time shows "
                    "only where it exceeds GPU time (small micro-batches)"),
    ]
    offload = offload_term(model, s, a, gpu_s + exposed)
    checkpoints = unsloth.offload_term(model, s, a, mb, gpu_s)
    return (terms + ([compiled] if compiled else []) + ([offload] if offload else [])
            + ([checkpoints] if checkpoints else [])
            + _kernel_memory_terms(model, s, gpu, a, mb) + _memory_bound_terms(model, s, gpu, a)
            + elementwise_terms(model, s, gpu, a, mb) + unsloth.fused_terms(model, s, gpu, a, mb))


def elementwise_terms(model: ModelShape, s: Strategy, gpu: GpuSpec, a: ThroughputAssumptions,
                      mb: MicroBatch) -> list[Term]:
    """The elementwise ops between the GEMMs (``core.compute.elementwise``: norms, rotary,
    activation, residual adds, dropout, mixed-precision casts), each timed as bytes moved in
    the forward (twice under checkpointing), and the backward, / (HBM bandwidth x
    ``elementwise_bandwidth_efficiency``), intermediates of a kernel chain at the L2's rate
    where they fit in the GPU's L2; counted at ``elementwise_exposed_share`` of that (0 by
    default: the fitted matmul share carries them), the full figure in ``bandwidth_seconds``."""
    from tuneplan.core.compute.elementwise import elementwise_ops, forward_passes

    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12) * a.elementwise_bandwidth_efficiency
    passes = forward_passes(s)
    l2 = a.l2_bytes(gpu.name)
    terms = []
    for op in elementwise_ops(model, s):
        seconds, moved, dram, cached = elementwise_seconds(op, gpu, a, mb, passes)
        live = op.working_set * mb.tokens
        share, which = a.elementwise_exposed_share, "elementwise_exposed_share"
        if op.adapter and a.adapter_exposed_share is not None:
            share, which = a.adapter_exposed_share, "adapter_exposed_share"
        terms.append(Term(
            path=f"micro-batch/{op.name}",
            value=seconds * share, unit="s",
            formula=f"{'tokens x ' if op.per == 'token' else ''}(forward passes x forward "
                    "bytes + backward bytes): DRAM bytes / (HBM bandwidth x efficiency) + "
                    "L2-resident bytes / (that x L2 ratio), x exposed share",
            inputs={"bandwidth_seconds": seconds, "bytes": round(moved),
                    "dram_bytes": round(dram),
                    "forward_bytes_per_" + op.per: op.forward,
                    "backward_bytes_per_" + op.per: op.backward, "forward_passes": passes,
                    "intermediate_bytes": round(live), "l2_bytes": l2, "in_l2": cached,
                    "bandwidth": bandwidth, "exposed_share": share,
                    "bytes_formula": op.formula, "confidence": "low"},
            source=op.source + ("" if share else
                                "; counted 0: the fitted matmul share carries this time "
                                f"({which})")))
    return terms


def elementwise_seconds(op: OpBytes, gpu: GpuSpec, a: ThroughputAssumptions, mb: MicroBatch,
                        passes: int) -> tuple[float, float, float, bool]:
    """(seconds, bytes moved, DRAM bytes, in L2) of one elementwise op per micro-batch: its bytes at
    DRAM rate, or, where its per-token intermediates fit in ``l2_resident_share`` of the L2,
    only its boundary bytes at DRAM rate and the rest at the L2's."""
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12) * a.elementwise_bandwidth_efficiency
    l2 = a.l2_bytes(gpu.name)
    units = mb.tokens if op.per == "token" else 1
    moved = units * (passes * op.forward + op.backward)
    live = op.working_set * mb.tokens
    cached = op.per == "token" and l2 is not None and live <= a.l2_resident_share * l2
    dram = units * (passes * op.boundary_forward + op.boundary_backward) if cached else moved
    return (dram + (moved - dram) / a.l2_bandwidth_ratio) / bandwidth, moved, dram, cached


def _compile_term(s: Strategy, a: ThroughputAssumptions, matmul_s: float) -> Term | None:
    """What ``--compile`` saves on the matmul-bound part (negative seconds): Inductor's
    fusions around the GEMMs (norms, activations, casts) that the eager time above carries,
    ``compile_speedup`` fitted on torchtune's compiled rows; its fused loss and fewer launches
    are ``micro-batch/loss`` and the host term's own."""
    if not s.compile:
        return None
    saved = matmul_s * (1 / a.compile_speedup - 1)
    return Term(path="micro-batch/torch-compile", value=saved, unit="s",
                formula="matmul x (1/compile_speedup - 1)",
                inputs={"matmul_s": matmul_s, "compile_speedup": a.compile_speedup},
                source="torch.compile (Inductor) fuses the elementwise work between the GEMMs; "
                       "the speed-up is fitted on torchtune's compiled rows")


def _attention_term(s: Strategy, gpu: GpuSpec, a: ThroughputAssumptions, peak: float,
                    eff: float, matmul_speed: float, mb: MicroBatch) -> Term:
    """The score products QK^T and AV (every pass) by their kernel: FlashAttention-2 at its
    published share of the GPU's matmul ceiling (``flash_attention_ceiling_share``), scaled
    like the linears where a probe calibrated this GPU; otherwise batched GEMMs at the
    linears' speed (eager's memory traffic is ``micro-batch/eager-attention-scores``)."""
    if not uses_flash_kernel(gpu, s):
        return Term(path="micro-batch/attention", value=mb.attention_flops / matmul_speed,
                    unit="s", formula="attention FLOPs / the linears' speed",
                    inputs={"flops": mb.attention_flops, "kernel": "batched GEMM",
                            "attention": s.attention.value},
                    source="eager attention (and SDPA where FlashAttention-2 does not run: "
                           "fp32, pre-Ampere) computes the scores with cuBLAS batched GEMMs")
    from tuneplan.core.compute.ceiling import matmul_ceiling

    ceiling = matmul_ceiling(gpu, peak, a)
    share = a.flash_share(gpu.architecture)
    default = ceiling.fraction * a.matmul_step_share
    scale = eff / default if (a.gpu_override(gpu.name) or
                              a.matmul_override(gpu.architecture)) else 1.0
    speed = peak * ceiling.fraction * share * scale
    return Term(path="micro-batch/attention", value=mb.attention_flops / speed, unit="s",
                formula="attention FLOPs / (peak x ceiling fraction x FA2 share of the ceiling"
                        " x calibration)",
                inputs={"flops": mb.attention_flops, "kernel": "flash-attention 2",
                        "attention": s.attention.value, "ceiling_fraction":
                        round(ceiling.fraction, 4), "fa2_share_of_ceiling": share,
                        "calibration_scale": round(scale, 4)},
                source="FlashAttention-2 (sdpa's flash backend, or --attention flash) is "
                       "compute-bound at a published share of the peak (flash_attention_"
                       "ceiling_share); causal blocks above the diagonal are skipped")


def _kernel_memory_terms(model: ModelShape, s: Strategy, gpu: GpuSpec,
                         a: ThroughputAssumptions, mb: MicroBatch) -> list[Term]:
    """Memory-bound kernels the chosen kernels add or avoid: eager attention's materialised
    scores, and the loss over the logits (standard vs fused/chunked)."""
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12) * a.elementwise_bandwidth_efficiency
    terms: list[Term] = []
    if s.attention is Attention.EAGER:
        per = a.eager_score_bytes_forward * (2 if recomputes(s) else 1) \
            + a.eager_score_bytes_backward
        elements = mb.sequences * model.spec.num_heads * mb.context**2 * model.num_layers
        terms.append(Term(
            path="micro-batch/eager-attention-scores", value=elements * per / bandwidth,
            unit="s", formula="sequences x heads x context^2 x layers x bytes per score / "
                              "(HBM bandwidth x efficiency)",
            inputs={"score_elements": elements, "bytes_per_score": per,
                    "bandwidth": bandwidth},
            source="eager attention writes and rereads the full s x s scores: scale, mask add, "
                   "fp32 softmax, cast back (transformers eager_attention_forward), and their "
                   "gradients"))
    if s.task is Task.CAUSAL_LM:
        per_logit, kernel = loss_bytes_per_logit(s, a)
        logits = mb.tokens * model.vocab_size
        terms.append(Term(
            path="micro-batch/loss", value=logits * per_logit / bandwidth, unit="s",
            formula="tokens x vocab x bytes per logit / (HBM bandwidth x efficiency)",
            inputs={"logits": logits, "bytes_per_logit": per_logit, "kernel": kernel,
                    "bandwidth": bandwidth},
            source="cross-entropy over the logits, forward and backward, by its kernel"))
    return terms


def loss_bytes_per_logit(s: Strategy, a: ThroughputAssumptions) -> tuple[float, str]:
    """HBM bytes per logit the loss moves (forward + backward) and the kernel that moves them:
    the recipe's loss (``core.memory.logits.effective_loss``, one rule for memory and speed)."""
    from tuneplan.core.job.recipes import Recipe, precision_plan
    from tuneplan.core.memory.logits import effective_loss

    if effective_loss(s, precision_plan(s)) is Loss.STANDARD:
        return a.standard_loss_bytes_per_logit, "unfused fp32 cross-entropy"
    if s.recipe is Recipe.TORCHTUNE:
        if s.compile:
            return a.compiled_loss_bytes_per_logit, "torchtune chunked CE under torch.compile"
        return a.standard_loss_bytes_per_logit, "torchtune chunked CE (eager: fp32 per chunk)"
    if s.recipe is Recipe.UNSLOTH:
        return a.fused_loss_bytes_per_logit, "unsloth fast_cross_entropy_loss"
    return a.fused_loss_bytes_per_logit, "Liger fused linear cross-entropy"


def stored_weight_bytes(model: ModelShape, s: Strategy) -> float:
    """Bytes of all parameters as stored on the GPU between uses: the blocks' linears at the
    quantized width under QLoRA/LoRA-8bit (4-bit: 0.5 B + absmax constants; int8: 1 B + one
    fp32 scale per row, counted as 1 B), everything else in the compute dtype."""
    dtype = compute_dtype_bytes(s.precision)
    quant = effective_quant(s)
    if quant is None:
        return float(model.total_params * dtype)
    base = model.stored_block_params
    per = 1.0 if quant is Quant.INT8 else 0.5 + _quant_constant_bytes(s)
    return base * per + (model.total_params - base) * dtype


def _quant_constant_bytes(s: Strategy) -> float:
    """Bytes per 4-bit weight of its scaling constants: bitsandbytes blocks of 64 weights with
    an fp32 absmax (4/64 B), or with --double-quant an 8-bit absmax plus an fp32 per 256
    blocks (1/64 + 4/16384 B) (bitsandbytes functional.quantize_4bit, blocksize 64); GPTQ
    group 128: an fp16 scale and a packed 4-bit zero per group ((2 + 0.5)/128 B)."""
    if effective_quant(s) is Quant.GPTQ_INT4:
        return 2.5 / 128
    return 1 / 64 + 4 / 16384 if s.double_quant else 4 / 64


def _memory_bound_terms(model: ModelShape, s: Strategy, gpu: GpuSpec,
                        a: ThroughputAssumptions) -> list[Term]:
    """Per micro-batch phases limited by memory links: the quantized weights' kernels, DoRA
    norms (parameters streamed from the host are ``offload_terms``)."""
    terms: list[Term] = []
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12)
    quant = effective_quant(s)
    if s.method in (Method.QLORA, Method.LORA8BIT) and quant is not None:
        dq_passes = 3 if recomputes(s) else 2
        base = model.stored_block_params
        dtype = compute_dtype_bytes(s.precision)
        if quant is Quant.INT8:
            # the assumption reads 0.5 B per 4-bit weight; an int8 weight is 1 B (bnb rows)
            per_param, eff = a.dequant_bytes_per_param + 0.5, a.dequant_bandwidth_efficiency
            path, what = "micro-batch/dequantize", "LLM.int8 weights dequantized each pass"
        elif quant is Quant.GPTQ_INT4:
            per_param = 0.5 + _quant_constant_bytes(s) + dtype
            eff = a.dequant_bandwidth_efficiency
            path = "micro-batch/gptq-int4-kernels"
            what = ("GPTQ int4 (auto-gptq QuantLinear): packed int32 words and group scales "
                    "read, unpacked to the compute dtype for the GEMM, forward and backward; "
                    "efficiency fitted to Qwen's GPTQ Q-LoRA rows")
        else:
            per_param = 0.5 + _quant_constant_bytes(s) + dtype
            eff = a.nf4_dequant_bandwidth_efficiency
            path = f"micro-batch/{quant.value}-dequantize"
            what = ("bitsandbytes dequantize_4bit per linear and pass (MatMul4Bit forward and "
                    "backward): reads 0.5 B + absmax, writes the compute-dtype weight")
            if unsloth.fast_path(model, s):
                what = unsloth.DEQUANT_SOURCE
        terms.append(Term(
            path=path, value=dq_passes * base * per_param / (bandwidth * eff), unit="s",
            formula="passes x base params x bytes/param / (HBM bandwidth x efficiency)",
            inputs={"passes": dq_passes, "base_params": base, "bandwidth": bandwidth,
                    "bytes_per_param": round(per_param, 5), "efficiency": eff,
                    "quant": quant.value},
            source=what))
    if s.method is Method.DORA:
        adapted = _adapted_weight_params(model, s)
        terms.append(Term(
            path="micro-batch/dora-norms",
            value=(3 if recomputes(s) else 2) * adapted * a.dora_bytes_per_adapted_param
            / bandwidth,
            unit="s", formula="passes x adapted weights x bytes / HBM bandwidth",
            inputs={"adapted_params": adapted}, source="||W + BA|| recomputed each pass"))
    return terms


def offload_term(model: ModelShape, s: Strategy, a: ThroughputAssumptions,
                 compute_s: float) -> Term | None:
    """Parameters streamed from the host under ``--offload optimizer+params``: the bytes as
    stored (``stored_weight_bytes``: 4-bit weights move 0.5 B + constants), forward and
    backward, per rank; prefetched while the previous block computes, so only the excess over
    ``offload_prefetch_overlap`` x compute shows."""
    if s.offload is not Offload.OPTIMIZER_PARAMS:
        return None
    moved = 2 * stored_weight_bytes(model, s) / s.world_size
    copy_s = moved / a.host_link_bytes_per_s
    exposed = max(0.0, copy_s - a.offload_prefetch_overlap * compute_s)
    return Term(path="micro-batch/param-offload-exposed", value=exposed, unit="s",
                formula="max(0, 2 passes x stored param bytes / ranks / host link - overlap x "
                        "compute)",
                inputs={"bytes": round(moved), "copy_s": copy_s, "compute_s": compute_s,
                        "overlap": a.offload_prefetch_overlap},
                source="ZeRO-Infinity/FSDP offload streams parameters from host memory in "
                       "forward and backward, prefetching the next block's during compute")


def _host_seconds(model: ModelShape, s: Strategy,
                  a: ThroughputAssumptions) -> tuple[float, dict[str, object]]:
    """CPU time to issue one micro-batch: per block and pass, more with adapters and ZeRO-3."""
    from tuneplan.core.compute.throughput import adapted_linears

    passes = 4 if recomputes(s) else 3
    adapted = round(sum(lin.modules for lin in adapted_linears(model, s)) / model.num_layers)
    hooks = a.zero3_hook_s_per_layer_pass if s.sharding in SHARDED_PARAMS else 0.0
    per_pass = a.host_overhead_s_per_layer_pass + adapted * a.host_overhead_s_per_adapter_pass
    factor = a.compiled_host_overhead_factor if s.compile else 1.0
    seconds = model.num_layers * passes * (per_pass * factor + hooks)
    return seconds, {"host_s": seconds, "layers": model.num_layers, "passes": passes,
                     "adapted_linears_per_block": adapted, "shard_hook_s": hooks}


def _adapted_weight_params(model: ModelShape, s: Strategy) -> int:
    """Weights whose column norms DoRA recomputes: the adapted linears but fused experts,
    which get no magnitude vector (``core.job.methods``)."""
    from tuneplan.core.compute.throughput import adapted_linears

    return sum(lin.in_features * lin.out_features * lin.stored
               for lin in adapted_linears(model, s) if lin.role is not LinearRole.EXPERT)


def _optimizer_term(model: ModelShape, s: Strategy, gpu: GpuSpec,
                    a: ThroughputAssumptions, links: NodeLinks) -> Term:
    trainable = trainable_params(model, s)
    shards = s.world_size if s.sharding is not Sharding.DDP else 1
    per_rank = trainable / shards
    w = weight_bytes(s.precision)
    state = STATE_BYTES.get(s.optimizer, 8)
    if s.precision is Precision.BF16 and s.optimizer in (Optimizer.ADAMW, Optimizer.SGD,
                                                         Optimizer.LION):
        state //= 2  # pure bf16: torch creates the moments in the parameters' dtype
    if s.offload is not Offload.NONE:
        if links.host_vcpus:
            cores = links.host_vcpus / s.gpus
            rate, basis = cores * a.cpu_adam_params_per_s_per_core, f"{cores:g} vCPUs per rank"
        else:
            rate, basis = a.cpu_adam_params_per_s, "host vCPUs not stated"
        cpu_s = per_rank / rate
        copy_s = per_rank * (2 + w) / a.host_link_bytes_per_s
        return Term(path="step/optimizer-offloaded", value=cpu_s + copy_s, unit="s",
                    formula="params/rank / CPU Adam rate + (grad + weight bytes) / host link",
                    inputs={"params_per_rank": per_rank, "cpu_adam_params_per_s": rate,
                            "cpu_basis": basis, "cpu_s": cpu_s, "copy_s": copy_s},
                    source="DeepSpeed CPU Adam on the host's cores, after the backward")
    touched = 2 * w + compute_dtype_bytes(s.precision) + 2 * state
    # the memory model's state widths: under the HF Trainer an 8-bit optimizer keeps the
    # token embedding's states in fp32 (core/memory/optimizer.py trainer_fp32_embedding)
    fp32_embedding = _fp32_embedding(model, s) / shards
    extra = fp32_embedding * 2 * (STATE_BYTES["adamw"] - state)
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12)
    passes, impl = optimizer_passes(s, a)
    seconds = ((per_rank * touched + extra) * passes
               / (bandwidth * a.optimizer_bandwidth_efficiency))
    inputs: dict[str, object] = {"params_per_rank": per_rank, "bytes_per_param": touched,
                                 "optimizer": s.optimizer.value, "passes": round(passes, 4),
                                 **({"implementation": impl} if impl else {})}
    formula = "params/rank x (2w + g + 2 x state) bytes x passes / (HBM bw x eff)"
    if extra:
        inputs["fp32_state_embedding_per_rank"] = fp32_embedding
        formula = ("(params/rank x (2w + g + 2 x state) + embedding/rank x 2 x (8 - state)) "
                   "bytes x passes / (HBM bw x eff)")
    return Term(path="step/optimizer", value=seconds, unit="s", formula=formula,
                inputs=inputs, source="memory-bound optimizer step" + (
                    "; the token embedding's 8-bit state is fp32 (transformers 5.24 "
                    "Trainer.create_optimizer register_module_override)" if extra else ""))


#: The 32-bit optimizers the HF Trainer builds from bitsandbytes (paged_adamw_32bit,
#: lion_32bit): one kernel per tensor (``optimizer_update_32bit``) that reads p, g and the
#: states and writes p and the states once, as torch's fused AdamW does. The 8-bit blockwise
#: kernels also dequantize and requantize each state element against a 256-value code (a
#: search per element), more than their bytes: they keep the assumed ``optimizer_passes``
#: (counted as one pass they scored worse held out: benchmarks/README.md).
BNB_FUSED_OPTIMIZERS = frozenset({Optimizer.PAGED_ADAMW32BIT, Optimizer.LION})


def optimizer_passes(s: Strategy, a: ThroughputAssumptions) -> tuple[float, str]:
    """Passes over the optimizer's tensors per step and, for AdamW, the implementation they
    follow: the one the memory model's step temporaries follow (``core.job.versions.
    adamw_impl``), also under ZeRO without offload: the DeepSpeed config tuneplan writes names
    no optimizer (``core/launch/engines.py``), so DeepSpeed wraps the Trainer's own."""
    from tuneplan.core.job.versions import adamw_impl

    if s.optimizer in BNB_FUSED_OPTIMIZERS:
        return a.adamw_fused_passes, "bitsandbytes"
    if s.optimizer is not Optimizer.ADAMW:
        return a.optimizer_passes, ""
    impl = adamw_impl(s, None)
    return (a.adamw_fused_passes if impl == "fused" else a.adamw_unfused_passes), impl


def _fp32_embedding(model: ModelShape, s: Strategy) -> int:
    """Token-embedding elements whose 8-bit optimizer state is fp32 (the memory model's
    ``trainer_fp32_embedding``); 0 for methods the memory model does not count."""
    from tuneplan.core.memory.optimizer import (
        TRAINER_FP32_EMBEDDING_OPTIMIZERS,
        trainer_fp32_embedding,
    )

    if s.optimizer not in TRAINER_FP32_EMBEDDING_OPTIMIZERS or s.method not in ESTIMATED_METHODS:
        return 0
    return trainer_fp32_embedding(s, count_trainable(model.spec, s))


#: The step term of ``multi_node_efficiency``, the speed model's one fitted flat factor: a
#: share of the whole step, so ``Throughput.bound_seconds`` spreads it over the other terms'
#: bounds in proportion rather than calling it communication.
FITTED_SLOWDOWN = "step/multi-node-fitted-slowdown"


#: Golub & Van Loan, Matrix Computations (3rd ed.) §5.4.5: flops of a thin SVD (Σ, U1, V) of
#: an M x k matrix (M >= k): Golub-Reinsch 14·M·k² + 8·k³, R-SVD 6·M·k² + 20·k³ (LAPACK takes
#: the cheaper); the Householder bidiagonalisation inside is 4·M·k² - 4·k³/3, half of it
#: matrix-vector products (BLAS-2).
def svd_flops(rows: int, cols: int) -> tuple[float, float]:
    """(all flops, the bidiagonalisation's BLAS-2 half) of a thin SVD of a rows x cols matrix."""
    big, k = max(rows, cols), min(rows, cols)
    total = min(14 * big * k * k + 8 * k ** 3, 6 * big * k * k + 20 * k ** 3)
    return float(total), (4 * big * k * k - 4 * k ** 3 / 3) / 2


def _galore_terms(model: ModelShape, s: Strategy, gpu: GpuSpec,
                  a: ThroughputAssumptions) -> list[Term]:
    """A GaLore optimizer step (galore-torch 1.0, one replica: sharding is refused).

    - ``step/optimizer``: memory-bound as for other optimizers, but the states of a targeted
      (m, n) weight are r·max(m, n) elements, and its full-size update is written by
      ``project_back``, read and written by ``* scale``, read by ``p.add_`` (4·w more per
      element).
    - ``step/galore-projection``: ``project`` and ``project_back`` are two (m x n)·(n x r)
      products per targeted weight, 4·m·n·r flops, in the gradient's dtype (fp32 on CUDA
      cores under mixed precision: ``fp32_matmul_efficiency``; bf16 on tensor cores).
    - ``step/galore-svd-amortised``: every ``update_proj_gap`` steps an fp32
      ``torch.linalg.svd`` per targeted weight (``svd_flops``). Its BLAS-2 half is memory-
      bound (2 flops per 4-byte element read: HBM at ``optimizer_bandwidth_efficiency``), the
      rest runs at the fp32 rate (``fp32_matmul_efficiency``). A lower bound: cuSOLVER's k
      sequential Householder steps add launch latency this does not count.
    """
    from tuneplan.core.job.galore import effective_rank, galore_matrices

    targets = galore_matrices(model.spec, s)
    w, g = weight_bytes(s.precision), compute_dtype_bytes(s.precision)
    base = STATE_BYTES[s.optimizer.value]
    if s.precision is Precision.BF16 and s.optimizer is Optimizer.GALORE_ADAMW:
        base //= 2  # zeros_like(grad): bf16 moments on a pure-bf16 model
    trainable = trainable_params(model, s)
    targeted = sum(m * n * k for m, n, k in targets)
    low = sum(effective_rank(m, n, s.galore_rank) * max(m, n) * k for m, n, k in targets)
    touched = (trainable * (2 * w + g) + (trainable - targeted) * 2 * base
               + targeted * 4 * w + low * (2 * base + 6 * w))
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 1e12) * a.optimizer_bandwidth_efficiency
    fp32_rate = float(gpu.fp32_flops_per_s or 1e12) * a.fp32_matmul_efficiency
    if w == 4:
        proj_rate, basis = fp32_rate, "fp32 CUDA cores x fp32_matmul_efficiency"
    else:
        peak = float(gpu.bf16_flops_per_s or 1e12)
        eff, _ = matmul_efficiency(gpu, s.precision, peak, a, job_class(s))
        proj_rate, basis = peak * eff, "bf16 tensor cores x the step's matmul efficiency"
    flops = sum(4 * m * n * effective_rank(m, n, s.galore_rank) * k for m, n, k in targets)
    svd = [(svd_flops(m, n), k) for m, n, k in targets]
    svd_total = sum(f * k for (f, _), k in svd)
    svd_blas2 = sum(b * k for (_, b), k in svd)
    svd_s = (svd_blas2 * 2 / bandwidth + (svd_total - svd_blas2) / fp32_rate)
    src = "galore-torch 1.0 adamw.py / galore_projector.py (via transformers 5.24 optim galore_*)"
    return [
        Term(path="step/optimizer", value=touched * a.optimizer_passes / bandwidth, unit="s",
             formula="(params x (2w + g) + untargeted x 2 x state + targeted x 4w + "
                     "projected x (2 x state + 6w)) bytes x passes / (HBM bw x eff)",
             inputs={"params": trainable, "targeted_params": targeted,
                     "projected_elements": low, "state_bytes": base,
                     "optimizer": s.optimizer.value},
             source=src + ": memory-bound optimizer step"),
        Term(path="step/galore-projection", value=flops / proj_rate, unit="s",
             formula="Σ targeted 4·m·n·r flops / rate", inputs={
                 "flops": flops, "rank": s.galore_rank, "rate_flops_per_s": proj_rate,
                 "rate_basis": basis}, source=src + " project / project_back"),
        Term(path="step/galore-svd-amortised", value=svd_s / s.galore_update_proj_gap,
             unit="s", formula="(BLAS-2 flops x 2 B / (HBM bw x eff) + other SVD flops / fp32 "
                               "rate) / update_proj_gap",
             inputs={"svd_flops": svd_total, "blas2_flops": svd_blas2, "svd_s": svd_s,
                     "update_proj_gap": s.galore_update_proj_gap,
                     "bound": "lower (launch latency of the sequential steps not counted)"},
             source="Golub & Van Loan §5.4.5 SVD flop counts; galore_projector.py "
                    "get_orthogonal_matrix (fp32 torch.linalg.svd)"),
    ]


def step_time(*, model: ModelShape, strategy: Strategy, links: NodeLinks, gpu: GpuSpec,
              assumptions: ThroughputAssumptions, peak: float, micro_batch: MicroBatch
              ) -> tuple[Breakdown, Breakdown, float, list[str]]:
    """(step Breakdown in s, communication Breakdown in B, comm seconds, notes)."""
    a, s = assumptions, strategy
    if s.sharding not in KNOWN_SHARDING:
        raise UnsupportedError(f"unknown --sharding {s.sharding!r}")
    micro = _micro_batch_terms(model, s, gpu, a, peak, micro_batch)
    terms = [Term(path=t.path, value=t.value * s.grad_accum, unit="s",
                  formula=f"grad_accum x ({t.formula})",
                  inputs={**t.inputs, "grad_accum": s.grad_accum}, source=t.source)
             for t in micro]
    if s.optimizer.is_galore:
        terms += _galore_terms(model, s, gpu, a)
    else:
        terms.append(_optimizer_term(model, s, gpu, a, links))
    # the compute-bound part of a micro-batch: the window communication overlaps
    compute_s = sum(float(t.value) for t in micro if t.path in COMPUTE_TERMS)
    comm_term, comm, comm_s, fabric = _communication(model, s, links, gpu, a, compute_s)
    terms.append(comm_term)
    eff = a.multi_gpu_efficiency * (a.multi_node_efficiency if s.nodes > 1 else 1.0)
    if s.world_size > 1 and eff != 1.0:
        base = sum(t.value for t in terms)
        terms.append(Term(
            path=FITTED_SLOWDOWN, value=base * (1 / eff - 1), unit="s",
            formula="step x (1/efficiency - 1)",
            inputs={"efficiency": eff, "nodes": s.nodes, "fitted": True},
            source="fitted flat factor, not a physical term: multi_node_efficiency, fitted to "
                   "Qwen's only multi-node rows (2 x 2 A100, ZeRO-2 LoRA), which run in "
                   "proportion to compute slower than one node, beyond what any fabric's "
                   "bytes and latency explain; low confidence"))
    notes = [] if s.world_size == 1 else [
        f"fabric: {fabric.intra} inside a node"
        + (f", {s.nodes} nodes over {links.inter_node_basis(a)}" if s.nodes > 1 else "")]
    return Breakdown("s", tuple(terms)), comm, comm_s, notes


def gradient_wire_bytes(s: Strategy) -> int:
    """Bytes per trainable parameter of the gradients a step's collectives send, in the dtype
    each framework sends them. DDP all-reduces each parameter's ``.grad``, which has the
    parameter's dtype: fp32 masters under mixed precision (torch.amp keeps the parameters
    fp32; PEFT's adapters are fp32 by its ``autocast_adapter_dtype``), so 4 B unless pure
    bf16, with no compression hook registered by HF Trainer, accelerate or Lightning.
    DeepSpeed ZeRO sends ``communication_data_type``, which defaults to the engine's bf16/fp16
    (deepspeed 0.19.8 runtime/engine.py), and FSDP through accelerate reduces in its
    ``reduce_dtype``, the mixed-precision dtype (accelerate 1.16.0 utils/dataclasses.py
    ``FullyShardedDataParallelPlugin.set_mixed_precision``): the compute dtype."""
    if s.sharding is Sharding.DDP:
        return weight_bytes(s.precision)
    return compute_dtype_bytes(s.precision)


def gathering_passes(s: Strategy) -> int:
    """How often a sharded block's parameters are all-gathered per micro-batch: forward and
    backward, plus the recompute under DeepSpeed ZeRO-3 with activation checkpointing (the
    recomputed forward fires the module's pre-forward fetch again after the forward released
    the parameters: deepspeed/runtime/zero/parameter_offload.py, pre_sub_module_forward_function);
    FSDP recomputes inside the unit's backward, after its pre-backward all-gather, so twice.
    FSDP SHARD_GRAD_OP keeps the unit unsharded from forward to the end of its backward (torch
    FSDP1 ``_flat_param.NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``), so once; the next
    micro-batch's gather brings the updated shards, no separate gather after the step."""
    if s.sharding is Sharding.FSDP_GRAD_OP:
        return 1
    deepspeed = s.sharding in (Sharding.ZERO3,)
    return 3 if deepspeed and recomputes(s) else 2


def _communication(model: ModelShape, s: Strategy, links: NodeLinks, gpu: GpuSpec,
                   a: ThroughputAssumptions,
                   micro_matmul_s: float) -> tuple[Term, Breakdown, float, Fabric]:
    """Exposed communication per step, the bytes moved, their seconds, and the fabric."""
    fabric = node_fabric(
        interconnect=gpu.interconnect, interconnect_bytes_per_s=gpu.interconnect_bytes_per_s,
        pcie_gen=gpu.pcie_gen, gpus_per_node=s.gpus, nodes=s.nodes, intra=links.intra,
        inter_node_bytes_per_s=links.inter_node_bytes_per_s,
        inter_node_latency_s=links.inter_node_latency_s, assumptions=a)
    grad_dtype = gradient_wire_bytes(s)
    ranks = s.world_size
    # gathered parameters move as stored: QLoRA-FSDP shards the packed 4-bit weights
    # (bitsandbytes quant_storage), so a gather moves 0.5 B + constants per base weight
    passes = gathering_passes(s)
    comm = communication_per_step(
        sharding=s.sharding, ranks=ranks, grad_accum=s.grad_accum,
        param_bytes=round(stored_weight_bytes(model, s)),
        grad_bytes=trainable_params(model, s) * grad_dtype, passes_gathering=passes)
    collectives = collectives_per_step(sharding=s.sharding, ranks=ranks,
                                       grad_accum=s.grad_accum, num_layers=model.num_layers,
                                       passes_gathering=passes)
    latency = fabric.ring_latency_s(all_reduce=s.sharding is Sharding.DDP)
    comm_s = float(comm.total) / fabric.ring_bytes_per_s() + collectives * latency
    matmul_s = micro_matmul_s * s.grad_accum
    if s.sharding in PER_MICROBATCH_GRADS:
        window, share = matmul_s, a.overlap_fraction_sharded
    else:
        window, share = micro_matmul_s * 2 / 3, a.overlap_fraction_ddp
    exposed = max(0.0, comm_s - share * window)
    term = (Term(
        path="step/communication-exposed", value=exposed, unit="s",
        formula="max(0, comm - overlap x compute window)",
        inputs={"comm_s": comm_s, "overlap": share, "window_s": window, "fabric": fabric.intra,
                "ring_bytes_per_s": fabric.ring_bytes_per_s(), "collectives": collectives,
                "grad_bytes_per_param": grad_dtype,
                **({"inter_node": links.inter_node_basis(a)} if s.nodes > 1 else {}),
                "latency_per_collective_s": latency},
        source="bytes / slowest ring hop + NCCL's ring latency per collective (a base and a "
               "hop per step, the fabric's own across nodes), partly hidden by compute"))
    return term, comm, comm_s, fabric
