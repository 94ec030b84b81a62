"""Model weights in their stored format: bf16/fp16/fp32, NF4/FP4 with block constants (with
or without nested quantization), LLM.int8 with row scales, PEFT's fp32 upcasts, adapters.

Sources: bitsandbytes ``quantize_4bit`` (blocksize 64, fp32 absmax; ``compress_statistics``
stores absmax as uint8 with a 256-block fp32 second level), ``Int8Params`` (int8 + fp32 SCB per
row), GPTQ int4 (group 128), PEFT ``prepare_model_for_kbit_training`` (every non-4/8-bit
parameter cast to fp32, except on GPTQ models).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.job.methods import (
    ROUTER_MODULES,
    Method,
    Quant,
    Trainable,
    count_params,
    effective_quant,
)
from tuneplan.core.job.recipes import PrecisionPlan, Recipe
from tuneplan.core.job.stack import version_text
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.job.tuners import frozen_buffers
from tuneplan.core.job.versions import experts_are_linear
from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.parts import Piece, part
from tuneplan.core.models import LinearRole, ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamSplit:
    """Where the model's parameters go: quantizable block linears, and everything else."""

    total: int
    quantizable: int            # non-expert block linear weights (bnb replaces nn.Linear)
    quantizable_rows: int       # sum of out_features over them (int8 row scales)
    quantizable_cols: int       # sum of in_features over them (GPTQ g_idx)
    quantizable_tensors: int    # how many such weight tensors (per-tensor code tables)
    block_linear: int           # all block linear weights (autocast copies)
    largest_linear: int         # biggest single (non-expert) linear weight


def head_quantized(model: ModelSpec, strategy: Strategy) -> bool:
    """LitGPT's QLoRA: Lightning's ``BitsandbytesPrecision.convert_module`` replaces every
    ``nn.Linear``, the (untied) ``lm_head`` included (lightning 2.6
    fabric/plugins/precision/bitsandbytes.py; litgpt finetune/lora.py passes no
    ``ignore_modules``). transformers' bitsandbytes integration keeps the head dense."""
    quant = effective_quant(strategy)
    return (strategy.recipe is Recipe.LITGPT and quant in (Quant.NF4, Quant.FP4, Quant.INT8)
            and not model.tie_word_embeddings)


def split_params(model: ModelSpec, experts_quantized: bool = False,
                 head: bool = False) -> ParamSplit:
    """``experts_quantized``: routed experts and routers are ``nn.Linear`` modules
    bitsandbytes replaces (transformers 4.x, ``versions.experts_are_linear``); otherwise
    (transformers 5) neither is quantizable. The largest linear stays a dense one.
    ``head``: the output head is quantized too (``head_quantized``)."""
    quant = rows = cols = linear = largest = tensors = 0
    if head:
        width = model.head_in_features or model.hidden_size
        quant, rows, cols, tensors = model.vocab_size * width, model.vocab_size, width, 1
        largest = model.vocab_size * width
    for layer in model.layers:
        for lin in layer.linears:
            linear += lin.weight_params * layer.count
            if lin.role is LinearRole.EXPERT:
                if experts_quantized:  # one nn.Linear (and QuantState) per expert
                    quant += lin.weight_params * layer.count
                    rows += lin.out_features * lin.copies * layer.count
                    cols += lin.in_features * lin.copies * layer.count
                    tensors += lin.copies * layer.count
                continue
            if lin.role is LinearRole.ROUTER and (
                    not experts_quantized or model.per_expert_linears) and \
                    lin.name.rsplit(".", 1)[-1] in ROUTER_MODULES:
                continue  # transformers 5 or remote code (MoEGate): a module, not nn.Linear
            quant += lin.weight_params * layer.count
            rows += lin.out_features * lin.copies * layer.count
            cols += lin.in_features * lin.copies * layer.count
            tensors += lin.copies * layer.count
            largest = max(largest, lin.in_features * lin.out_features)
    return ParamSplit(total=count_params(model), quantizable=quant, quantizable_rows=rows,
                      quantizable_cols=cols, quantizable_tensors=tensors, block_linear=linear,
                      largest_linear=largest)


