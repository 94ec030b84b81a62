"""Every version-dependent behaviour of the memory estimate, decided from ``Strategy.stack``.

Each function answers one question for a stack and the strategy, and ``behaviours`` lists, for
an estimate, the behaviours it assumed in words with the version they hold for (printed by
``memory --json`` and ``explain``). Sources are the libraries' own files at the named versions.
Pure: no imports of the libraries themselves.
"""

from __future__ import annotations

from functools import cache

from tuneplan.core.job.methods import Method, Quant, effective_quant
from tuneplan.core.job.recipes import PEFT_BASE_DTYPE, Recipe
from tuneplan.core.job.stack import Stack, version_text
from tuneplan.core.job.strategy import Attention, Loss, Optimizer, Sharding, Strategy, Task
from tuneplan.core.models import ModelSpec

#: bitsandbytes ``autograd/_functions.py`` MatMul4Bit.forward: up to 0.43.1 it keeps
#: ``ctx.tensors = (A, B)`` whenever the input or the weight needs a gradient, so the
#: (compute-dtype) input of every 4-bit matmul stays alive until backward; 0.43.2 keeps
#: ``(None, B)`` ("fix QLoRA mem bug: delete useless buffered activation"). Counted in every
#: block: without checkpointing the first block's q/k/v inputs need no gradient (frozen
#: embedding), so there it over-counts at most one block's attention inputs.
BNB_4BIT_DROPS_INPUT = (0, 43, 2)
#: bitsandbytes MatMul8bitLt.forward, 0.39.1 to 0.50.1: ``ctx.tensors = (CAt, subA, A)`` when an
#: input needs a gradient, A being the layer input itself. Up to 0.44.1 ``CAt`` (the int8
#: transposed quantized input, T x in bytes) is always made by ``F.double_quant``; from 0.45.0
#: ``int8_double_quant`` runs only when the weight needs a gradient, else ``CAt`` is None.
BNB_8BIT_NO_CAT = (0, 45)
#: peft 0.4.0 is the first release with ``lora.Linear4bit`` (0.3.0 wraps only 8-bit layers).
PEFT_4BIT = (0, 4)
#: transformers ``training_args.py`` ``default_optim``: "adamw_hf" up to 4.31, "adamw_torch"
#: from 4.32, and from 4.54 "adamw_torch_fused" when torch >= 2.8.
HF_ADAMW_TORCH = (4, 32)
HF_ADAMW_FUSED = (4, 54)
TORCH_FUSED_DEFAULT = (2, 8)
#: torch 2.0 made ``set_to_none=True`` the default of ``Module.zero_grad`` and
#: ``Optimizer.zero_grad`` (torch/nn/modules/module.py, torch/optim/optimizer.py). Up to 1.13
#: ``zero_grad()`` zeroes each ``.grad`` in place, so after the first optimizer step every
#: gradient stays allocated through the next step's forward and backward: the HF Trainer calls
#: ``model.zero_grad()`` after each step (``_inner_training_loop``), a plain loop
#: ``optimizer.zero_grad()``. The same torch 2.0 change made AdamW default to its foreach
#: kernels on CUDA (``_default_to_fused_or_foreach``); 1.13's ``adamw`` turns
#: ``foreach=None`` into False, the single-tensor loop.
TORCH_GRADS_TO_NONE = (2, 0)
#: transformers 5 builds routed experts as fused 3-D ``nn.Parameter``s (mixtral
#: ``MixtralExperts.gate_up_proj``) and routers as custom modules (``MixtralTopKRouter``), which
#: bitsandbytes' ``replace_with_bnb_linear`` leaves alone; transformers 4.x (4.48 mixtral
#: ``MixtralBlockSparseTop2MLP`` w1/w2/w3, router ``gate = nn.Linear``) has one ``nn.Linear``
#: per expert, all quantized (``get_keys_to_not_convert`` skips only the output head).
HF_FUSED_EXPERTS = (5, 0)
#: How a transformers causal LM turns logits into the loss (``LlamaForCausalLM.forward``, then
#: ``loss/loss_utils.py::ForCausalLMLoss``; other families' 4.x forwards varied): up to 4.30
#: the compute-dtype logits are shifted (``logits[..., :-1, :].contiguous()``, a copy) and
#: autocast casts that copy to fp32 for cross_entropy; 4.31 to 4.45 the model replaces its
#: logits by ``logits.float()`` and shifts those (an fp32 copy); 4.46 to 4.48
#: ``ForCausalLMLoss`` upcasts (the model output keeps the compute-dtype logits) and shifts the
#: fp32 ones; from 4.49 it pads the labels instead (``nn.functional.pad(labels, (0, 1))``), so
#: no logits are copied but the upcast.
#: transformers ``models/llama/modeling_llama.py`` ``LlamaAttention.forward`` (eager, the only
#: LLaMA attention then): up to 4.30 the masked scores are clamped,
#: ``attn_weights = torch.max(attn_weights + attention_mask, torch.tensor(finfo.min))``, and
#: ``maximum`` saves both operands for backward, so every block keeps the masked scores
#: B·heads·S·S_kv as well as the fp32 softmax output. 4.31 dropped the clamp. The sum has the
#: dtype of the scores promoted with the mask's, which ``_prepare_decoder_attention_mask`` builds
#: in ``inputs_embeds.dtype`` (fp32 after peft's ``prepare_model_for_kbit_training``).
HF_LLAMA_NO_SCORE_CLAMP = (4, 31)
HF_LOSS_LAYOUTS = (((4, 31), "shift-then-cast"), ((4, 46), "model-float-shift"),
                   ((4, 49), "loss-float-shift"))


