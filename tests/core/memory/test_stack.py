"""Versions are an input: each version-dependent term moves the estimate by the bytes the
libraries' own code implies between two stated versions (core/job/versions.py), worked out from
the model's shapes by hand."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method
from tuneplan.core.job.stack import DEFAULT_STACK, Stack
from tuneplan.core.job.strategy import Checkpointing, Strategy
from tuneplan.core.memory import MemoryAssumptions, MemoryEstimate, estimate_memory
from tuneplan.errors import InvalidValueError, UnsupportedError

L8B = resolve_model("meta-llama/Llama-3.1-8B")
MIXTRAL = resolve_model("mistralai/Mixtral-8x7B-v0.1")
T, H, INTER, LAYERS = 1024, 4096, 14336, 32   # tokens of one micro-batch; Llama-3.1-8B shapes


def _pair(strategy: Strategy, old: str, new: str, model: object = L8B
          ) -> tuple[MemoryEstimate, MemoryEstimate]:
    return (estimate_memory(model, replace(strategy, stack=Stack.parse(old))),  # type: ignore[arg-type]
            estimate_memory(model, replace(strategy, stack=Stack.parse(new))))  # type: ignore[arg-type]


def _phase_gain(strategy: Strategy, old: str, new: str, phase: str) -> int:
    before, after = _pair(strategy, old, new)
    return before.phases[phase] - after.phases[phase]


# bitsandbytes < 0.43.2: MatMul4Bit keeps A = x.to(bf16) per linear. PEFT's fp32 norms make
# the inputs of q, k, v, gate, up fp32 and (Linear4bit returns the input dtype) down's too, so
# each of those six linears keeps its own bf16 copy: T·(5·H + I)·2 per block. o_proj's input
# is already bf16 (SDPA's output, saved anyway): nothing new.
QLORA_PER_BLOCK = T * (5 * H + INTER) * 2


def test_bnb_4bit_before_0_43_2_keeps_every_matmul_input_without_checkpointing() -> None:
    s = Strategy(method=Method.QLORA, checkpointing=Checkpointing.NONE, seq_len=T)
    gain = _phase_gain(s, "bitsandbytes=0.43.1", "bitsandbytes=0.43.2", "backward-start")
    assert gain == LAYERS * QLORA_PER_BLOCK == 2_281_701_376


def test_bnb_4bit_before_0_43_2_with_checkpointing_costs_one_recomputed_block() -> None:
    s = Strategy(method=Method.QLORA, checkpointing=Checkpointing.FULL, seq_len=T)
    old, new = "bitsandbytes=0.43.1", "bitsandbytes=0.43.2"
    assert _phase_gain(s, old, new, "backward-recompute") == QLORA_PER_BLOCK
    # in the block's MLP backward down_proj's input is already freed: q, k, v, gate, up remain
    assert _phase_gain(s, old, new, "backward-bottom-block") == T * 5 * H * 2
    assert _phase_gain(s, old, new, "backward-start") == 0   # checkpoints only


def test_bnb_8bit_before_0_45_also_keeps_the_int8_transposed_input() -> None:
    # CAt: int8, T x in per linear: q, k, v, o, gate, up read H features, down reads I
    s = Strategy(method=Method.LORA8BIT, checkpointing=Checkpointing.NONE, seq_len=T)
    gain = _phase_gain(s, "bitsandbytes=0.44.1", "bitsandbytes=0.45", "backward-start")
    assert gain == LAYERS * T * (6 * H + INTER) == 1_275_068_416


def test_bnb_8bit_keeps_each_layer_input_itself_at_every_version() -> None:
    # MatMul8bitLt ctx.tensors = (CAt, subA, A), A the fp32 input (PEFT's fp32 norms; the
    # MLP of a bnb linear runs in its input dtype); SDPA's output feeds o_proj as a view.
    s = Strategy(method=Method.LORA8BIT, checkpointing=Checkpointing.NONE, seq_len=T,
                 lora_targets=("q_proj", "v_proj"))
    est = estimate_memory(L8B, s)
    assert est.peak_phase == "backward-start"
    saved = est.breakdown.value
    assert saved("activations/blocks/linear_inputs_attn") == LAYERS * T * H * 4
    assert saved("activations/blocks/linear_inputs_mlp") == LAYERS * T * H * 4
    assert saved("activations/blocks/linear_inputs_down") == LAYERS * T * INTER * 4


def test_transformers_4_quantizes_moe_experts_and_routers() -> None:
    s = Strategy(method=Method.QLORA, lora_targets=("q_proj", "v_proj"))
    v4, v5 = _pair(s, "transformers=4.48", "transformers=5.0", MIXTRAL)
    experts = LAYERS * 8 * 3 * H * INTER   # 8 experts x w1, w2, w3 of 4096 x 14336 per block
    routers = LAYERS * H * 8               # gate: nn.Linear(4096, 8) in 4.x
    moved = experts + routers
    assert v4.breakdown.value("weights/quantized") - v5.breakdown.value(
        "weights/quantized") == moved // 2
    # transformers 5 keeps them in the fp32 of prepare_model_for_kbit_training
    assert v5.breakdown.value("weights/unquantized") - v4.breakdown.value(
        "weights/unquantized") == moved * 4
    assert any("nn.Linear, quantized" in b for b in v4.behaviours)
    assert any("left unquantized" in b for b in v5.behaviours)


def test_transformers_4_all_linear_lora_on_moe_is_refused_with_the_stack_named() -> None:
    s = Strategy(method=Method.QLORA, stack=Stack.parse("transformers=4.48"))
    why = re.escape("--stack transformers=4.48 builds one nn.Linear")
    with pytest.raises(UnsupportedError, match=why):
        estimate_memory(MIXTRAL, s)


@pytest.mark.parametrize(("peft", "adapter_bytes"), [
    ("0.5", 4),     # built as fp32 nn.Linear, only moved to the device
    ("0.6", 2), ("0.11", 2),    # cast to the bf16 base weight's dtype
    ("0.12", 4),    # autocast_adapter_dtype=True
])
def test_peft_adapter_dtype_by_version(peft: str, adapter_bytes: int) -> None:
    est = estimate_memory(L8B, Strategy(method=Method.LORA, stack=Stack.parse(f"peft={peft}")))
    assert est.trainable_params == 41_943_040
    assert est.breakdown.value("weights/adapters") == 41_943_040 * adapter_bytes


def test_peft_0_6_to_0_11_keeps_fp32_adapters_on_a_quantized_base() -> None:
    est = estimate_memory(L8B, Strategy(method=Method.QLORA, stack=Stack.parse("peft=0.8")))
    assert est.breakdown.value("weights/adapters") == 41_943_040 * 4


def test_trainer_default_optim_by_transformers_and_torch() -> None:
    s = Strategy(method=Method.LORA)
    trainable = 41_943_040
    # 4.54 with torch >= 2.8: adamw_torch_fused (no temporary); 4.53: adamw_torch, foreach on
    # CUDA, one fp32 copy of every trainable tensor
    assert _phase_gain(s, "transformers=4.53", "transformers=4.54", "optimizer") == trainable * 4
    assert _phase_gain(s, "transformers=4.54,torch=2.7", "transformers=4.54,torch=2.8",
                       "optimizer") == trainable * 4
    # 4.31: adamw_hf, transformers' own AdamW, one temporary of the largest tensor
    # (down_proj's A or gate/up's B: 16 x 14336)
    assert _phase_gain(s, "transformers=4.31", "transformers=4.32", "optimizer") == \
        16 * INTER * 4 - trainable * 4


def test_torch_before_2_0_keeps_the_gradients_allocated_between_steps() -> None:
    """torch 1.13's ``zero_grad()`` zeroes in place (``set_to_none=False`` before 2.0): from
    the second step on, full fine-tuning holds every fp32 gradient through forward and
    backward, as a later micro-batch of gradient accumulation does at any version."""
    s = Strategy(method=Method.FULL, checkpointing=Checkpointing.FULL)
    old, new = _pair(s, "transformers=4.32,torch=1.13", "transformers=4.32,torch=2.0")
    grads = 8_030_261_248 * 4                       # fp32 params under bf16 autocast
    assert old.phases["forward"] - new.phases["forward"] == grads
    assert old.breakdown.value("gradients/trainable") == grads
    assert any(b.startswith("torch 1.13: zero_grad() zeroes the gradients in place")
               for b in old.behaviours)
    assert not any("zero_grad" in b for b in new.behaviours)
    # with accumulation the gradients are alive anyway: the version changes nothing there
    acc = replace(s, grad_accum=4)
    assert _phase_gain(acc, "transformers=4.32,torch=1.13", "transformers=4.32,torch=2.0",
                       "forward") == 0
    # ZeRO keeps its own gradient buffers: not the loop's zero_grad
    from tuneplan.core.job.strategy import Sharding

    zero = replace(s, sharding=Sharding.ZERO2, gpus=8)
    assert _phase_gain(zero, "transformers=4.32,torch=1.13", "transformers=4.32,torch=2.0",
                       "forward") == 0


def test_torch_adamw_before_2_0_is_the_single_tensor_loop() -> None:
    """torch 1.13 turns AdamW's ``foreach=None`` into False: the Trainer's adamw_torch (4.32
    on) steps one tensor at a time, two temporaries of the largest (16 x 14336 LoRA B) instead
    of foreach's fp32 copy of every trainable tensor."""
    s = Strategy(method=Method.LORA)
    trainable = 41_943_040
    assert _phase_gain(s, "transformers=4.32,torch=2.0", "transformers=4.32,torch=1.13",
                       "optimizer") == trainable * 4 - 2 * 16 * INTER * 4


