"""Model weights in their stored format: bf16/fp16/fp32, NF4/FP4 with block constants (with
or without nested quantization), LLM.int8 with row scales, PEFT's fp32 upcasts, adapters.

Sources: bitsandbytes ``quantize_4bit`` (blocksize 64, fp32 absmax; ``compress_statistics``
stores absmax as uint8 with a 256-block fp32 second level), ``Int8Params`` (int8 + fp32 SCB per
row), PEFT ``prepare_model_for_kbit_training`` (every non-4/8-bit parameter cast to fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.job import Strategy
from tuneplan.core.memory.assumptions import MemoryAssumptions
from tuneplan.core.memory.parts import part
from tuneplan.core.methods import Method, Quant, Trainable, effective_quant
from tuneplan.core.models import LinearRole, ModelSpec
from tuneplan.core.recipes import PrecisionPlan
from tuneplan.explain import Term


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamSplit:
    """Where the model's parameters go: quantizable block linears, and everything else."""

    total: int
    quantizable: int            # non-expert block linear weights (bnb replaces nn.Linear)
    quantizable_rows: int       # sum of out_features over them (int8 row scales)
    block_linear: int           # all block linear weights (autocast copies)
    largest_linear: int         # biggest single (non-expert) linear weight


def split_params(model: ModelSpec) -> ParamSplit:
    quant = rows = linear = largest = 0
    for layer in model.layers:
        for lin in layer.linears:
            linear += lin.weight_params * layer.count
            if lin.role is LinearRole.EXPERT:
                continue
            quant += lin.weight_params * layer.count
            rows += lin.out_features * lin.copies * layer.count
            largest = max(largest, lin.in_features * lin.out_features)
    total = model.embedding_params + model.final_norm_params + model.head_params + sum(
        layer.params * layer.count for layer in model.layers)
    return ParamSplit(total=total, quantizable=quant, quantizable_rows=rows, block_linear=linear,
                      largest_linear=largest)


def quantized_bytes(n: int, rows: int, quant: Quant, double_quant: bool,
                    a: MemoryAssumptions) -> tuple[int, int]:
    """(packed weight bytes, constant bytes) for ``n`` weights in ``rows`` output rows."""
    if quant is Quant.INT8:
        return n, rows * 4
    blocks = -(-n // a.nf4_blocksize)
    nested = blocks + -(-blocks // a.nested_blocksize) * 4 + 256 * 4
    consts = nested if double_quant else blocks * 4
    return -(-n // 2), consts


def weight_terms(model: ModelSpec, strategy: Strategy, plan: PrecisionPlan,
                 trainable: Trainable, a: MemoryAssumptions) -> list[Term]:
    """Terms for every stored weight byte on one (unsharded) replica."""
    split = split_params(model)
    quant = effective_quant(strategy)
    terms: list[Term] = []
    rest = split.total
    if quant is not None:
        packed, consts = quantized_bytes(split.quantizable, split.quantizable_rows, quant,
                                         strategy.double_quant, a)
        src = "bitsandbytes Linear4bit/Linear8bitLt"
        terms.append(part("weights/quantized", packed, f"{quant.value}: block linear weights "
                          f"{'n' if quant is Quant.INT8 else 'n/2'} bytes", src,
                          params=split.quantizable))
        terms.append(part("weights/quant_constants", consts,
                          "int8: 4 B per row" if quant is Quant.INT8 else
                          ("nested: n/64 + n/64/256·4 + code table" if strategy.double_quant
                           else "absmax fp32: n/64·4"), src, params=split.quantizable,
                          double_quant=strategy.double_quant))
        rest -= split.quantizable
        width = 4 if plan.kbit_upcast else plan.frozen_weight_bytes
        terms.append(part("weights/unquantized", rest * width,
                          "embeddings, head, norms, biases, experts · bytes"
                          + (" (fp32: prepare_model_for_kbit_training)"
                             if plan.kbit_upcast else ""),
                          "peft prepare_model_for_kbit_training" if plan.kbit_upcast else "",
                          params=rest, bytes_per_param=width))
    elif strategy.method is Method.FULL:
        terms.append(part("weights/trainable", split.total * plan.trainable_weight_bytes,
                          "all parameters · bytes", params=split.total,
                          bytes_per_param=plan.trainable_weight_bytes))
    else:
        frozen = split.total - (trainable.base_params if strategy.method is Method.FREEZE else 0)
        terms.append(part("weights/frozen", frozen * plan.frozen_weight_bytes,
                          "frozen parameters · bytes", params=frozen,
                          bytes_per_param=plan.frozen_weight_bytes))
        if strategy.method is Method.FREEZE:
            trainable_bytes = trainable.base_params * plan.trainable_weight_bytes
            terms.append(part("weights/trainable", trainable_bytes,
                              "trainable blocks · bytes", params=trainable.base_params))
    if strategy.method is not Method.FULL and strategy.method is not Method.FREEZE:
        if trainable.base_params:
            terms.append(part("weights/modules_to_save", trainable.base_params *
                              plan.trainable_weight_bytes, "PEFT modules_to_save copies · bytes",
                              params=trainable.base_params))
        terms.append(part("weights/adapters", trainable.adapter_params * plan.adapter_bytes,
                          "adapter parameters · adapter bytes", "peft autocast_adapter_dtype",
                          params=trainable.adapter_params, bytes_per_param=plan.adapter_bytes))
    return terms
