"""``--recipe unsloth``: Unsloth's own layout, modelled from its kernels' source (unsloth
2026.8.19 ``kernels/fast_lora.py``, ``rms_layernorm.py``; unsloth-zoo 2026.8.13
``gradient_checkpointing.py``, ``fused_losses/cross_entropy_loss.py``), not simulated: each
figure below is worked out by hand from what the autograd functions ``save_for_backward``."""

from __future__ import annotations

from dataclasses import replace

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Checkpointing, Loss, Strategy
from tuneplan.core.memory import estimate_memory, unsloth
from tuneplan.core.memory.parts import part
from tuneplan.core.models import parse_model_config

TINY = parse_model_config(
    {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 320,
     "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
     "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}, name="tiny")
# H=64, L=2, T=8 (B=1, S=8), 4 heads of 16, 2 kv heads, I=128, V=320, bf16 activations
JOB = Strategy(method=Method.LORA, recipe=Recipe.UNSLOTH, seq_len=8, batch_size=1,
               checkpointing=Checkpointing.NONE)


def test_block_saved_tensors_by_hand() -> None:
    one = unsloth.block_saved(unsloth.dims(TINY, JOB))
    norm = 8 * 64 * 2 + 8 * 4          # Fast_RMS_Layernorm saves X (bf16) and r (fp32 / row)
    assert one == {
        "norms": 2 * norm,
        "qkv_input": 8 * 64 * 2,       # LoRA_QKV saves X only (W dequantised in backward)
        # q, out (4·16 wide), k, v (2·16 wide: no GQA copies), fp32 lse B·heads·S
        "attention": 2 * 8 * 64 * 2 + 2 * 8 * 32 * 2 + 1 * 4 * 8 * 4,
        "mlp": 8 * 64 * 2 + 2 * 8 * 128 * 2,   # LoRA_MLP saves X, e, g (not h, not T·r)
    }


def test_moment_terms_by_hand() -> None:
    est = estimate_memory(TINY, JOB)
    assert "modelled from source, not simulated" in " ".join(est.notes)
    items = {p.path: p for p in unsloth.moments(TINY, JOB, [], [], [])["forward-logits"]}
    assert items["activations/blocks"].value == 2 * 11456
    assert items["activations/head"].value == 8 * 64 * 2 + 8 * 4
    assert items["logits/fused_grad_inputs"].value == 8 * 64 * 2
    assert items["logits/fused_chunk"].value == 8 * 320 * (2 + 8)     # one chunk: all 8 rows
    assert all("not simulated" in p.source for p in items.values())
    assert items["logits/fused_chunk"].inputs["confidence"] == "low"
    assert est.phases["forward-logits"] > 0


def test_chunk_count_follows_unsloth_zoo_get_chunk_size() -> None:
    d = unsloth.dims(TINY, JOB)
    # full fp32 logits GiB / 4 GiB target, rounded up to a multiple of 4; one chunk if <= 1
    assert unsloth.chunks(replace(d, t=16384, vocab=128256)) == 4    # 2.0039 -> 4
    assert unsloth.chunks(replace(d, t=4096, vocab=128256)) == 1     # 0.489
    assert unsloth.chunks(replace(d, t=65536, vocab=128256)) == 8    # 8.0156 -> 8


def test_unsloth_below_hf_without_full_logits_or_fp32_norms() -> None:
    l8b = resolve_model("meta-llama/Llama-3.1-8B")
    job = replace(JOB, seq_len=16384)
    ours = estimate_memory(l8b, job)
    hf = estimate_memory(l8b, replace(job, recipe=Recipe.HF, loss=Loss.CHUNKED))
    assert ours.allocated_peak_bytes < hf.allocated_peak_bytes
    fwd = {p.path: p.value for p in unsloth.moments(l8b, job, [], [], [])["forward-logits"]}
    # 4 chunks of 4096 rows (fp32 logits 8 GiB over the 4 GiB target): one chunk's bf16
    # logits, fp32 upcast and fp32 gradient; less than the full T·V fp32 logits
    assert fwd["logits/fused_chunk"] == 4096 * 128256 * 10 < 16384 * 128256 * 4
    # no fp32 copy of the normalised activations: the norms save bf16 X + fp32 r only
    assert unsloth.norm_saved(unsloth.dims(l8b, job)) == 16384 * 4096 * 2 + 16384 * 4


def test_offloaded_checkpoints_are_host_ram_under_unsloth() -> None:
    job = replace(JOB, checkpointing=Checkpointing.OFFLOAD)
    est = estimate_memory(TINY, job)
    assert est.host.value("host/offloaded_checkpoints") == 2 * 8 * 64 * 2   # L·T·H·bf16
    fwd = {p.path: p.value for p in unsloth.moments(TINY, job, [], [], [])["forward-logits"]}
    assert fwd["activations/checkpoints"] == 0
    kept = {p.path: p.value for p in unsloth.moments(
        TINY, replace(JOB, checkpointing=Checkpointing.FULL), [], [], [])["forward-logits"]}
    assert kept["activations/checkpoints"] == 2 * 8 * 64 * 2


def test_outside_the_fast_path_the_hf_layout_stands_in() -> None:
    job = replace(JOB, lora_targets=("q_proj", "v_proj"))
    assert unsloth.uncovered(TINY, job) is not None
    est = estimate_memory(TINY, job)
    assert any("hf layout" in n and "stands in" in n for n in est.notes)


def test_qlora_keeps_unsloths_global_dequant_buffer_and_dequantises_again_in_backward() -> None:
    est = estimate_memory(TINY, replace(JOB, method=Method.QLORA))
    largest = 128 * 64 * 2                 # gate/up/down: I·H in bf16
    at = {p.path: p.value for p in unsloth.moments(
        TINY, replace(JOB, method=Method.QLORA), [], [], [],
        [part("dq", largest, "one weight")])["backward-start"]}
    assert at["activations/dequant_global_buffer"] == largest == at["activations/dequant_backward"]
    assert est.breakdown.value("activations/dequant_global_buffer") == largest