def test_peft_before_0_4_has_no_4bit_layer() -> None:
    why = re.escape("--stack peft=0.3 has no 4-bit LoRA layer")
    with pytest.raises(UnsupportedError, match=why):
        estimate_memory(L8B, Strategy(method=Method.QLORA, stack=Stack.parse("peft=0.3")))
    # LoRA on 8-bit layers existed in peft 0.3
    estimate_memory(L8B, Strategy(method=Method.LORA8BIT, stack=Stack.parse("peft=0.3")))


def test_the_default_stack_is_the_pip_default_and_said_so() -> None:
    assert str(DEFAULT_STACK) == ("transformers=5.24,peft=0.21.2,bitsandbytes=0.50.2,"
                                  "accelerate=1.15,deepspeed=0.19.8,torch=2.13")
    assert DEFAULT_STACK.describe()[0] == "transformers 5.24 (pip default 2026-12)"
    est = estimate_memory(L8B, Strategy(method=Method.QLORA))
    assert est.behaviours == (
        "bitsandbytes 0.50.2: MatMul4Bit keeps no input for backward (0.43.2 and later)",
        "peft 0.21.2: LoRA adapters kept in fp32 (autocast_adapter_dtype, 0.12 and later)",
        "transformers 5.24: ForCausalLMLoss upcasts the logits and pads the labels, no shifted "
        "copy (4.49 and later)",
        "transformers 5.24 with torch 2.13: Trainer optim adamw_torch_fused -> AdamW 'fused' "
        "step temporaries")


