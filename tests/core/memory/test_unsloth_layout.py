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


def _offload_terms(model, job):  # type: ignore[no-untyped-def]
    est = estimate_memory(model, job)
    fwd = {p.path: p.value for p in unsloth.moments(model, job, [], [], [])["forward-logits"]}
    return est, fwd


def test_below_512_tokens_unsloth_checkpoints_on_the_device() -> None:
    # apply_unsloth_gradient_checkpointing: max_seq_length < 512 falls back to standard
    # checkpointing: every layer input on the device, no host copies, no GPU buffers
    est, fwd = _offload_terms(TINY, replace(JOB, checkpointing=Checkpointing.OFFLOAD))
    assert fwd["activations/checkpoints"] == 2 * 8 * 64 * 2          # L·T·H·bf16
    assert "activations/offload_gpu_buffers" not in fwd
    assert "host/offloaded_checkpoints" not in {t.path for t in est.host.terms}


def test_a_layer_input_under_2_mib_stays_on_the_device() -> None:
    # seq 512: the smart checkpointer runs (its initial buffers exist) but a 512·64·2 B
    # input is not above MINIMUM_SIZE (2 MiB): kept on the device, nothing copied
    job = replace(JOB, checkpointing=Checkpointing.OFFLOAD, seq_len=512)
    est, fwd = _offload_terms(TINY, job)
    assert fwd["activations/checkpoints"] == 2 * 512 * 64 * 2
    assert fwd["activations/offload_gpu_buffers"] == 2 * 2 * 256 * 2048 * 2
    assert est.host.value("host/offloaded_checkpoints") == 200 * 128 * 1024 * 2
    assert unsloth.offloaded_layers(TINY, job)[0] == 0


def test_offloaded_inputs_leave_the_last_layer_and_two_gpu_buffers_on_the_device() -> None:
    mid = parse_model_config(
        {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 320,
         "hidden_size": 2048, "intermediate_size": 4096, "num_hidden_layers": 3,
         "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}, name="mid")
    job = replace(JOB, checkpointing=Checkpointing.OFFLOAD, seq_len=1024)
    est, fwd = _offload_terms(mid, job)
    layer_input = 1024 * 2048                                        # 2 Mi elements > 1 Mi
    # LAST_GC_INDEX: the last layer's input stays on the device from the second step on
    assert fwd["activations/checkpoints"] == 1 * layer_input * 2
    # GPU_BUFFERS and GPU_BUFFERS_B, each grown to one layer input
    assert fwd["activations/offload_gpu_buffers"] == 2 * layer_input * 2
    # 200 pinned CPU buffers of 128 Ki elements, the first 3 grown to a layer input (the
    # first step offloads all three)
    assert est.host.value("host/offloaded_checkpoints") == (
        3 * layer_input + 197 * 128 * 1024) * 2
    assert unsloth.offloaded_layers(mid, job)[0] == 2
    # the buffers persist through the optimizer step; the recompute adds no copy of its own
    opt = {p.path for p in unsloth.moments(mid, job, [], [], [])["optimizer"]}
    assert "activations/offload_gpu_buffers" in opt
    full = estimate_memory(mid, replace(job, checkpointing=Checkpointing.FULL))
    assert full.breakdown.value("activations/checkpoints") == 3 * layer_input * 2


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
