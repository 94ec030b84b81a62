"""Gradients, optimizer state, fp32 master weights and the optimizer-step temporary.

torch AdamW keeps exp_avg and exp_avg_sq like each parameter (so bf16 on pure-bf16 models);
bitsandbytes 8-bit optimizers keep uint8 states with fp32 absmax per 256 elements (tensors under
4096 elements stay 32-bit); transformers Adafactor keeps factored row+column second moments and
no first moment by default; SGD momentum and Lion keep one state. Sharding is applied elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.job.methods import Trainable
from tuneplan.core.job.recipes import PrecisionPlan
from tuneplan.core.job.strategy import Optimizer, Strategy
from tuneplan.core.job.versions import adamw_impl
from tuneplan.core.memory.assumptions import MemoryAssumptions


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerBytes:
    grads: int
    grad_largest: int         # one tensor's gradient (optimizer in backward)
    states: int
    master: int
    step_temp: int
    formula: str
    impl: str = "fused"       # the AdamW implementation step_temp follows


def _state_elements(opt: Optimizer, trainable: Trainable, width: int,
                    a: MemoryAssumptions) -> tuple[int, str]:
    n = trainable.total
    if opt in (Optimizer.ADAMW, Optimizer.PAGED_ADAMW32BIT):
        return 2 * n * width, "2 states (exp_avg, exp_avg_sq) · trainable · state bytes"
    if opt in (Optimizer.SGD, Optimizer.LION):
        return n * width, "1 state (momentum / exp_avg) · trainable · state bytes"
    if opt is Optimizer.ADAFACTOR:
        mats = sum((r + c) * k for r, c, k in trainable.matrices if r > 1)
        flat = n - sum(r * c * k for r, c, k in trainable.matrices if r > 1)
        return (mats + flat) * 4, ("factored second moment: (rows + cols)·4 per matrix, "
                                   "4·n for vectors")
    big = sum(r * c * k for r, c, k in trainable.matrices if r * c >= a.optim8bit_min_size)
    small = n - big
    per_big = 2 + 2 * 4 / a.optim8bit_blocksize
    return int(big * per_big) + small * 2 * 4, ("8-bit: 2 B + 2·4/256 B per element; "
                                                 "small tensors 8 B")


def optimizer_bytes(strategy: Strategy, plan: PrecisionPlan, trainable: Trainable,
                    a: MemoryAssumptions) -> OptimizerBytes:
    """Unsharded bytes of gradients, states, master weights and step temporary."""
    grads = (trainable.base_params * plan.trainable_weight_bytes
             + trainable.adapter_params * plan.adapter_bytes)
    width = 4 if plan.master_bytes else plan.state_bytes
    states, formula = _state_elements(strategy.optimizer, trainable, width, a)
    master = trainable.total * plan.master_bytes
    impl = adamw_impl(strategy, a.adamw_impl)
    if (strategy.optimizer is not Optimizer.ADAMW or impl == "fused"
            or strategy.optimizer_in_backward):
        temp = 0
    elif impl == "foreach":
        temp = trainable.total * width
    elif impl == "hf":
        # transformers AdamW (optimization.py, 4.30): one tensor at a time, one temporary
        # ``denom = exp_avg_sq.sqrt().add_(eps)``
        temp = trainable.largest_tensor * width
    else:
        temp = 2 * trainable.largest_tensor * width
    largest = trainable.largest_tensor * max(plan.trainable_weight_bytes, plan.adapter_bytes)
    return OptimizerBytes(grads=grads, grad_largest=largest, states=states, master=master,
                          step_temp=temp, formula=formula, impl=impl)


#: bitsandbytes pages an optimizer state only for tensors of at least this many elements;
#: smaller ones get ordinary ``torch.zeros_like`` buffers in the allocator (bitsandbytes
#: 0.50.2 optim/optimizer.py ``Optimizer8bit.get_state_buffer``: ``p.numel() < 1e5``).
PAGED_MIN_ELEMENTS = 100_000


def paged_state_bytes(strategy: Strategy, plan: PrecisionPlan, trainable: Trainable,
                      a: MemoryAssumptions) -> int:
    """Bytes of a paged optimizer's state that live in CUDA managed memory (``get_paged``,
    cudaMallocManaged): the states of tensors of at least ``PAGED_MIN_ELEMENTS`` elements;
    0 for optimizers that do not page. Those tensors are all over the 8-bit minimum size, so
    paged-adamw8bit keeps 8-bit states for them."""
    if not strategy.optimizer.is_paged:
        return 0
    big = sum(r * c * k for r, c, k in trainable.matrices if r * c >= PAGED_MIN_ELEMENTS)
    if strategy.optimizer.is_8bit:
        return int(big * (2 + 2 * 4 / a.optim8bit_blocksize))
    width = 4 if plan.master_bytes else plan.state_bytes
    return 2 * big * width
