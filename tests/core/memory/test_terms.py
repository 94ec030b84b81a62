"""Known answers for individual terms: quantized weight bytes, trainable parameters per method,
recipe dtype rules, sharding and offload placement. Each number is worked out by hand."""

from __future__ import annotations

import pytest

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method, Quant, count_trainable
from tuneplan.core.job.recipes import Recipe, precision_plan
from tuneplan.core.job.strategy import (
    Checkpointing,
    Offload,
    Optimizer,
    Precision,
    Sharding,
    Strategy,
)
from tuneplan.core.memory import estimate_memory

L8B = resolve_model("meta-llama/Llama-3.1-8B")
LINEAR_8B = 6_979_321_856          # 32 blocks · (2·4096² + 2·4096·1024 + 3·4096·14336)
OUT_PER_BLOCK = 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096


def test_nf4_weights_and_constants() -> None:
    tensors = 32 * 7                 # each QuantState also keeps a 16-entry fp32 code
    est = estimate_memory(L8B, Strategy(method=Method.QLORA, double_quant=False))
    assert est.breakdown.value("weights/quantized") == LINEAR_8B // 2
    assert est.breakdown.value("weights/quant_constants") == LINEAR_8B // 64 * 4 + tensors * 64
    nested = estimate_memory(L8B, Strategy(method=Method.QLORA))
    blocks = LINEAR_8B // 64         # uint8 absmax, fp32 per 256 blocks, 256-entry code, offset
    assert nested.breakdown.value("weights/quant_constants") == blocks + (
        blocks // 256 + tensors) * 4 + tensors * (1024 + 4 + 64)
    # prepare_model_for_kbit_training: embeddings, head, norms in fp32
    rest = 8_030_261_248 - LINEAR_8B
    assert est.breakdown.value("weights/unquantized") == rest * 4


@pytest.mark.parametrize(("method", "expected"), [
    (Method.LORA, 16 * 32 * sum(i + o for i, o in [(4096, 4096), (4096, 1024), (4096, 1024),
                                                    (4096, 4096), (4096, 14336), (4096, 14336),
                                                    (14336, 4096)])),
    (Method.DORA, 41_943_040 + 32 * OUT_PER_BLOCK),   # + one magnitude per output row
    (Method.PREFIX, 20 * 32 * 2 * 1024),               # P · layers · 2 · kv_dim (GQA)
    (Method.PROMPT, 20 * 4096),                        # P · hidden
])
def test_trainable_params(method: Method, expected: int) -> None:
    assert count_trainable(L8B, Strategy(method=method)).total == expected


def test_ia3_scales_outputs_and_feedforward_inputs() -> None:
    s = Strategy(method=Method.IA3, lora_targets=("k_proj", "v_proj", "down_proj"))
    assert count_trainable(L8B, s).total == 32 * (1024 + 1024 + 14336)


def test_recipe_precision_rules() -> None:
    hf = precision_plan(Strategy(method=Method.LORA))
    assert (hf.frozen_weight_bytes, hf.adapter_bytes, hf.autocast) == (2, 4, True)
    tt = precision_plan(Strategy(method=Method.LORA, recipe=Recipe.TORCHTUNE,
                                 precision=Precision.BF16))
    assert (tt.adapter_bytes, tt.state_bytes, tt.autocast) == (2, 2, False)
    ds = precision_plan(Strategy(method=Method.FULL, gpus=8, sharding=Sharding.ZERO2))
    assert (ds.trainable_weight_bytes, ds.master_bytes, ds.state_bytes) == (2, 4, 4)
    full = precision_plan(Strategy(method=Method.FULL))
    assert (full.trainable_weight_bytes, full.state_bytes) == (4, 4)


def test_zero3_shards_weights_and_gathers_blocks() -> None:
    one = estimate_memory(L8B, Strategy(method=Method.FULL, precision=Precision.BF16))
    z3 = estimate_memory(L8B, Strategy(method=Method.FULL, precision=Precision.BF16, gpus=8,
                                       sharding=Sharding.ZERO3))
    assert z3.breakdown.value("weights/trainable") == -(-one.breakdown.value(
        "weights/trainable") // 8)
    # DeepSpeed's coordinator replayed (zero3_gather): at least the largest submodule (the
    # 128256 x 4096 embedding / head), and no whole-model gather
    gathered = z3.breakdown.value("sharding/gathered_params")
    assert 128256 * 4096 * 2 <= gathered < one.breakdown.value("weights/trainable") // 4
    assert z3.breakdown.value("sharding/gathered_blocks") == 0
    assert z3.breakdown.value("overheads/nccl") > 0


def test_offload_moves_optimizer_state_to_host() -> None:
    s = Strategy(method=Method.FULL, gpus=4, sharding=Sharding.ZERO3, offload=Offload.OPTIMIZER)
    est = estimate_memory(L8B, s)
    assert est.breakdown.value("optimizer/states") == 0
    assert est.host.value("optimizer/states") > 0


def test_optimizer_in_backward_keeps_one_gradient() -> None:
    s = Strategy(method=Method.FULL, recipe=Recipe.TORCHTUNE, precision=Precision.BF16,
                 optimizer_in_backward=True)
    est = estimate_memory(L8B, s)
    assert "optimizer" not in est.phases
    assert est.breakdown.value("gradients/trainable") == 0


def test_eight_bit_adam_state() -> None:
    """2 B + absmax per element, but under the HF Trainer the token embedding's two states are
    fp32 (transformers 5.24 ``Trainer.create_optimizer`` registers ``optim_bits=32`` for every
    nn.Embedding): 128,256 x 4096 elements at 8 B. torchtune builds bitsandbytes' class
    itself: no override, every element 8-bit."""
    s = Strategy(method=Method.FULL, precision=Precision.BF16, optimizer=Optimizer.ADAMW8BIT)
    states = estimate_memory(L8B, s).breakdown.value("optimizer/states")
    embedding = 128_256 * 4096
    assert 2 * 8_030_261_248 < states - embedding * (8 - 2) < 2.1 * 8_030_261_248
    tune = estimate_memory(L8B, Strategy(method=Method.FULL, precision=Precision.BF16,
                                         optimizer=Optimizer.ADAMW8BIT,
                                         recipe=Recipe.TORCHTUNE))
    tuned = tune.breakdown.value("optimizer/states")
    assert 2 * 8_030_261_248 < tuned < 2.1 * 8_030_261_248
    assert states - tuned == embedding * (8 - 2) - embedding * 8 // 256


def test_offloaded_checkpoints_keep_two_blocks() -> None:
    s = Strategy(method=Method.LORA, checkpointing=Checkpointing.OFFLOAD, batch_size=4,
                 seq_len=4096)
    est = estimate_memory(L8B, s)
    assert est.host.value("host/offloaded_checkpoints") == 4 * 4096 * 4096 * 2 * 32


def test_gptq_int4_weights_are_not_upcast() -> None:
    est = estimate_memory(L8B, Strategy(method=Method.QLORA, quant=Quant.GPTQ_INT4,
                                        double_quant=False))
    groups = LINEAR_8B // 128        # fp16 scale + packed 4-bit zero per 128 inputs, per output
    inputs = 32 * (4 * 4096 + 2 * 4096 + 14336)   # int32 g_idx per input feature
    assert est.breakdown.value("weights/quantized") == LINEAR_8B // 2
    assert est.breakdown.value("weights/quant_constants") == groups * 2 + groups // 2 + inputs * 4
    # prepare_model_for_kbit_training leaves GPTQ models in their dtype: no fp32 head copy
    assert est.breakdown.value("weights/unquantized") == (8_030_261_248 - LINEAR_8B) * 2
    assert not precision_plan(Strategy(method=Method.QLORA, quant=Quant.GPTQ_INT4)).kbit_upcast


@pytest.mark.parametrize(("sharding", "gpus", "elements"), [
    (Sharding.ZERO2, 2, 8_030_261_248 // 2),      # the whole gradient partition at once
    (Sharding.ZERO3, 8, 1_000_000_000),           # one sub_group_size sub-group at a time
])
def test_deepspeed_steps_on_fp32_gradients(sharding: Sharding, gpus: int, elements: int) -> None:
    s = Strategy(method=Method.FULL, precision=Precision.BF16_MIXED, gpus=gpus, sharding=sharding,
                 checkpointing=Checkpointing.FULL)
    est = estimate_memory(L8B, s)
    assert est.peak_phase == "optimizer"
    # flattened bf16 copy + its fp32 cast
    assert est.breakdown.value("optimizer/fp32_grad_partition") == elements * (2 + 4)


def test_moe_all_linear_follows_peft_conversion() -> None:
    """peft 0.21 re-targets "all-linear" on converted MoE types: attention, the router (as
    H→E) and the stacked experts at r·E (gate_up at 2r); gpt-oss keeps only nn.Linear."""
    qwen = count_trainable(resolve_model("Qwen/Qwen3-30B-A3B"),
                           Strategy(method=Method.LORA, lora_rank=16))
    attention = 16 * ((2048 + 4096) * 2 + (2048 + 512) * 2)
    router = 16 * (2048 + 128)
    experts = 2 * 16 * 128 * (2048 + 2 * 768) + 16 * 128 * (768 + 2048)
    assert qwen.total == 48 * (attention + router + experts) == 996_507_648
    oss = count_trainable(resolve_model("openai/gpt-oss-20b"),
                          Strategy(method=Method.LORA, lora_rank=16))
    assert oss.total == 24 * 16 * ((2880 + 4096) * 2 + (2880 + 512) * 2)


def test_dora_weight_norm_temporaries_by_hand() -> None:
    """peft DoraLinearLayer.forward at Llama-3.1-8B's down_proj (in 14336, out 4096), rank
    16: eye(in) and A's output kept by BA's graph, BA in x's dtype, the scaled BA and the sum
    (fp32 adapters under bf16 autocast: the identity in bf16, the base weight cast to fp32)."""
    from dataclasses import replace

    from tuneplan.core.memory import activations as act

    s = Strategy(method=Method.DORA, lora_rank=16)
    w = act.widths(s, precision_plan(s), 1)
    assert (w.autocast, w.compute, w.adapter, w.base) == (True, 2, 4, 2)
    down = next(lin for lin in L8B.layers[0].linears if lin.name.endswith("down_proj"))
    n, m = 14336, 4096
    assert act.dora_norm_bytes(down, 16, w, quantized=False) == (
        n * n * 2 + n * 16 * 2 + n * m * 4 + n * m * 4 + 2 * n * m * 4)
    # pure fp32: no casts, the identity in fp32
    pure = replace(w, autocast=False, compute=4, base=4)
    assert act.dora_norm_bytes(down, 16, pure, quantized=False) == (
        n * n * 4 + n * 16 * 4 + n * m * 4 + 2 * n * m * 4)
    places = act.dora_transients(L8B, s, w)
    assert places["down"] == act.dora_norm_bytes(down, 16, w, quantized=False)
    assert places["attention"] > 0 and places["gate/up"] > 0
    assert act.dora_transients(L8B, replace(s, method=Method.LORA), w) == {
        "attention": 0, "gate/up": 0, "down": 0}
    # the estimate carries it: DoRA's forward peak includes the down_proj norm temporaries
    est = estimate_memory(L8B, replace(s, seq_len=128, checkpointing=Checkpointing.NONE))
    assert est.peak_phase.startswith("forward")
    assert "DoRA" in est.breakdown.get("activations/forward_transient").formula


def test_a_tuners_half_precision_miss_is_said_in_its_note() -> None:
    from dataclasses import replace

    boft = Strategy(method=Method.BOFT, precision=Precision.BF16_MIXED)
    said = " ".join(estimate_memory(L8B, boft).notes)
    assert "in bf16-mixed it missed that simulation by +29.0 %" in said
    fp32 = " ".join(estimate_memory(L8B, replace(boft, precision=Precision.FP32)).notes)
    assert "held to the CPU simulation within 3 %" in fp32 and "missed" not in fp32
    # within 3 % in pure bf16: nothing to say
    loha = " ".join(estimate_memory(L8B, Strategy(method=Method.LOHA,
                                                  precision=Precision.BF16)).notes)
    assert "missed" not in loha


def test_torchtune_packing_gathers_rope_rows_per_call() -> None:
    """Packed rows under --recipe torchtune, no checkpointing, full fine-tuning: input_pos
    (T·8) and, in each of the L layers, the q and the k RoPE call's fp32 cache rows
    (T·head_dim·4 each) are kept; nothing else moves."""
    import dataclasses

    from tuneplan.core.memory.torchtune import _dims, block_saved
    from tuneplan.core.models import parse_model_config

    cfg = {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 176,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 2048, "model_type": "llama",
           "architectures": ["LlamaForCausalLM"]}
    model = parse_model_config(cfg, name="tiny")
    job = Strategy(method=Method.FULL, recipe=Recipe.TORCHTUNE, precision=Precision.BF16,
                   batch_size=2, seq_len=256, checkpointing=Checkpointing.NONE)
    packed = dataclasses.replace(job, packing=True)
    t, head_dim = 2 * 256, 64 // 4
    assert block_saved(_dims(model, packed))["rope"] == 2 * t * head_dim * 4
    assert block_saved(_dims(model, job))["rope"] == 0
    moved = (estimate_memory(model, packed).breakdown.value("activations/blocks")
             - estimate_memory(model, job).breakdown.value("activations/blocks"))
    assert moved == 2 * 2 * t * head_dim * 4
