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
from tuneplan.core.compute.communication import (
    KNOWN_SHARDING,
    NodeLinks,
    communication_per_step,
)
from tuneplan.core.compute.throughput import (
    ModelShape,
    estimate_throughput,
    flops_per_token,
    model_flops,
    model_shape_from_spec,
    tokens_per_sequence,
)
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Attention, Checkpointing, Sharding, Strategy
from tuneplan.core.models import LayerSpec, Linear, LinearRole, MlpKind, ModelSpec, NormKind
from tuneplan.errors import UnsupportedError

A = ThroughputAssumptions()
NO_RECOMPUTE = Checkpointing.NONE


def _spec(layers: int, hidden: int, vocab: int, linears: tuple[Linear, ...], *,
          model_type: str = "llama", experts: int = 0, per_token: int = 0) -> ModelSpec:
    block = LayerSpec(kind="decoder", count=layers, linears=linears, norm_params=0,
                      num_experts=experts, experts_per_token=per_token)
    return ModelSpec(
        name="tiny", model_type=model_type, hidden_size=hidden, num_layers=layers,
        num_heads=hidden // 64, num_kv_heads=hidden // 64, head_dim=64,
        intermediate_size=max(lin.out_features for lin in linears), vocab_size=vocab,
        max_position_embeddings=None, tie_word_embeddings=False, norm_kind=NormKind.RMSNORM,
        mlp_kind=MlpKind.PLAIN, hidden_act="silu", layers=(block,),
        embedding_params=vocab * hidden, final_norm_params=0, num_experts=experts,
        num_experts_per_token=per_token)


def _model(layers: int = 4, hidden: int = 256, mlp: int = 512, vocab: int = 1000) -> ModelShape:
    linears = tuple(
        Linear(name=name, in_features=i, out_features=o, bias=False, role=role)
        for name, i, o, role in (("q_proj", hidden, hidden, LinearRole.ATTENTION),
                                 ("k_proj", hidden, hidden, LinearRole.ATTENTION),
                                 ("v_proj", hidden, hidden, LinearRole.ATTENTION),
                                 ("o_proj", hidden, hidden, LinearRole.ATTENTION),
                                 ("up_proj", hidden, mlp, LinearRole.MLP),
                                 ("down_proj", mlp, hidden, LinearRole.MLP)))
    shape = model_shape_from_spec(_spec(layers, hidden, vocab, linears))
    assert shape.total_params == sum(lin.params for lin in linears) * layers + 2 * vocab * hidden
    return shape


def _non_attention(breakdown) -> float:  # type: ignore[no-untyped-def]
    return breakdown.total - breakdown.value("forward/attention") - breakdown.value(
        "backward/attention")


def test_full_training_is_6n_per_token_without_recompute() -> None:
    model = _model()
    job = Strategy(method=Method.FULL, checkpointing=NO_RECOMPUTE)
    flops = flops_per_token(model, job, A, context=2048)
    assert _non_attention(flops) == 6 * model.matmul_params
    # N counts the output head (vocab x hidden) but not the embedding lookup.
    assert model.matmul_params == 4 * (4 * 256 * 256 + 2 * 256 * 512) + 1000 * 256


def test_recompute_adds_one_forward_8n() -> None:
    model = _model()
    job = Strategy(method=Method.FULL, checkpointing=Checkpointing.FULL)
    flops = flops_per_token(model, job, A, context=512)
    attn = flops.value("forward/attention")
    assert flops.total - 4 * attn == 8 * model.matmul_params  # attention: fwd, bwd 2x, recompute
    assert model_flops(flops) == pytest.approx(6 * model.matmul_params + 3 * attn)


def test_lora_is_4n_plus_adapter_terms() -> None:
    model = _model()
    job = Strategy(method=Method.LORA, lora_rank=8, lora_targets=("q_proj", "v_proj"),
                   checkpointing=NO_RECOMPUTE)
    flops = flops_per_token(model, job, A, context=128)
    adapters = 4 * 2 * 8 * (256 + 256)  # layers x targets x r x (in + out)
    assert _non_attention(flops) == 4 * model.matmul_params + 6 * adapters
    assert flops.value("backward/weight-grads") == 0


