"""Routed experts under PEFT LoRA (``lora.ParamWrapper`` on transformers 5's stacked expert
parameters and routers) and the MoE combine step: saved merged weights and backward moments.

Sources: peft 0.21 ``tuners/lora/layer.py`` ParamWrapper (weight parametrized as W + s·B·A,
cached for the forward), transformers ``integrations/moe.py`` grouped_mm_experts_forward (fp32
routing-weight product). Measured with ``adapters/probe`` on tiny Mixtral and Qwen3-30B-A3B.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.core.job.methods import lora_rank_of, targeted_linears
from tuneplan.core.memory.parts import Piece, part
from tuneplan.core.models import LayerSpec, Linear, LinearRole, ModelSpec

if TYPE_CHECKING:
    from tuneplan.core.job.strategy import Strategy
    from tuneplan.core.memory.activations import Shape, Widths


def param_wrapped(lin: Linear) -> bool:
    """PEFT wraps routers and stacked experts with ``lora.ParamWrapper`` (not lora.Linear)."""
    return lin.role in (LinearRole.EXPERT, LinearRole.ROUTER) and lin.name.rsplit(".", 1)[-1] in (
        "gate", "gate_up_proj", "down_proj")


def param_wrapper_saved(lin: Linear, w: Widths, strategy: Strategy, shared: set[str]) -> int:
    """lora.ParamWrapper parametrizes the weight as W + s·B·A, cached for the forward: the merged
    weight (base dtype) is saved by the matmul, and so are A and B cast to the base dtype. A
    wrapped router's F.linear(x, merged weight) also saves its input x, the norm output."""
    if lin.role is LinearRole.ROUTER:
        shared.add("mlp_in")
    factors = lora_rank_of(lin, strategy) * lin.copies * (lin.in_features + lin.out_features)
    return lin.weight_params * w.base + (factors * w.base if w.base != w.adapter else 0)


def experts_adapted(model: ModelSpec, layer: LayerSpec, strategy: Strategy) -> bool:
    """Whether LoRA wraps this block's routed experts (their merged weights then need grads)."""
    return strategy.method.is_lora and any(
        lin.role is LinearRole.EXPERT for lin in targeted_linears(model, strategy, layer))


#: Routers that cast their top-k weights back to the logits' dtype
#: (``router_top_value.to(router_logits.dtype)`` in transformers 5.24 Qwen2MoeTopKRouter and
#: Qwen3MoeTopKRouter), so the combine runs in the compute dtype; Mixtral's and DeepSeek's
#: routing weights stay fp32.
ROUTING_WEIGHTS_IN_COMPUTE_DTYPE = frozenset({"qwen2_moe", "qwen3_moe"})


def moe_combine_transient(model: ModelSpec, w: Widths, shape: Shape) -> Piece | None:
    """MoE blocks start backward at the routing-weight combine, everything saved still alive:
    the gradients of the per-pair outputs, their un-permuted copy and the expanded sum
    gradient, 3·T·k·H at the routing weights' width (fp32, or the compute dtype where the
    router casts them back), plus the T·H gradient arriving."""
    if not model.num_experts:
        return None
    pairs = shape.tokens * model.num_experts_per_token
    width = w.compute if model.model_type in ROUTING_WEIGHTS_IN_COMPUTE_DTYPE else 4
    return part("activations/backward_transient", 3 * pairs * model.hidden_size * width +
                shape.tokens * model.hidden_size * w.compute,
                f"MoE combine backward 3·T·k·H·{width} (routing weights' width) + T·H·bytes",
                "transformers integrations/moe.py grouped_mm_experts_forward", tokens=shape.tokens)


def adapted_expert_moments(model: ModelSpec, strategy: Strategy, w: Widths,
                           shape: Shape) -> list[tuple[int, int, Piece]]:
    """LoRA-wrapped experts (lora.ParamWrapper): each grouped matmul's backward makes a gradient
    of its whole merged E·in·out weight. (saved bytes freed by then, transient) at the down
    backward (its output freed) and at the gate/up backward (down side, activation and gate/up
    output freed); freed bytes are (MoE activations, merged weights)."""
    mats = {lin.name.rsplit(".", 1)[-1]: lin.weight_params for layer in model.layers
            if experts_adapted(model, layer, strategy) for lin in layer.linears
            if lin.role is LinearRole.EXPERT}
    if not mats:
        return []
    t, c, h = shape.tokens, w.compute, model.hidden_size
    pairs = t * model.num_experts_per_token
    inter = model.moe_intermediate_size or model.intermediate_size
    down, gate_up = mats.get("down_proj", 0) * w.base, mats.get("gate_up_proj", 0) * w.base
    src = "peft lora.ParamWrapper (merged weight) + transformers grouped_mm experts"
    return [
        (pairs * h * c, 0, part("activations/backward_transient",
                             pairs * (inter + h) * c + t * h * c + down,
                             "expert down backward: T·k·(I+H)·bytes + T·H·bytes + merged "
                             "down gradient E·I·H·bytes", src, tokens=t)),
        (pairs * (h + 4 * inter) * c, down, part(
            "activations/backward_transient", pairs * (2 * inter + h) * c + t * h * c + gate_up,
            "expert gate/up backward: T·k·(2I+H)·bytes + T·H·bytes + merged gate/up gradient "
            "E·H·2I·bytes", src, tokens=t)),
    ]


#: The words a plan warning is recognised by among the estimate's notes
#: (``planner.costing.plan_warnings`` repeats the note on the plan).
QLORA_EXPERTS_NOTE = "QLoRA needs more memory than LoRA here"


def qlora_experts_note(model: ModelSpec, strategy: Strategy, qlora_weights: int,
                       lora_weights: int) -> str | None:
    """QLoRA on a model whose routed experts are fused 3-D parameters (transformers 5,
    ``versions.experts_are_linear`` false): bitsandbytes quantizes ``nn.Linear`` modules only,
    so the experts stay unquantized, and peft's ``prepare_model_for_kbit_training`` casts every
    parameter that is not 4/8-bit to fp32 (peft 0.21 ``utils/other.py``). When the experts
    dominate, the weights take more than LoRA's in the compute dtype. ``qlora_weights`` /
    ``lora_weights``: the weight terms' sum of this job and of the same job as LoRA."""
    if not model.num_experts or qlora_weights <= lora_weights:
        return None
    return (f"{QLORA_EXPERTS_NOTE}: {model.name}'s routed experts are fused 3-D parameters "
            f"(transformers 5), not nn.Linear, so bitsandbytes leaves them unquantized and "
            f"peft's prepare_model_for_kbit_training casts them to fp32: the model's weights "
            f"take {qlora_weights / 2**30:,.1f} GiB against {lora_weights / 2**30:,.1f} GiB "
            f"with --method lora ({strategy.precision.value})")
