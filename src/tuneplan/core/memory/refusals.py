"""Strategies the estimator refuses, each with a one-line reason (``UnsupportedError``).

Impossible combinations (QLoRA with FSDP on a recipe that cannot shard 4-bit weights, 8-bit
optimizers with DeepSpeed offload, rank ≤ 0, sequences beyond the model's limit) and values the
estimate does not model yet. Validation only: nothing here computes sizes.
"""

from __future__ import annotations

from tuneplan.core.job.galore import check_patterns, galore_problem
from tuneplan.core.job.methods import (
    ESTIMATED_QUANTS,
    SEQ2SEQ_TYPES,
    Method,
    context_problem,
    effective_quant,
)
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Attention, Offload, Sharding, Strategy
from tuneplan.core.job.versions import check_stack
from tuneplan.core.memory import encoder, torchtune
from tuneplan.core.models import LinearRole, ModelSpec
from tuneplan.errors import UnsupportedError

#: Model types whose attention applies logit soft-capping, which torch's SDPA kernel has no
#: argument for. transformers 5.24 models/gemma2/modeling_gemma2.py: ``_supports_sdpa = False
#: # sdpa does not support softcapping`` (loading with attn_implementation="sdpa" raises;
#: integrations/sdpa_attention.py also raises on a ``softcap``); its flash path passes
#: ``softcap`` to flash-attn (2.6+) and eager applies ``tanh(scores / cap) * cap``.
SOFTCAP_MODEL_TYPES = frozenset({"gemma2"})

_SHARDED = (Sharding.ZERO3, Sharding.FSDP, Sharding.FSDP_GRAD_OP, Sharding.HYBRID)


def check_strategy(model: ModelSpec, strategy: Strategy) -> None:
    """Raise UnsupportedError with the first reason ``strategy`` cannot be estimated."""
    for problem in _problems(model, strategy):
        raise UnsupportedError(problem)


