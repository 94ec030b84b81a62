"""Known answers for FLOPs per token, and properties of the throughput and communication model."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.communication import KNOWN_SHARDING, communication_per_step
from tuneplan.core.compute.throughput import (
    ComputeJob,
    LinearShape,
    ModelShape,
    estimate_throughput,
    flops_per_token,
    model_flops,
)
from tuneplan.errors import UnsupportedError

A = ThroughputAssumptions()


def _model(layers: int = 4, hidden: int = 256, mlp: int = 512, vocab: int = 1000) -> ModelShape:
    linears = tuple(
        LinearShape(name=name, in_features=i, out_features=o, active=layers, stored=layers,
                    role=role)
        for name, i, o, role in (("q_proj", hidden, hidden, "attention"),
                                 ("k_proj", hidden, hidden, "attention"),
                                 ("v_proj", hidden, hidden, "attention"),
                                 ("o_proj", hidden, hidden, "attention"),
                                 ("up_proj", hidden, mlp, "mlp"),
                                 ("down_proj", mlp, hidden, "mlp")))
    total = sum(lin.in_features * lin.out_features * layers for lin in linears) + 2 * vocab * hidden
    return ModelShape(name="tiny", total_params=total, num_layers=layers, hidden_size=hidden,
                      attention_dim=hidden, vocab_size=vocab, linears=linears)


def _non_attention(breakdown) -> float:  # type: ignore[no-untyped-def]
    return breakdown.total - breakdown.value("forward/attention") - breakdown.value(
        "backward/attention")


def test_full_training_is_6n_per_token_without_recompute() -> None:
    model = _model()
    job = ComputeJob(method="full", gradient_checkpointing=False)
    flops = flops_per_token(model, job, A, context=2048)
    assert _non_attention(flops) == 6 * model.matmul_params
    # N counts the output head (vocab x hidden) but not the embedding lookup.
    assert model.matmul_params == 4 * (4 * 256 * 256 + 2 * 256 * 512) + 1000 * 256


def test_recompute_adds_one_forward_8n() -> None:
    model = _model()
    job = ComputeJob(method="full", gradient_checkpointing=True)
    flops = flops_per_token(model, job, A, context=512)
    attn = flops.value("forward/attention")
    assert flops.total - 4 * attn == 8 * model.matmul_params  # attention: fwd, bwd 2x, recompute
    assert model_flops(flops) == pytest.approx(6 * model.matmul_params + 3 * attn)


def test_lora_is_4n_plus_adapter_terms() -> None:
    model = _model()
    job = ComputeJob(method="lora", lora_rank=8, lora_targets=("q_proj", "v_proj"),
                     gradient_checkpointing=False)
    flops = flops_per_token(model, job, A, context=128)
    adapters = 4 * 2 * 8 * (256 + 256)  # layers x targets x r x (in + out)
    assert _non_attention(flops) == 4 * model.matmul_params + 6 * adapters
    assert flops.value("backward/weight-grads") == 0


def test_attention_term_uses_the_causal_factor() -> None:
    model = _model()
    flops = flops_per_token(model, ComputeJob(method="full"), A, context=1024)
    assert flops.value("forward/attention") == 4 * 4 * 1024 * 256 * 0.5
    eager = flops_per_token(model, ComputeJob(method="full", attention="eager"), A, context=1024)
    assert eager.value("forward/attention") == 4 * 4 * 1024 * 256 * 1.0


def test_moe_counts_only_routed_experts() -> None:
    expert = LinearShape(name="w1", in_features=64, out_features=128, active=2 * 2, stored=2 * 8,
                         role="expert")
    model = ModelShape(name="moe", total_params=10**6, num_layers=2, hidden_size=64,
                       attention_dim=64, vocab_size=10, linears=(expert,))
    assert model.block_matmul_params == 4 * 64 * 128
    assert model.stored_block_params == 16 * 64 * 128


def test_step_terms_sum_and_tokens_per_second() -> None:
    result = estimate_throughput(_model(), ComputeJob(method="full", batch_size=2, seq_len=512),
                                 load_gpu_spec("A100 80GB SXM4"), tokens=10**6, epochs=2)
    assert result.step_seconds == pytest.approx(sum(t.value for t in result.step))
    assert result.tokens_per_second == pytest.approx(2 * 512 / result.step_seconds)
    assert result.hours == pytest.approx(2 * 10**6 / result.tokens_per_second / 3600)
    assert 0 < result.mfu < 1
    assert "host_overhead_s_per_layer_pass" in result.as_dict()["assumptions"]


def test_bf16_on_a_gpu_without_bf16_falls_back_to_fp16() -> None:
    v100 = load_gpu_spec("V100 SXM2 16GB")
    result = estimate_throughput(_model(), ComputeJob(method="lora"), v100)
    assert any("FP16" in note for note in result.notes)
    assert result.peak_flops_per_s == 125e12


def test_unknown_method_is_refused() -> None:
    with pytest.raises(UnsupportedError):
        ComputeJob(method="magic")


@settings(max_examples=60, deadline=None)
@given(sharding=st.sampled_from(sorted(KNOWN_SHARDING)), n=st.integers(1, 63),
       more=st.integers(1, 64), accum=st.integers(1, 16),
       params=st.integers(1, 10**11), grads=st.integers(1, 10**11))
def test_more_gpus_never_lower_comm_volume_per_step(sharding: str, n: int, more: int,
                                                    accum: int, params: int, grads: int) -> None:
    def volume(ranks: int) -> float:
        return float(communication_per_step(sharding=sharding, ranks=ranks, grad_accum=accum,
                                            param_bytes=params, grad_bytes=grads).total)
    assert volume(n + more) >= volume(n)


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(2, 80), hidden=st.sampled_from([512, 2048, 4096, 8192]),
       seq=st.sampled_from([256, 1024, 4096]), batch=st.integers(1, 8),
       method=st.sampled_from(["full", "lora", "qlora"]),
       gpu=st.sampled_from(["H100 SXM5", "A100 80GB SXM4", "H200 SXM", "B200 (HGX)"]))
def test_pcie_node_never_faster_than_nvswitch_under_zero3(
        layers: int, hidden: int, seq: int, batch: int, method: str, gpu: str) -> None:
    model = _model(layers=layers, hidden=hidden, mlp=4 * hidden, vocab=32_000)
    spec = load_gpu_spec(gpu)
    jobs = {link: ComputeJob(method=method, gpus=8, sharding="zero3", seq_len=seq,
                             batch_size=batch, intra_node_link=link) for link in ("pcie", "nvlink")}
    pcie = estimate_throughput(model, jobs["pcie"], spec).tokens_per_second
    nvlink = estimate_throughput(model, jobs["nvlink"], spec).tokens_per_second
    assert pcie <= nvlink


def test_faster_efficiency_gives_more_tokens() -> None:
    faster = dataclasses.replace(A, matmul_efficiency_by_architecture=(("Ampere", 0.9),))
    job = ComputeJob(method="full", seq_len=4096, batch_size=4)
    gpu = load_gpu_spec("A100 80GB SXM4")
    base = estimate_throughput(_model(hidden=4096, layers=8), job, gpu)
    quick = estimate_throughput(_model(hidden=4096, layers=8), job, gpu, assumptions=faster)
    assert quick.tokens_per_second > base.tokens_per_second


CASES = Path(__file__).parents[2] / "benchmarks" / "calibration" / "cases.jsonl"


def test_calibration_median_error_within_15_percent() -> None:
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "throughput_accuracy.py"
    spec = importlib.util.spec_from_file_location("throughput_accuracy", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.evaluate(CASES)
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    assert len(errors) >= 80
    assert statistics.median(errors) <= 15
    assert json.dumps(rows)  # rows are plain data


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B"])
def test_shape_from_spec_keeps_exact_totals(name: str) -> None:
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.compute.throughput import model_shape_from_spec
    from tuneplan.core.models import count_parameters

    spec = resolve_model(name)
    shape = model_shape_from_spec(spec)
    assert shape.total_params == count_parameters(spec).total
    if spec.is_moe:  # 8 of 128 experts per token: far fewer matmul weights than stored
        assert shape.block_matmul_params * 5 < shape.stored_block_params
    else:  # Llama-3.1-8B: N = all weights but the input embedding (the head is untied)
        assert shape.matmul_params == 8_030_261_248 - 128_256 * 4096 - 65 * 4096


def test_strategy_maps_to_the_speed_model() -> None:
    from tuneplan.core.compute.throughput import compute_job_from_strategy
    from tuneplan.core.job.methods import Method
    from tuneplan.core.job.strategy import Checkpointing, Sharding, Strategy

    strategy = Strategy(method=Method.QLORA, checkpointing=Checkpointing.OFFLOAD, gpus=4,
                        sharding=Sharding.ZERO3, lora_rank=64)
    job = compute_job_from_strategy(strategy, avg_tokens=300)
    assert (job.method, job.lora_rank, job.sharding, job.ranks) == ("qlora", 64, "zero3", 4)
    assert job.offload_activations and not job.gradient_checkpointing and job.recompute
    assert job.tokens_per_sequence(A) == (300, round(300 * A.padding_factor))