def test_attention_term_uses_the_causal_factor() -> None:
    model = _model()
    flops = flops_per_token(model, Strategy(method=Method.FULL), A, context=1024)
    assert flops.value("forward/attention") == 4 * 4 * 1024 * 256 * 0.5
    eager = flops_per_token(model, Strategy(method=Method.FULL, attention=Attention.EAGER), A,
                            context=1024)
    assert eager.value("forward/attention") == 4 * 4 * 1024 * 256 * 1.0


def _moe(model_type: str) -> ModelShape:
    """2 blocks: attention q_proj, a router over 8 experts, fused experts (2 of 8 per token)."""
    linears = (
        Linear(name="q_proj", in_features=64, out_features=64, bias=False,
               role=LinearRole.ATTENTION),
        Linear(name="gate", in_features=64, out_features=8, bias=False, role=LinearRole.ROUTER),
        Linear(name="experts.gate_up_proj", in_features=64, out_features=256, bias=False,
               role=LinearRole.EXPERT, copies=8),
        Linear(name="experts.down_proj", in_features=128, out_features=64, bias=False,
               role=LinearRole.EXPERT, copies=8))
    return model_shape_from_spec(_spec(2, 64, 10, linears, model_type=model_type, experts=8,
                                       per_token=2))


def test_moe_counts_only_routed_experts() -> None:
    model = _moe("mixtral")
    per_block = 64 * 64 + 64 * 8
    assert model.block_matmul_params == 2 * (per_block + 2 * (64 * 256 + 128 * 64))
    assert model.stored_block_params == 2 * (per_block + 8 * (64 * 256 + 128 * 64))


def test_moe_all_linear_lora_adapts_routers_and_routed_experts() -> None:
    """PEFT 0.21 on a converted MoE type wraps the router and the fused experts (2r on
    gate_up): FLOPs count the experts a token is routed to, trainable counts all of them."""
    from tuneplan.core.compute.step import trainable_params
    from tuneplan.core.job.methods import count_trainable

    strategy = Strategy(method=Method.LORA, lora_rank=4, checkpointing=NO_RECOMPUTE)
    model = _moe("mixtral")
    flops = flops_per_token(model, strategy, A, context=16)
    q, router = 4 * (64 + 64), 4 * (64 + 8)
    gate_up, down = 8 * (64 + 256), 4 * (128 + 64)
    per_token = 2 * (q + router + 2 * (gate_up + down))
    stored = 2 * (q + router + 8 * (gate_up + down))
    assert flops.value("adapters") == 6 * per_token
    term = flops.get("adapters")
    assert term is not None and term.inputs["adapter_params"] == stored
    assert trainable_params(model, strategy) == stored == count_trainable(model.spec,
                                                                          strategy).total
    # a type PEFT does not convert: all-linear leaves the fused experts and the router alone
    plain = _moe("granitemoe")
    assert flops_per_token(plain, strategy, A, context=16).value("adapters") == 6 * 2 * q


def test_step_terms_sum_and_tokens_per_second() -> None:
    result = estimate_throughput(_model(), Strategy(method=Method.FULL, batch_size=2, seq_len=512),
                                 load_gpu_spec("A100 80GB SXM4"), tokens=10**6, epochs=2)
    assert result.step_seconds == pytest.approx(sum(t.value for t in result.step))
    assert result.tokens_per_second == pytest.approx(2 * 512 / result.step_seconds)
    assert result.hours == pytest.approx(2 * 10**6 / result.tokens_per_second / 3600)
    assert 0 < result.mfu < 1
    assert "host_overhead_s_per_layer_pass" in result.as_dict()["assumptions"]