def bnb_4bit_saves_input(s: Strategy) -> bool:
    """MatMul4Bit keeps its input for backward (bitsandbytes before 0.43.2)."""
    return effective_quant(s) in (Quant.NF4, Quant.FP4) and not s.stack.at_least(
        "bitsandbytes", BNB_4BIT_DROPS_INPUT)


def bnb_8bit_keeps_cat(s: Strategy) -> bool:
    """MatMul8bitLt also keeps CAt, the int8 transposed input (bitsandbytes before 0.45)."""
    return effective_quant(s) is Quant.INT8 and not s.stack.at_least("bitsandbytes",
                                                                       BNB_8BIT_NO_CAT)


def hf_loss_layout(s: Strategy) -> str:
    """``HF_LOSS_LAYOUTS``' name for the stated transformers, ``"pad-labels"`` from 4.49."""
    return _hf_loss_layout(s.stack)


@cache   # a fact of the (frozen) stack, asked once per memory estimate
def _hf_loss_layout(stack: Stack) -> str:
    for below, name in HF_LOSS_LAYOUTS:
        if not stack.at_least("transformers", below):
            return name
    return "pad-labels"


def hf_eager_clamps_scores(model: ModelSpec, s: Strategy) -> bool:
    """LLaMA eager attention saves its clamped, masked scores (transformers before 4.31)."""
    return (s.attention is Attention.EAGER and model.model_type == "llama"
            and s.recipe in (Recipe.HF, Recipe.PLAIN)
            and not s.stack.at_least("transformers", HF_LLAMA_NO_SCORE_CLAMP))


def experts_are_linear(model: ModelSpec, s: Strategy) -> bool:
    """Routed experts are ``nn.Linear`` modules: transformers 4.x (routers too), or a model
    whose own modeling code builds one ``nn.Linear`` per expert (``per_expert_linears``)."""
    return model.per_expert_linears or not s.stack.at_least("transformers", HF_FUSED_EXPERTS)


def hf_default_optim(stack: Stack) -> str:
    """The HF Trainer's ``optim`` when the job does not set one."""
    if not stack.at_least("transformers", HF_ADAMW_TORCH):
        return "adamw_hf"
    if stack.at_least("transformers", HF_ADAMW_FUSED) and stack.at_least(
            "torch", TORCH_FUSED_DEFAULT):
        return "adamw_torch_fused"
    return "adamw_torch"


