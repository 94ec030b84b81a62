"""Framework conventions that change memory: which dtype each tensor is kept in, loss defaults.

``precision_plan`` turns (recipe, precision, method, sharding) into byte widths, read from the
libraries: HF Trainer autocast + PEFT fp32 adapters (``autocast_adapter_dtype=True``) +
``prepare_model_for_kbit_training`` fp32 upcasts; torchtune pure bf16 with chunked loss;
LitGPT bf16-true vs bf16-mixed; Unsloth offloaded checkpoints + fused loss. No maths on sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from tuneplan.core.job.methods import Method, Quant, effective_quant

if TYPE_CHECKING:
    from tuneplan.core.job.strategy import Strategy


#: peft ``tuners/lora``: up to 0.5 ``update_layer`` builds A/B as fp32 ``nn.Linear`` and only
#: moves them to the base's device; 0.6 to 0.11 cast them to the base weight's dtype when it is
#: a float (``self.to(weight.device, dtype=weight.dtype)``); 0.12 adds
#: ``autocast_adapter_dtype=True`` (``tuners_utils._cast_adapter_dtype``: fp16/bf16 -> fp32).
PEFT_BASE_DTYPE = ((0, 6), (0, 12))


class Recipe(StrEnum):
    HF = "hf"
    TORCHTUNE = "torchtune"
    LITGPT = "litgpt"
    UNSLOTH = "unsloth"
    PLAIN = "plain"


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionPlan:
    """Bytes per element of each kind of tensor, and the conventions behind them."""

    frozen_weight_bytes: int      # frozen, unquantized base weights
    trainable_weight_bytes: int   # base weights that train (full, freeze, modules_to_save)
    adapter_bytes: int            # adapter tensors (LoRA A/B, IA3, prefix...)
    compute_bytes: int            # activations
    autocast: bool                # torch.autocast: fp32 weights get compute-dtype copies
    master_bytes: int             # extra fp32 master copy held by the optimizer (0 if none)
    state_bytes: int              # element width of 32-bit optimizer state
    kbit_upcast: bool             # PEFT prepare_model_for_kbit_training: non-4/8-bit params -> fp32
    fused_loss_default: bool      # chunked/fused cross-entropy unless --loss says otherwise
    why: str


def _sharded_mixed(strategy: Strategy) -> bool:
    """DeepSpeed (any ZeRO stage, even on one GPU) or FSDP on several GPUs: the module computes
    with half-precision parameters and the optimizer owns sharded fp32 copies."""
    name = strategy.sharding.value
    return name.startswith("zero") or (strategy.world_size > 1 and name != "ddp")


def peft_adapter_bytes(strategy: Strategy, compute_bytes: int) -> int:
    """Bytes per adapter element PEFT keeps (``PEFT_BASE_DTYPE``): fp32 before 0.6 and from 0.12
    (``autocast_adapter_dtype``), the base dtype in between - on a float base only: an 8/4-bit
    base weight has no float dtype, so its adapters stay fp32."""
    low, high = PEFT_BASE_DTYPE
    stack = strategy.stack
    between = stack.at_least("peft", low) and not stack.at_least("peft", high)
    return compute_bytes if between and effective_quant(strategy) is None else 4


def precision_plan(strategy: Strategy) -> PrecisionPlan:
    """Byte widths for ``strategy`` under its recipe (see module docstring for sources)."""
    recipe, precision, method = strategy.recipe, strategy.precision, strategy.method
    c = precision.compute_bytes
    if recipe is Recipe.TORCHTUNE:
        # torchtune: model built in cfg.dtype (bf16), LoRA params too, AdamW state like params.
        return PrecisionPlan(frozen_weight_bytes=c, trainable_weight_bytes=c, adapter_bytes=c,
                             compute_bytes=c, autocast=False, master_bytes=0, state_bytes=c,
                             kbit_upcast=False, fused_loss_default=True,
                             why="torchtune: every tensor in the recipe dtype, no autocast")
    mixed = precision.is_mixed
    full = method.trains_base
    trainable = 4 if (mixed and full) else c
    # PEFT keeps adapters fp32 on a bf16/fp16 base (peft_adapter_bytes: by the stated peft);
    # Unsloth and LitGPT build adapters in the model dtype.
    adapter = peft_adapter_bytes(strategy, c) if recipe in (Recipe.HF, Recipe.PLAIN) else (
        4 if mixed else c)
    master = 0
    if _sharded_mixed(strategy) and mixed:
        # DeepSpeed bf16/fp16 casts the whole module (adapters included) to half precision and
        # keeps an fp32 master copy + fp32 states, sharded (engine: module.bfloat16()); FSDP
        # MixedPrecision gathers bf16 parameters from fp32 shards: the same 2 + 4 (+ states).
        trainable, master, adapter = 2, 4, 2
    state = 4 if master else (trainable if full else adapter)
    # prepare_model_for_kbit_training skips the fp32 upcast on GPTQ-quantized models.
    kbit = recipe is Recipe.HF and method in (Method.QLORA, Method.LORA8BIT) and not (
        method is Method.QLORA and strategy.quant is Quant.GPTQ_INT4)
    # LitGPT bf16-mixed (Fabric MixedPrecision) keeps the whole module in fp32, frozen base too.
    frozen = 4 if (recipe is Recipe.LITGPT and mixed) else c
    return PrecisionPlan(
        frozen_weight_bytes=frozen, trainable_weight_bytes=trainable,
        adapter_bytes=adapter, compute_bytes=c, autocast=mixed and not master,
        master_bytes=master, state_bytes=state, kbit_upcast=kbit,
        fused_loss_default=recipe in (Recipe.UNSLOTH, Recipe.LITGPT),
        why=f"{recipe.value}: {precision.value}" + (", fp32 master weights" if master else ""))