def test_bf16_on_a_gpu_without_bf16_falls_back_to_fp16() -> None:
    v100 = load_gpu_spec("V100 SXM2 16GB")
    result = estimate_throughput(_model(), Strategy(method=Method.LORA), v100)
    assert any("FP16" in note for note in result.notes)
    assert result.peak_flops_per_s == 125e12


def test_auto_method_and_bad_rank_are_refused() -> None:
    gpu = load_gpu_spec("A100 80GB SXM4")
    with pytest.raises(UnsupportedError, match="auto"):
        estimate_throughput(_model(), Strategy(method=Method.AUTO), gpu)
    with pytest.raises(UnsupportedError, match="lora-rank"):
        estimate_throughput(_model(), Strategy(lora_rank=0), gpu)
    with pytest.raises(UnsupportedError, match="matches --lora-targets"):
        estimate_throughput(_model(), Strategy(lora_targets=("w_missing",)), gpu)
    with pytest.raises(UnsupportedError, match="inside a node"):
        NodeLinks(intra="infiniband")


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
    job = Strategy(method=Method(method), gpus=8, sharding=Sharding.ZERO3, seq_len=seq,
                   batch_size=batch)
    pcie = estimate_throughput(model, job, spec, links=NodeLinks(intra="pcie")).tokens_per_second
    nvlink = estimate_throughput(model, job, spec,
                                 links=NodeLinks(intra="nvlink")).tokens_per_second
    assert pcie <= nvlink


def test_faster_efficiency_gives_more_tokens() -> None:
    faster = dataclasses.replace(A, matmul_efficiency_by_architecture=(("Ampere", 0.9),))
    job = Strategy(method=Method.FULL, seq_len=4096, batch_size=4)
    gpu = load_gpu_spec("A100 80GB SXM4")
    base = estimate_throughput(_model(hidden=4096, layers=8), job, gpu)
    quick = estimate_throughput(_model(hidden=4096, layers=8), job, gpu, assumptions=faster)
    assert quick.tokens_per_second > base.tokens_per_second


CASES = Path(__file__).parents[2] / "benchmarks" / "calibration" / "cases.jsonl"


def test_calibration_median_error_within_15_percent() -> None:
    from tests.test_accuracy_benchmarks import _load  # registers it (its dataclasses need it)

    module = _load("throughput_accuracy")
    rows = module.evaluate(CASES)
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    assert len(errors) >= 80
    assert statistics.median(errors) <= 15
    assert json.dumps(rows)  # rows are plain data


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B"])
def test_shape_from_spec_keeps_exact_totals(name: str) -> None:
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.models import count_parameters

    spec = resolve_model(name)
    shape = model_shape_from_spec(spec)
    assert shape.total_params == count_parameters(spec).total
    if spec.is_moe:  # 8 of 128 experts per token: far fewer matmul weights than stored
        assert shape.block_matmul_params * 5 < shape.stored_block_params
    else:  # Llama-3.1-8B: N = all weights but the input embedding (the head is untied)
        assert shape.matmul_params == 8_030_261_248 - 128_256 * 4096 - 65 * 4096


def test_checkpointing_and_padding_are_read_from_the_strategy() -> None:
    from tuneplan.core.compute.step import recomputes

    offload = Strategy(method=Method.QLORA, checkpointing=Checkpointing.OFFLOAD, gpus=4,
                       sharding=Sharding.ZERO3, lora_rank=64)
    assert recomputes(offload) and not recomputes(Strategy(checkpointing=NO_RECOMPUTE))
    assert tokens_per_sequence(offload, 300, A) == (300, round(300 * A.padding_factor))
    assert tokens_per_sequence(offload, None, A) == (2048, 2048)
    prompt = Strategy(method=Method.PROMPT, num_virtual_tokens=50, packing=True)
    assert tokens_per_sequence(prompt, 300, A) == (2048, 2098)
    flops = flops_per_token(_model(), offload, A, context=128)
    assert flops.value("recompute/forward") > 0
