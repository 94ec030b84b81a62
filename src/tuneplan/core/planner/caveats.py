"""Card facts that change what a plan or a fit report says: the precision a card trains in
(and why), pure bf16 without BF16, bitsandbytes on AMD and older NVIDIA cards. (Model caveats
that make a strategy impossible, such as Gemma-2's soft-capping under SDPA, are the
estimator's refusals: ``core/memory/refusals.py``.)

One place for these facts: ``search`` picks the precision through ``precision_on``, ``costing``
turns ``card_notes`` into plan warnings, ``fit`` shows both, ``plan`` and ``fit`` refuse with
``card_problem``. Pure: a GPU spec and a strategy in, sentences out.

Sources (library files at the versions named):

- HF Trainer ``fp16=True`` (transformers 5.24 ``training_args.py``: ``mixed_precision = "fp16"``)
  runs accelerate's native AMP (accelerate 1.15 ``accelerator.py``: ``native_amp`` with a
  ``GradScaler``): weights stay in the dtype they were loaded in, autocast makes fp16 copies
  for the matmuls, and the scaler unscales the gradients before the step. The gradients of
  fp16 *parameters* are refused there (torch 2.13 ``amp/grad_scaler.py``: "Attempting to
  unscale FP16 gradients."), so full fine-tuning under fp16 keeps fp32 weights, and LoRA keeps
  fp32 adapters (PEFT ``autocast_adapter_dtype=True``) over an fp16 base.
- bitsandbytes 0.50.0 ``docs/source/installation.mdx``: LLM.int8() needs compute capability
  7.5+, 8-bit optimizers and NF4/FP4 6.0+; the PyPI wheels carry ROCm builds for the AMD
  targets in ``BNB_ROCM_TARGETS`` (with a ROCm build of PyTorch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.job.methods import Quant, effective_quant
from tuneplan.core.job.recipes import precision_plan
from tuneplan.core.job.strategy import Attention, Job, Optimizer, Precision, Strategy
from tuneplan.core.memory.refusals import SOFTCAP_MODEL_TYPES
from tuneplan.core.models import ModelSpec

#: AMD targets of bitsandbytes 0.50.0's PyPI wheels (Linux x86-64), with the ROCm builds that
#: carry them (bitsandbytes 0.50.0 docs/source/installation.mdx, "AMD ROCm", "Installation
#: from PyPI"). A target outside this table has no prebuilt kernel.
BNB_ROCM_TARGETS: dict[str, str] = {
    "gfx90a": "ROCm 6.4.4 to 7.14.0 builds",
    "gfx942": "ROCm 6.4.4 to 7.14.0 builds",
    "gfx950": "ROCm 7.0.2 and later builds",
    "gfx908": "the ROCm 7.14.0 build only",
    **{f"gfx{n}": "ROCm 6.4.4 to 7.14.0 builds" for n in (
        "1100", "1101", "1102", "1103", "1150", "1151", "1152", "1153", "1200", "1201")},
    **{f"gfx{n}": "the ROCm 7.14.0 build only" for n in (
        "1030", "1031", "1032", "1033", "1034", "1035", "1036")},
}
BNB_VERSION = "bitsandbytes 0.50.0"

#: flash-attn 2's CUDA kernels are built for Ampere and newer only: its README ("FlashAttention-2
#: with CUDA currently supports: Ampere, Ada, or Hopper GPUs", Turing pointed to a separate
#: project) and setup.py, whose kernel sources are all ``*_sm80.cu``. Compute capability 8.0+.
FLASH_ATTN_MIN_CAPABILITY = 8.0
#: PyTorch's CUDA 12.8 and later wheels, PyPI's default from PyTorch 2.8, carry kernels for
#: compute capability 7.5 and newer only; its CUDA 12.6 wheels keep 5.0 to 9.0 (the 2.8/2.9
#: release plan on PyTorch's GitHub tracker, "Delete support for Maxwell, Pascal, and Volta
#: architectures for CUDA 12.8 and 12.9 builds").
TORCH_DEFAULT_WHEEL_MIN_CAPABILITY = 7.5
#: CUDA 12.0 removed the Kepler targets sm_35 and sm_37 (CUDA 12.0 release notes; LLVM's CUDA
#: support table, llvm-project D152027): a card below 5.0 runs only CUDA 11 builds of PyTorch.
CUDA12_MIN_CAPABILITY = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionChoice:
    """The precision asked for, the one the card trains in, why, and the tensor layout."""

    requested: Precision
    chosen: Precision
    why: str
    layout: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"requested": self.requested.value, "chosen": self.chosen.value,
                "why": self.why, "layout": self.layout}


def precision_on(gpu: GpuSpec, precision: Precision) -> PrecisionChoice:
    """The precision ``gpu`` trains in when ``precision`` is asked for: bf16-mixed becomes
    fp16-mixed with dynamic loss scaling on a card without BF16; pure bf16 stays (and
    ``card_problem`` refuses it there)."""
    if gpu.supports_bf16 is False and precision is Precision.BF16_MIXED:
        return PrecisionChoice(
            requested=precision, chosen=Precision.FP16_MIXED,
            why=(f"{gpu.name} has no BF16 ({_plain(gpu.architecture)}): plans FP16 mixed precision "
                 "with dynamic loss scaling (HF Trainer fp16=True / accelerate "
                 "mixed_precision fp16, DeepSpeed fp16 loss_scale 0); fp16's narrower range "
                 "can overflow on some models"))
    if gpu.supports_bf16 is False and precision is Precision.BF16:
        return PrecisionChoice(requested=precision, chosen=precision,
                               why=f"{gpu.name} has no BF16: pure bf16 cannot run on it")
    if precision is Precision.FP16_MIXED:
        return PrecisionChoice(requested=precision, chosen=precision,
                               why="FP16 mixed precision as asked, with dynamic loss scaling")
    return PrecisionChoice(requested=precision, chosen=precision,
                           why=f"{precision.value} as asked"
                               + (f" ({gpu.name} has BF16)" if gpu.supports_bf16 else ""))


def with_layout(choice: PrecisionChoice, strategy: Strategy) -> PrecisionChoice:
    """``choice`` with the tensor layout its memory estimate assumes for ``strategy`` (read
    from ``core.job.recipes.precision_plan``, the estimate's own widths)."""
    s = replace(strategy, precision=choice.chosen)
    plan = precision_plan(s)
    half = "fp16" if choice.chosen is Precision.FP16_MIXED else (
        "fp32" if choice.chosen is Precision.FP32 else "bf16")
    width = {4: "fp32", 2: half, 1: "8-bit"}
    if plan.master_bytes:
        weights = (f"{width[plan.trainable_weight_bytes]} module weights with an fp32 master "
                   f"copy and fp32 optimizer state in the sharded optimizer (DeepSpeed/FSDP)")
    elif s.method.trains_base:
        weights = (f"{width[plan.trainable_weight_bytes]} trainable weights (the optimizer's "
                   "masters)" + (f" with {half} autocast copies for the matmuls"
                                 if plan.autocast else ""))
    else:
        quant = effective_quant(s)
        base = (f"{quant.value} quantized base (compute dtype "
                f"{width[plan.compute_bytes]})" if quant is not None
                else f"{width[plan.frozen_weight_bytes]} frozen base weights")
        weights = (f"{base}, {width[plan.adapter_bytes]} adapters"
                   + (" (PEFT autocast_adapter_dtype)" if plan.adapter_bytes == 4 else ""))
    return PrecisionChoice(requested=choice.requested, chosen=choice.chosen, why=choice.why,
                           layout=f"{weights}; activations in {width[plan.compute_bytes]}")


def _plain(text: str) -> str:
    return text.replace("(", "").replace(")", "")


def bitsandbytes_use(strategy: Strategy) -> str | None:
    """What in ``strategy`` runs on bitsandbytes, in words; None when nothing does."""
    quant = effective_quant(strategy)
    parts = []
    if quant in (Quant.NF4, Quant.FP4):
        parts.append(f"{quant.value} 4-bit base weights")
    elif quant is Quant.INT8:
        parts.append("LLM.int8() base weights")
    if strategy.optimizer.is_8bit or strategy.optimizer is Optimizer.PAGED_ADAMW32BIT:
        parts.append(f"the {strategy.optimizer.value} optimizer")
    return " and ".join(parts) or None


def _is_amd(gpu: GpuSpec) -> bool:
    return gpu.vendor.strip().upper() == "AMD"


def _capability(gpu: GpuSpec) -> float | None:
    try:
        return float(gpu.compute_capability or "")
    except ValueError:
        return None


def _nvidia_capability(gpu: GpuSpec) -> float | None:
    return _capability(gpu) if gpu.vendor.strip().upper() == "NVIDIA" else None


def card_problem(strategy: Strategy, gpu: GpuSpec) -> str | None:
    """Why ``gpu`` cannot run ``strategy`` at all for a card fact (pure bf16 without BF16;
    flash-attn 2 before Ampere; bitsandbytes has no kernel for it), or None."""
    if gpu.supports_bf16 is False and strategy.precision is Precision.BF16:
        return (f"no BF16 on {gpu.name}: pure bf16 training needs it "
                "(--precision fp16-mixed would run)")
    cc = _nvidia_capability(gpu)
    if (strategy.attention is Attention.FLASH and cc is not None
            and cc < FLASH_ATTN_MIN_CAPABILITY):
        return (f"--attention flash needs flash-attn 2, whose CUDA kernels need compute "
                f"capability {FLASH_ATTN_MIN_CAPABILITY:.1f}+ (Ampere or newer); {gpu.name} is "
                f"{gpu.compute_capability}: use --attention sdpa")
    use = bitsandbytes_use(strategy)
    if use is None:
        return None
    if _is_amd(gpu):
        target = (gpu.compute_capability or "").lower()
        if target not in BNB_ROCM_TARGETS:
            return (f"{use} need bitsandbytes, which has no ROCm kernel for {gpu.name} "
                    f"({target or 'unknown target'}) in {BNB_VERSION}; use --method lora "
                    "and --optimizer adamw")
        return None
    if cc is None:
        return None
    if effective_quant(strategy) is Quant.INT8 and cc < 7.5:
        return (f"LLM.int8() (lora8bit) needs compute capability 7.5+, {gpu.name} is "
                f"{gpu.compute_capability} ({BNB_VERSION}); use --method qlora or lora")
    if cc < 6.0:
        return (f"{use} need compute capability 6.0+ in {BNB_VERSION}, {gpu.name} is "
                f"{gpu.compute_capability}")
    return None


def card_notes(strategy: Strategy, gpu: GpuSpec) -> list[str]:
    """Things to know about running ``strategy`` on ``gpu`` (each one line): the precision it
    trains in where that differs from the one asked, the PyTorch build an old NVIDIA card
    needs, and bitsandbytes on AMD."""
    out: list[str] = []
    if gpu.supports_bf16 is False and strategy.precision.is_mixed:
        # fp16-mixed here is what a bf16-mixed job becomes (or was asked): the same sentence.
        why = precision_on(gpu, Precision.BF16_MIXED).why
        out.append(f"no BF16 on {gpu.name}: " + why.split(": ", 1)[1])
    cc = _nvidia_capability(gpu)
    if cc is not None and cc < CUDA12_MIN_CAPABILITY:
        out.append(f"{gpu.name} is compute capability {gpu.compute_capability} (Kepler), which "
                   "CUDA 12 dropped: the machine image needs a PyTorch built for CUDA 11")
    elif cc is not None and cc < TORCH_DEFAULT_WHEEL_MIN_CAPABILITY:
        out.append(f"{gpu.name} is compute capability {gpu.compute_capability}, below the "
                   f"{TORCH_DEFAULT_WHEEL_MIN_CAPABILITY:.1f} that PyTorch's CUDA 12.8+ wheels "
                   "(the PyPI default since 2.8) are built for: the machine image needs a "
                   "PyTorch built for CUDA 12.6 or older")
    use = bitsandbytes_use(strategy)
    if use is not None and _is_amd(gpu) and card_problem(strategy, gpu) is None:
        target = (gpu.compute_capability or "").lower()
        out.append(f"{use} on AMD {gpu.name} ({target}): needs PyTorch for ROCm and a ROCm "
                   f"build of bitsandbytes ({BNB_VERSION} PyPI wheels: "
                   f"{BNB_ROCM_TARGETS[target]})")
    return out


def model_defaults(model: ModelSpec, job: Job) -> tuple[Job, tuple[str, ...]]:
    """``job`` with the settings ``model`` needs where the person left them free, and a note
    for each: a soft-capping model (Gemma-2) trains with eager attention, since transformers
    refuses SDPA for it (``SOFTCAP_MODEL_TYPES``); a given ``--attention`` is kept (and
    refused by the estimate if it is SDPA)."""
    s = job.strategy
    if (model.model_type in SOFTCAP_MODEL_TYPES and s.attention is Attention.SDPA
            and not job.is_fixed("attention")):
        note = (f"{model.model_type} caps its attention logits (soft-capping), which SDPA "
                "cannot do: planned with eager attention (--attention flash also works with "
                "flash-attn 2.6+)")
        return replace(job, strategy=replace(s, attention=Attention.EAGER)), (note,)
    return job, ()