def _problems(model: ModelSpec, s: Strategy) -> list[str]:
    out: list[str] = []
    if s.method is Method.AUTO:
        out.append("--method auto is for the planner; pick a method for memory")
    if s.method.is_lora and s.lora_rank <= 0:
        out.append(f"--lora-rank must be at least 1, got {s.lora_rank}")
    quant = effective_quant(s)
    if quant is not None and quant not in ESTIMATED_QUANTS:
        out.append(f"--quant {quant.value} is not estimated yet; use nf4, fp4, int8 or gptq-int4")
    task = encoder.task_problem(model, s)
    if task:
        out.append(task)
    context = context_problem(model, s)
    if context:
        out.append(context)
    if s.compile and not (s.recipe is Recipe.TORCHTUNE and torchtune.uncovered(model, s) is None):
        out.append("--compile is modelled for torchtune's compiled layers only (--recipe "
                   "torchtune on a job its layout covers); drop it here")
    if quant is not None and s.sharding in _SHARDED and s.world_size > 1 and s.recipe in (
            Recipe.PLAIN, Recipe.LITGPT, Recipe.UNSLOTH):
        out.append(f"{s.method.value} with {s.sharding.value} needs sharded 4/8-bit weights, "
                   f"which the {s.recipe.value} recipe cannot do; use --recipe hf or torchtune")
    if s.optimizer.is_8bit and s.offload is not Offload.NONE:
        out.append("8-bit optimizers cannot run on offloaded state (DeepSpeed CPU Adam is 32-bit); "
                   "use --optimizer adamw with --offload")
    if s.offload is Offload.OPTIMIZER_PARAMS and s.sharding not in (Sharding.ZERO3, Sharding.FSDP):
        out.append("--offload optimizer+params needs --sharding zero3 or fsdp")
    shards = s.gpus if s.sharding is Sharding.HYBRID else s.world_size  # hybrid: in a node
    if shards == 1 and s.offload is Offload.NONE and s.sharding in (
            Sharding.FSDP, Sharding.FSDP_GRAD_OP, Sharding.HYBRID):
        # Unlike DeepSpeed (fp32 master copies even on one GPU), FSDP over one GPU without CPU
        # offload holds what DDP holds: the estimate would be ddp's under another name.
        out.append(f"--sharding {s.sharding.value} over one GPU shards nothing: use --gpus 2 "
                   "or more, add --offload optimizer, or --sharding ddp")
    if s.offload is not Offload.NONE and s.sharding is Sharding.DDP:
        out.append("--offload needs a ZeRO or FSDP sharding")
    if s.recipe is Recipe.UNSLOTH and s.world_size > 1:
        out.append("the unsloth recipe trains on one GPU; use --recipe hf for several")
    if s.optimizer_in_backward and (s.grad_accum > 1 or s.world_size > 1):
        out.append("--optimizer-in-backward works with one GPU and no gradient accumulation")
    if s.recipe is Recipe.TORCHTUNE and s.precision.is_mixed:
        out.append("torchtune trains in pure bf16/fp32; use --precision bf16")
    if (model.is_encoder_decoder and model.model_type not in SEQ2SEQ_TYPES) or any(
            lin.role is LinearRole.CROSS_ATTENTION and not model.is_encoder_decoder
            for layer in model.layers for lin in layer.linears):
        out.append(f"{model.model_type} (encoder-decoder, cross-attention) "
                   "activations are not estimated yet")
    if (model.model_type in SOFTCAP_MODEL_TYPES and s.attention is Attention.SDPA
            and s.recipe in (Recipe.HF, Recipe.PLAIN)):
        out.append(f"{model.model_type} caps its attention logits (soft-capping), which SDPA "
                   "cannot do: transformers 5.24 refuses attn_implementation='sdpa' for it; "
                   "use --attention eager (or flash with flash-attn 2.6+)")
    if model.extra.get("state_space"):
        out.append(f"{model.model_type} has state-space (Mamba-style) mixer blocks: their "
                   "parameters are counted exactly, but the selective scan's saved "
                   "activations are not modelled, so no memory estimate is given")
    if s.optimizer.is_galore:
        out += _galore_problems(model, s)
    if s.method is Method.LISA:
        if s.recipe not in (Recipe.HF, Recipe.PLAIN):
            out.append(f"lisa switches requires_grad from an HF Trainer callback; the "
                       f"{s.recipe.value} recipe has no such hook: use --recipe hf")
        if s.world_size > 1 or s.sharding is not Sharding.DDP:
            out.append("lisa is estimated on one GPU with --sharding ddp: blocks frozen after "
                       "DDP wrapped the model get no gradient to reduce (it would need "
                       "find_unused_parameters), and ZeRO/FSDP flat buffers hold every block")
    out += check_stack(model, s)
    return out


def _galore_problems(model: ModelSpec, s: Strategy) -> list[str]:
    """GaLore as galore-torch 1.0 runs under the HF Trainer (transformers 5.24
    ``_setup_low_rank_optimizer``): a full fine-tune on one replica of 2-D gradients."""
    opt = f"--optimizer {s.optimizer.value}"
    if s.method is not Method.FULL:
        return [f"{opt} projects full weight gradients: it is a full fine-tuning optimizer; use "
                f"--method full (with --method {s.method.value} use adamw or an 8-bit optimizer)"]
    if s.recipe not in (Recipe.HF, Recipe.PLAIN):
        return [f"{opt} is the HF Trainer's (optim galore_*); the {s.recipe.value} recipe has no "
                "GaLore option: use --recipe hf"]
    if s.sharding is not Sharding.DDP or s.offload is not Offload.NONE:
        return [f"{opt} needs whole 2-D gradients on each GPU: ZeRO and FSDP hand the optimizer "
                "flattened shards (GaLore's projector cannot take their SVD); use --sharding ddp "
                "without --offload"]
    try:
        check_patterns(s.galore_targets)
    except UnsupportedError as exc:
        return [str(exc)]
    problem = galore_problem(model, s)
    return [problem] if problem else []
