"""``--recipe unsloth``'s own speed terms (``core.compute.unsloth``), each from its kernels'
source (unsloth 2026.8.19, unsloth-zoo 2026.8.13), on the memory model's fast path: unsloth
and hf differ on the same job by exactly these terms, worked out by hand here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.throughput import Throughput, estimate_throughput
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Checkpointing, Loss, Strategy
from tuneplan.core.models import parse_model_config

# L=4, H=256, 4 heads of 64, 2 kv heads, I=512; T = 4 x 2048 = 8192 tokens: a layer input is
# 8192 x 256 x 2 B = 4 MiB, above unsloth-zoo's 2 MiB MINIMUM_SIZE
TINY = parse_model_config(
    {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1000,
     "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
     "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}, name="tiny")
GPU = load_gpu_spec("A100 80GB SXM4")
JOB = Strategy(method=Method.LORA, seq_len=2048, batch_size=4, loss=Loss.CHUNKED,
               checkpointing=Checkpointing.OFFLOAD, recipe=Recipe.UNSLOTH)
T, H, L, C = 8192, 256, 4, 2
FUSED = {"micro-batch/unsloth-fused-norms", "micro-batch/unsloth-fused-rotary",
         "micro-batch/unsloth-fused-activation", "micro-batch/unsloth-fused-mixed-precision-casts"}
OFFLOAD = "micro-batch/unsloth-checkpoint-offload-exposed"


def _run(s: Strategy, a: ThroughputAssumptions | None = None) -> Throughput:
    return estimate_throughput(TINY, s, GPU, assumptions=a)


def _terms(t: Throughput) -> dict[str, object]:
    return {term.path: term for term in t.step.terms}


@pytest.mark.parametrize("method", [Method.LORA, Method.QLORA])
def test_unsloth_and_hf_differ_by_exactly_the_unsloth_terms(method: Method) -> None:
    job = replace(JOB, method=method)
    ours, hf = _terms(_run(job)), _terms(_run(replace(job, recipe=Recipe.HF)))
    assert set(ours) - set(hf) == FUSED | {OFFLOAD}
    # PEFT's scale and add around each frozen GEMM; unsloth's matmul_lora folds them into
    # out.addmm_(XA, B, alpha=s)
    assert set(hf) - set(ours) == {"micro-batch/adapter-output"}
    for path, term in hf.items():
        if path not in ours:
            continue
        assert ours[path].value == term.value, path           # type: ignore[attr-defined]
    if method is Method.QLORA:
        dq = ours["micro-batch/nf4-dequantize"]
        # matmul_lora forward + fast_dequantize(W.t()) in backward + the recompute
        assert dq.inputs["passes"] == 3                        # type: ignore[attr-defined]
        assert "fast_dequantize(W.t(), W_quant)" in dq.source  # type: ignore[attr-defined]
        assert "MatMul4Bit" in hf["micro-batch/nf4-dequantize"].source  # type: ignore[attr-defined]


def test_offloaded_checkpoints_move_every_layer_input_but_the_last_twice() -> None:
    slow = replace(ThroughputAssumptions(), host_link_bytes_per_s=1e6)   # copies dominate
    slow_run = _run(JOB, slow)
    term = _terms(slow_run)[OFFLOAD]
    assert slow_run.bound == "host"                            # a host-link limit
    i = term.inputs                                            # type: ignore[attr-defined]
    assert i["offloaded_layers"] == L - 1                      # LAST_GC_INDEX: not the last
    assert i["bytes"] == 2 * (L - 1) * T * H * C
    copy = T * H * C / 1e6
    assert i["copy_s_per_layer"] == pytest.approx(copy)
    # each copy exposed beyond its window: the layer's forward, and the recompute + backward
    assert term.value == pytest.approx(                        # type: ignore[attr-defined]
        (L - 1) * (2 * copy - i["forward_window_s"] - i["backward_window_s"]))
    # the windows split the GPU compute by FLOPs: one forward against recompute + backward
    assert 0.25 < i["forward_flops_share"] < 0.4
    fast = _terms(_run(JOB))[OFFLOAD]
    assert fast.value == 0.0                                   # type: ignore[attr-defined]


def test_no_copies_below_unsloths_offload_thresholds() -> None:
    short = replace(JOB, seq_len=256, batch_size=32)           # same T, seq < 512
    t = _run(short)
    assert OFFLOAD not in _terms(t)
    assert any("falls back to standard checkpointing" in n for n in t.notes)
    small = replace(JOB, batch_size=2)                         # 4096 x 256 = 2 MiB: not above
    t = _run(small)
    assert OFFLOAD not in _terms(t)
    assert any("MINIMUM_SIZE" in n for n in t.notes)
    assert OFFLOAD not in _terms(_run(replace(JOB, checkpointing=Checkpointing.FULL)))


def test_outside_the_fast_path_hf_timing_with_a_note() -> None:
    job = replace(JOB, lora_dropout=0.1)
    t = _run(job)
    assert not [p for p in _terms(t) if "unsloth" in p]
    assert any("outside unsloth's modelled fast path (LoRA dropout" in n for n in t.notes)
    hf = _terms(_run(replace(job, recipe=Recipe.HF)))
    assert {p: x.value for p, x in _terms(t).items()} == {     # type: ignore[attr-defined]
        p: x.value for p, x in hf.items()}                     # type: ignore[attr-defined]


def test_fused_elementwise_terms_are_counted_at_the_elementwise_share() -> None:
    terms = _terms(_run(JOB))
    assert all(terms[p].value == 0 for p in FUSED)             # type: ignore[attr-defined]
    norms = terms["micro-batch/unsloth-fused-norms"].inputs    # type: ignore[attr-defined]
    n = 2 * L + 1
    # Fast_RMS_Layernorm: forward X in, Y out + fp32 r per row (twice: recompute); backward
    # dY, X in, dX out + r
    assert norms["unsloth_bytes"] == T * (2 * n * (2 * C * H + 4) + n * (3 * C * H + 4))
    rotary = terms["micro-batch/unsloth-fused-rotary"].inputs  # type: ignore[attr-defined]
    # fast_rope_embedding without position ids: in place, read + write each way
    assert rotary["unsloth_bytes"] == T * L * (4 + 2) * 64 * (2 * 2 * C + 2 * C)
    swiglu = terms["micro-batch/unsloth-fused-activation"].inputs  # type: ignore[attr-defined]
    assert swiglu["unsloth_bytes"] == T * L * 512 * (2 * 3 * C + 6 * C)
    assert all(terms[p].inputs["saved_bytes"] > 0 for p in FUSED)  # type: ignore[attr-defined]
    full = replace(ThroughputAssumptions(), elementwise_exposed_share=1.0)
    counted = _terms(_run(JOB, full))
    bandwidth = float(GPU.memory_bandwidth_bytes_per_s or 0) * full.elementwise_bandwidth_efficiency
    # hf's norms term + unsloth's saving = unsloth's kernel bytes at DRAM rate
    assert (counted["micro-batch/norms"].value                 # type: ignore[attr-defined]
            + counted["micro-batch/unsloth-fused-norms"].value  # type: ignore[attr-defined]
            ) == pytest.approx(norms["unsloth_bytes"] / bandwidth)
    assert "rms_layernorm.py" in counted["micro-batch/unsloth-fused-norms"].source  # type: ignore[attr-defined]