@pytest.mark.parametrize(("text", "message"), [
    ("bitsandbytes=0.30", "4-bit weights start at 0.39"),
    ("transformers=6.0", "outside the versions the estimate models (4.30 to 5.24)"),
    ("vllm=0.6", "unknown library 'vllm'"),
    ("torch=2.x", "not a version"),
    ("torch=1.12", "torch 1.12 is outside the versions the estimate models (1.13 to 2.13)"),
    ("torch", "not library=version"),
    ("peft=0.4,peft=0.5", "peft is given twice"),
    # the default transformers (5.24) declares torch>=2.6; 4.51 on needs 2.1
    ("torch=2.5", "transformers 5.24 needs torch 2.6 or later (stack says torch 2.5)"),
    ("transformers=4.51,torch=1.13", "transformers 4.51 needs torch 2.1 or later"),
])
def test_stack_text_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(InvalidValueError, match=re.escape(message)):
        Stack.parse(text)


def test_a_torch_its_transformers_installs_with_is_accepted() -> None:
    assert Stack.parse("transformers=4.50,torch=1.13").torch == (1, 13)
    assert Stack.parse("transformers=4.51,torch=2.1").torch == (2, 1)
    assert Stack.parse("torch=2.6").transformers == (5, 24)


def test_a_stack_round_trips_through_the_strategy_dict() -> None:
    s = Strategy(stack=Stack.parse("transformers=4.30,bitsandbytes=0.39"))
    assert s.as_dict()["stack"]["transformers"] == "4.30"
    assert Strategy.from_dict(s.as_dict()) == s
    assert Stack.parse("Transformers = 4.30").transformers == (4, 30)