def quantized_bytes(n: int, rows: int, quant: Quant, double_quant: bool,
                    a: MemoryAssumptions, tensors: int = 1, cols: int = 0) -> tuple[int, int]:
    """(packed weight bytes, constant bytes) for ``n`` weights in ``rows`` output rows, held
    in ``tensors`` weight tensors (each QuantState keeps a 16-entry fp32 code; a nested one
    also a 256-entry fp32 code, an fp32 offset and a partly filled last 256-block)."""
    if quant is Quant.INT8:
        return n, rows * 4
    if quant is Quant.GPTQ_INT4:
        # auto-gptq QuantLinear: qweight int32 (8 weights each), per group of g inputs an fp16
        # scale and a packed 4-bit zero per output, and an int32 g_idx per input feature.
        groups = -(-n // a.gptq_group_size)
        return -(-n // 2), groups * 2 + -(-groups // 2) + cols * 4
    blocks = -(-n // a.nf4_blocksize)
    nested = blocks + (blocks // a.nested_blocksize + tensors) * 4 + tensors * (1024 + 4)
    consts = (nested if double_quant else blocks * 4) + tensors * 64
    return -(-n // 2), consts


def weight_terms(model: ModelSpec, strategy: Strategy, plan: PrecisionPlan,
                 trainable: Trainable, a: MemoryAssumptions) -> list[Piece]:
    """Terms for every stored weight byte on one (unsharded) replica."""
    quant = effective_quant(strategy)
    split = split_params(model, quant is not None and quant is not Quant.GPTQ_INT4
                         and experts_are_linear(model, strategy), head_quantized(model, strategy))
    if quant is not None:
        terms = _quantized_terms(split, strategy, plan, quant, a, model.num_experts > 0,
                                 experts_are_linear(model, strategy))
    elif strategy.method in (Method.FULL, Method.LISA):
        # LISA: any block may be the next to train, so every weight is loaded as a trainable
        # one (fp32 under mixed precision), not only the blocks training now
        terms = [part("weights/trainable", split.total * plan.trainable_weight_bytes,
                      "all parameters · bytes" + (" (lisa: any block may train next)"
                                                  if strategy.method is Method.LISA else ""),
                      params=split.total, bytes_per_param=plan.trainable_weight_bytes)]
    else:
        frozen = split.total - (trainable.base_params if strategy.method is Method.FREEZE else 0)
        terms = [part("weights/frozen", frozen * plan.frozen_weight_bytes,
                      "frozen parameters · bytes", params=frozen,
                      bytes_per_param=plan.frozen_weight_bytes)]
        if strategy.method is Method.FREEZE:
            terms.append(part("weights/trainable",
                              trainable.base_params * plan.trainable_weight_bytes,
                              "trainable blocks · bytes", params=trainable.base_params))
    if strategy.method.trains_base:
        return terms
    if trainable.base_params:
        terms.append(part("weights/modules_to_save", trainable.base_params *
                          plan.trainable_weight_bytes, "PEFT modules_to_save copies · bytes",
                          params=trainable.base_params))
    terms.append(part("weights/adapters", trainable.adapter_params * plan.adapter_bytes,
                      "adapter parameters · adapter bytes",
                      f"peft {version_text(strategy.stack.peft)} adapter dtype "
                      "(recipes.peft_adapter_bytes)",
                      params=trainable.adapter_params, bytes_per_param=plan.adapter_bytes))
    buffers, what = frozen_buffers(model, strategy)
    if buffers:
        terms.append(part("weights/adapter_buffers", buffers, what,
                          f"peft {version_text(strategy.stack.peft)} register_buffer in the "
                          "tuner's layer.py/model.py"))
    return terms


def _quantized_terms(split: ParamSplit, strategy: Strategy, plan: PrecisionPlan, quant: Quant,
                     a: MemoryAssumptions, moe: bool = False,
                     experts_linear: bool = False) -> list[Piece]:
    """Packed block linears, their constants, and everything left unquantized."""
    packed, consts = quantized_bytes(split.quantizable, split.quantizable_rows, quant,
                                     strategy.double_quant, a, split.quantizable_tensors,
                                     split.quantizable_cols)
    src = "auto-gptq QuantLinear" if quant is Quant.GPTQ_INT4 else \
        "bitsandbytes Linear4bit/Linear8bitLt"
    linear_experts = moe and quant is not Quant.GPTQ_INT4 and experts_linear
    if moe:
        src += ("; routed experts are nn.Linear (transformers 4.x or the model's own "
                "modeling code), quantized too"
                if linear_experts else "; transformers 5: fused experts stay unquantized")
    rest = split.total - split.quantizable
    width = 4 if plan.kbit_upcast else plan.frozen_weight_bytes
    if quant is Quant.INT8:
        const_formula = "int8: 4 B per row"
    elif quant is Quant.GPTQ_INT4:
        const_formula = "gptq: n/g·2 (fp16 scales) + n/g/2 (4-bit zeros) + 4 B per input (g_idx)"
    elif strategy.double_quant:
        const_formula = "nested: n/64 + n/64/256·4 + code table"
    else:
        const_formula = "absmax fp32: n/64·4"
    return [
        part("weights/quantized", packed, f"{quant.value}: block linear weights "
             f"{'n' if quant is Quant.INT8 else 'n/2'} bytes", src, params=split.quantizable),
        part("weights/quant_constants", consts, const_formula, src, params=split.quantizable,
             double_quant=strategy.double_quant),
        part("weights/unquantized", rest * width,
             "embeddings, head, norms, biases" + ("" if linear_experts else ", experts")
             + " · bytes"
             + (" (fp32: prepare_model_for_kbit_training)" if plan.kbit_upcast else ""),
             "peft prepare_model_for_kbit_training" if plan.kbit_upcast else "",
             params=rest, bytes_per_param=width),
    ]