#: What each Trainer ``optim`` is as an AdamW implementation (``MemoryAssumptions.adamw_impl``):
#: transformers' own ``AdamW`` (optimization.py, 4.30) steps one tensor at a time with one
#: temporary (``denom = exp_avg_sq.sqrt().add_(eps)``); torch AdamW defaults to foreach on CUDA
#: (torch 2.x ``_default_to_fused_or_foreach``).
_IMPL = {"adamw_hf": "hf", "adamw_torch": "foreach", "adamw_torch_fused": "fused"}


def adamw_impl(s: Strategy, assumed: str | None) -> str:
    """The AdamW implementation the step temporaries follow: ``assumed`` when set, else the HF
    Trainer's default for the stack (recipe hf; torch AdamW is the single-tensor loop before
    torch 2.0); a plain loop's ``torch.optim.AdamW(params, lr=...)`` takes torch's own default
    (foreach on CUDA from torch 2.0, ``_default_to_fused_or_foreach``; fused only when asked:
    PEFT's method-comparison ``utils.get_optimizer_and_scheduler`` builds it so); LitGPT's
    finetune scripts too (``instantiate_torch_optimizer(optimizer, model.parameters())``, no
    ``fused``; only its pretrain script asks for it), but under a bitsandbytes quantization
    (QLoRA) they build ``bnb.optim.PagedAdamW``, one kernel per tensor (``instantiate_bnb_
    optimizer``): fused here; else fused (torchtune configs, as before)."""
    if assumed:
        return assumed
    if s.recipe is Recipe.LITGPT and s.method is Method.QLORA:
        return "fused"
    if s.recipe in (Recipe.HF, Recipe.PLAIN, Recipe.LITGPT):
        impl = _IMPL[hf_default_optim(s.stack)] if s.recipe is Recipe.HF else "foreach"
        if impl == "foreach" and not s.stack.at_least("torch", TORCH_GRADS_TO_NONE):
            return "single"
        return impl
    return "fused"


def grads_kept_between_steps(s: Strategy) -> bool:
    """Gradients stay allocated from one optimizer step into the next (torch before 2.0:
    ``zero_grad()`` zeroes them in place), for the loops that own them: the HF Trainer's and a
    plain one, on one GPU or under DDP (ZeRO and FSDP hold their own gradient buffers)."""
    return (not s.stack.at_least("torch", TORCH_GRADS_TO_NONE)
            and s.recipe in (Recipe.HF, Recipe.PLAIN)
            and s.sharding is Sharding.DDP and not s.optimizer_in_backward)


def loss_follows_transformers(s: Strategy) -> bool:
    """The standard causal-LM loss is transformers' own (hf and plain recipes)."""
    return s.recipe in (Recipe.HF, Recipe.PLAIN) and s.task is Task.CAUSAL_LM and (
        s.loss is None or s.loss is Loss.STANDARD)


def check_stack(model: ModelSpec, s: Strategy) -> list[str]:
    """Strategies the stated versions cannot run, one reason each (``refusals.py`` raises)."""
    out: list[str] = []
    stack = s.stack
    quant = effective_quant(s)
    if quant in (Quant.NF4, Quant.FP4) and s.recipe is Recipe.HF and not stack.at_least(
            "peft", PEFT_4BIT):
        out.append(f"--stack peft={version_text(stack.peft)} has no 4-bit LoRA layer "
                   "(lora.Linear4bit arrived in peft 0.4.0); state peft=0.4 or later")
    if experts_are_linear(model, s) and not model.per_expert_linears and model.num_experts \
            and s.method.is_lora and s.all_linear:
        out.append(f"--stack transformers={version_text(stack.transformers)} builds one "
                   f"nn.Linear per expert, so all-linear LoRA wraps every expert of "
                   f"{model.name}: not estimated; name the attention linears in --lora-targets")
    return out