VOCAB = 128_256
SHIFTED = T - 1                       # one sequence: cross_entropy sees B·(S-1) positions


@pytest.mark.parametrize(("transformers", "forward_bytes_per_vocab"), [
    # bf16 logits + shifted bf16 copy + autocast's fp32 cast of it + fp32 log-softmax of it
    ("4.30", T * 2 + SHIFTED * (2 + 4 + 4)),
    # the model's fp32 logits (its bf16 ones replaced) + fp32 shifted copy + log-softmax
    ("4.31", T * 4 + SHIFTED * (4 + 4)),
    ("4.45", T * 4 + SHIFTED * (4 + 4)),
    # bf16 logits in the output + ForCausalLMLoss's fp32 upcast + fp32 shifted copy + log-softmax
    ("4.46", T * (2 + 4) + SHIFTED * (4 + 4)),
    ("4.48", T * (2 + 4) + SHIFTED * (4 + 4)),
])
def test_the_loss_copies_of_older_transformers(transformers: str,
                                               forward_bytes_per_vocab: int) -> None:
    s = Strategy(method=Method.LORA, seq_len=T)
    old, new = _pair(s, f"transformers={transformers}", "transformers=4.49")
    # 4.49 and later: bf16 logits + fp32 upcast + fp32 log-softmax, labels padded (no copy)
    assert old.phases["forward"] - new.phases["forward"] == VOCAB * (
        forward_bytes_per_vocab - T * (2 + 4 + 4))
    # backward starts with the nll/log-softmax gradients of the positions the loss saw
    assert new.phases["backward-start"] - old.phases["backward-start"] == VOCAB * 4 * 3 * (
        T - SHIFTED)
    assert old.breakdown.value("logits/shift_copy") > 0


def test_an_assumed_adamw_impl_overrides_the_stack_and_says_so() -> None:
    s = Strategy(method=Method.LORA, stack=Stack.parse("transformers=4.48"))
    est = estimate_memory(L8B, s, MemoryAssumptions(adamw_impl="fused"))
    assert est.behaviours[-1] == "AdamW 'fused' step temporaries (MemoryAssumptions.adamw_impl)"
    assert est.phases["optimizer"] == estimate_memory(L8B, replace(
        s, stack=DEFAULT_STACK)).phases["optimizer"]


def test_llama_eager_clamp_saves_masked_scores_before_4_31() -> None:
    """transformers 4.30 LlamaAttention: torch.max(scores + mask, finfo.min) saves the sum;
    with peft's k-bit upcast the mask (inputs_embeds dtype) is fp32, so B·heads·S·S·4 per
    block; 4.31 dropped the clamp."""
    from tuneplan.core.job.methods import Quant
    from tuneplan.core.job.recipes import precision_plan
    from tuneplan.core.job.strategy import Attention, Precision
    from tuneplan.core.memory import activations as act

    model = resolve_model("meta-llama/Llama-2-7b-hf")
    base = Strategy(method=Method.QLORA, quant=Quant.NF4, precision=Precision.FP16_MIXED,
                    attention=Attention.EAGER, batch_size=2, seq_len=512)
    shape = act.Shape(2, 512, 512)
    old = replace(base, stack=Stack.parse("transformers=4.30"))
    new = replace(base, stack=Stack.parse("transformers=4.31"))
    w = act.widths(old, precision_plan(old), 1)
    delta = act.attention_saved(model, old, w, shape) - act.attention_saved(model, new, w, shape)
    assert delta == 2 * 32 * 512 * 512 * 4
    assert act.clamped_scores_bytes(model, replace(base, stack=DEFAULT_STACK), w, shape) == 0
