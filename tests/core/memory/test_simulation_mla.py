"""Multi-head latent attention (DeepSeek-V2/V3) and shared experts (DeepSeek, Qwen2-MoE): the
analytic allocated peak held to the exact CPU simulation (``adapters/probe/harness``), ±3 %.

Tiny models with a small vocabulary, so that the blocks (not the loss) weigh. The SDPA cases
use v_head_dim == qk_nope + qk_rope: then the CPU runs its flash kernel, which saves what a
GPU's does (with unequal head sizes the CPU falls back to the math kernel, which a GPU does
not use); eager cases keep unequal head sizes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Attention, Checkpointing, Optimizer, Precision, Strategy
from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import parse_model_config

pytestmark = pytest.mark.probe

_BASE = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "hidden_act": "silu", "tie_word_embeddings": False}
# MLA with a q LoRA rank; block 0 dense, block 1 routed (4 experts, top-2) + one shared expert.
_DS = {**_BASE, "model_type": "deepseek_v3", "num_key_value_heads": 4, "q_lora_rank": 24,
       "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
       "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
       "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}
CONFIGS = {
    "deepseek-v3-eager": _DS,
    "deepseek-v3": {**_DS, "v_head_dim": 24},
    # DeepSeek-V2-Lite style: no q LoRA (a plain q_proj), two shared experts, greedy softmax
    # router; and DeepSeek-V2 style: q LoRA, MLP biases, group-limited router
    "deepseek-v2-lite": {**_BASE, "model_type": "deepseek_v2", "q_lora_rank": None,
                         "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                         "v_head_dim": 24, "n_routed_experts": 4, "n_shared_experts": 2,
                         "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                         "first_k_dense_replace": 1},
    "deepseek-v2-eager": {**_BASE, "model_type": "deepseek_v2", "q_lora_rank": 24,
                          "mlp_bias": True, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                          "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 4,
                          "n_shared_experts": 1, "num_experts_per_tok": 2,
                          "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                          "topk_method": "group_limited_greedy", "n_group": 2,
                          "topk_group": 1},
    "qwen2-moe": {**_BASE, "model_type": "qwen2_moe", "num_key_value_heads": 2,
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 48},
}
FP32, BF16, MIXED = Precision.FP32, Precision.BF16, Precision.BF16_MIXED
Case = tuple[str, str, int, int, bool, str, str, Precision]
CASES: list[Case] = [
    ("deepseek-v3", "full", 2, 256, False, "sdpa", "adamw", FP32),
    ("deepseek-v3", "full", 2, 256, False, "sdpa", "adamw", BF16),
    ("deepseek-v3-eager", "full", 2, 256, False, "eager", "adamw", BF16),
    # LoRA all-linear: peft wraps the MLA linears, the router and the stacked experts (not the
    # v4-named dense MLP and shared expert linears)
    ("deepseek-v3", "lora", 2, 256, False, "sdpa", "adamw", BF16),
    ("deepseek-v3", "lora", 2, 256, True, "sdpa", "adamw", FP32),
    ("deepseek-v3", "lora", 2, 256, False, "sdpa", "adamw", MIXED),
    ("deepseek-v2-lite", "full", 2, 256, False, "sdpa", "adamw", BF16),
    ("deepseek-v2-lite", "lora", 2, 256, False, "sdpa", "adamw", FP32),
    ("deepseek-v2-lite", "lora", 2, 256, False, "sdpa", "adamw", MIXED),
    ("deepseek-v2-eager", "full", 2, 256, False, "eager", "adamw", BF16),
    ("deepseek-v2-eager", "lora", 2, 256, True, "eager", "adamw", BF16),
    ("qwen2-moe", "full", 2, 256, False, "sdpa", "adamw", BF16),
    ("qwen2-moe", "full", 2, 256, False, "eager", "sgd", FP32),
    ("qwen2-moe", "lora", 2, 256, False, "sdpa", "adamw", FP32),
    ("qwen2-moe", "lora", 2, 256, False, "sdpa", "adamw", MIXED),
    # checkpointing: the recomputed block peaks at the routing-weight combine, whose gradients
    # are bf16 here (Qwen2-MoE casts its top-k weights back; they were taken as fp32: +11 %)
    ("qwen2-moe", "lora", 2, 256, True, "sdpa", "adamw", BF16),
]


def _case_id(case: Case) -> str:
    return "-".join(str(x) for x in case)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_allocated_peak_matches_simulation(case: Case) -> None:
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    arch, method, b, s, ckpt, attn, opt, precision = case
    config = CONFIGS[arch]
    strategy = Strategy(method=Method(method),
                        recipe=Recipe.HF if precision is MIXED else Recipe.PLAIN,
                        precision=precision, optimizer=Optimizer(opt), batch_size=b, seq_len=s,
                        checkpointing=Checkpointing.FULL if ckpt else Checkpointing.NONE,
                        attention=Attention(attn), lora_rank=8, lora_alpha=16)
    measured = measure_step(StepSetup(config=config, strategy=strategy, optimizer_impl="fused"))
    spec = parse_model_config(config, name=arch)
    estimate = estimate_memory(spec, strategy, MemoryAssumptions(adamw_impl="fused"))
    tensors = estimate.allocated_peak_bytes - int(
        estimate.breakdown.value("overheads/cublas_workspace"))  # GPU-only, not simulated
    assert estimate.trainable_params == measured.trainable_params
    assert abs(tensors - measured.peak_bytes) / measured.peak_bytes <= 0.03, (
        f"estimated {tensors} ({estimate.peak_phase}) vs measured {measured.peak_bytes} "
        f"({measured.peak_phase})")


def test_mla_block_saves_what_autograd_saves() -> None:
    """One MLA + routed/shared-expert block, bf16 full fine-tuning on SDPA: the bytes
    ``block_saved`` counts equal the storages autograd saves for backward in that block
    (``saved_tensors_hooks``), but for the RoPE cos/sin every block shares (counted once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tuneplan.core.job.recipes import precision_plan
    from tuneplan.core.memory import activations as act

    config = CONFIGS["deepseek-v3"]
    hf = AutoConfig.for_model(**config)
    hf.use_cache = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, attn_implementation="sdpa",
                                             dtype=torch.bfloat16)
    block = model.model.layers[1]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    inside = [False]
    block.register_forward_pre_hook(lambda m, a: inside.__setitem__(0, True))
    block.register_forward_hook(lambda m, a, o: inside.__setitem__(0, False))

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside[0]:
            storage = t.untyped_storage()
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    ids = torch.randint(0, 128, (2, 64))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    measured = sum(n for ptr, n in seen.items() if ptr not in params)
    spec = parse_model_config(config, name="deepseek-v3")
    strategy = Strategy(method=Method.FULL, recipe=Recipe.PLAIN, precision=BF16, batch_size=2,
                        seq_len=64)
    w = act.widths(strategy, precision_plan(strategy), 1)
    saved = act.block_saved(spec, spec.layers[-1], strategy, w,
                            act.Shape(batch=2, seq_q=64, seq_kv=64))
    rope = 2 * 64 * 8 * 2   # cos and sin, S·qk_rope_head_dim·bf16 each
    assert spec.layers[-1].num_experts == 4
    assert abs(sum(saved.values()) + rope - measured) <= 0.01 * measured