def behaviours(model: ModelSpec, s: Strategy, assumed_impl: str | None) -> list[str]:
    """The version-dependent behaviours this estimate assumed, with the versions they hold
    for (only those that touch the strategy); ``assumed_impl`` is
    ``MemoryAssumptions.adamw_impl``."""
    st = s.stack
    impl = adamw_impl(s, assumed_impl)
    bnb = f"bitsandbytes {version_text(st.bitsandbytes)}"
    out: list[str] = []
    quant = effective_quant(s)
    if quant in (Quant.NF4, Quant.FP4):
        out.append(f"{bnb}: MatMul4Bit keeps every 4-bit matmul's input for backward "
                   "(before 0.43.2)" if bnb_4bit_saves_input(s) else
                   f"{bnb}: MatMul4Bit keeps no input for backward (0.43.2 and later)")
    if quant is Quant.INT8:
        out.append(f"{bnb}: MatMul8bitLt keeps its input A for backward"
                   + (" and the int8 transposed input CAt (before 0.45)"
                      if bnb_8bit_keeps_cat(s) else ", no CAt (0.45 and later)")
                   + "; outlier columns subA (data-dependent) not counted")
    if model.num_experts and quant is not None:
        tf = f"transformers {version_text(st.transformers)}"
        out.append(f"{model.name}'s own modeling code: routed experts are one nn.Linear "
                   "per expert, quantized with the rest; its MoEGate router is a Parameter, "
                   "left unquantized" if model.per_expert_linears else
                   f"{tf}: routed experts and routers are nn.Linear, quantized with the "
                   "rest (4.x); expert activations follow transformers 5's grouped layout"
                   if experts_are_linear(model, s) else
                   f"{tf}: routed experts are fused parameters and routers custom modules, "
                   "left unquantized (5.0 and later)")
    if s.method.is_lora and s.recipe in (Recipe.HF, Recipe.PLAIN):
        peft = f"peft {version_text(st.peft)}: LoRA adapters kept in"
        if st.at_least("peft", PEFT_BASE_DTYPE[1]):
            out.append(f"{peft} fp32 (autocast_adapter_dtype, 0.12 and later)")
        elif not st.at_least("peft", PEFT_BASE_DTYPE[0]):
            out.append(f"{peft} fp32 (built as fp32 nn.Linear, before 0.6)")
        elif quant is not None:
            out.append(f"{peft} fp32 (0.6 to 0.11 cast them to the base weight's dtype, and "
                       "a quantized base weight has no float dtype)")
        else:
            out.append(f"{peft} the base dtype (cast to the base weight's dtype, 0.6 to 0.11)")
    if grads_kept_between_steps(s):
        out.append(f"torch {version_text(st.torch)}: zero_grad() zeroes the gradients in "
                   "place (set_to_none=False before 2.0), so they stay allocated through "
                   "every step's forward and backward")
    if hf_eager_clamps_scores(model, s):
        out.append(f"transformers {version_text(st.transformers)}: LLaMA eager attention "
                   "clamps the masked scores with torch.max, which saves them "
                   "(B·heads·S·S_kv per block; before 4.31)")
    if loss_follows_transformers(s):
        tf = f"transformers {version_text(st.transformers)}"
        out.append({
            "shift-then-cast": f"{tf}: the loss shifts the compute-dtype logits (a copy) and "
                               "autocast casts the copy to fp32 (up to 4.30)",
            "model-float-shift": f"{tf}: the model's logits.float() replaces its logits and "
                                 "the loss shifts the fp32 ones (a copy; 4.31 to 4.45)",
            "loss-float-shift": f"{tf}: ForCausalLMLoss upcasts the logits and shifts the fp32 "
                                "copy (4.46 to 4.48)",
            "pad-labels": f"{tf}: ForCausalLMLoss upcasts the logits and pads the labels, no "
                          "shifted copy (4.49 and later)"}[hf_loss_layout(s)])
    if s.optimizer is Optimizer.ADAMW and not s.optimizer_in_backward:
        if assumed_impl:
            out.append(f"AdamW '{impl}' step temporaries (MemoryAssumptions.adamw_impl)")
        elif s.recipe is Recipe.HF:
            out.append(f"transformers {version_text(st.transformers)} with torch "
                       f"{version_text(st.torch)}: Trainer optim {hf_default_optim(st)} -> "
                       f"AdamW '{impl}' step temporaries")
        else:
            out.append(f"AdamW '{impl}' step temporaries ({s.recipe.value} recipe)")
    return out
