"""Speed per GPU from physics: each card's own matmul ceiling, quant kernels as inputs,
communication per framework without a flat penalty, offload at the stored width."""

from __future__ import annotations

import dataclasses

import pytest

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.ceiling import matmul_ceiling
from tuneplan.core.compute.communication import NodeLinks
from tuneplan.core.compute.step import gathering_passes, stored_weight_bytes
from tuneplan.core.compute.throughput import (
    ModelShape,
    estimate_throughput,
    model_shape_from_spec,
)
from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.strategy import Checkpointing, Offload, Precision, Sharding, Strategy
from tuneplan.core.models import LayerSpec, Linear, LinearRole, MlpKind, ModelSpec, NormKind

A = ThroughputAssumptions()


def _model(layers: int = 32, hidden: int = 4096, mlp: int = 14336,
           vocab: int = 128_256) -> ModelShape:
    linears = tuple(
        Linear(name=name, in_features=i, out_features=o, bias=False, role=role)
        for name, i, o, role in (("q_proj", hidden, hidden, LinearRole.ATTENTION),
                                 ("k_proj", hidden, hidden // 4, LinearRole.ATTENTION),
                                 ("v_proj", hidden, hidden // 4, LinearRole.ATTENTION),
                                 ("o_proj", hidden, hidden, LinearRole.ATTENTION),
                                 ("gate_proj", hidden, mlp, LinearRole.MLP),
                                 ("up_proj", hidden, mlp, LinearRole.MLP),
                                 ("down_proj", mlp, hidden, LinearRole.MLP)))
    block = LayerSpec(kind="decoder", count=layers, linears=linears, norm_params=2 * hidden)
    spec = ModelSpec(
        name="llama-like", model_type="llama", hidden_size=hidden, num_layers=layers,
        num_heads=hidden // 128, num_kv_heads=hidden // 512, head_dim=128,
        intermediate_size=mlp, vocab_size=vocab, max_position_embeddings=None,
        tie_word_embeddings=False, norm_kind=NormKind.RMSNORM, mlp_kind=MlpKind.GATED,
        hidden_act="silu", layers=(block,), embedding_params=vocab * hidden,
        final_norm_params=hidden)
    return model_shape_from_spec(spec)


MODEL = _model()


def test_each_gpu_gets_its_own_ceiling_not_its_architectures() -> None:
    l40s, rtx4090 = load_gpu_spec("L40S"), load_gpu_spec("RTX 4090")
    h100 = load_gpu_spec("H100 SXM5")
    got = {g.name: matmul_ceiling(g, float(g.bf16_flops_per_s or 0), A)
           for g in (l40s, rtx4090, h100)}
    # both Ada AD102, very different fractions: the L40S is held down by its 350 W limit,
    # the RTX 4090's half-rate FP32-accumulate tensor cores run at full clock
    assert got["L40S"].fraction == pytest.approx(269.15 / 362, rel=1e-6)
    assert got["RTX 4090"].fraction == pytest.approx(164.81 / 165.2, rel=1e-6)
    assert got["H100 SXM5"].flops_per_s == pytest.approx(794.5e12)
    assert {c.basis for c in got.values()} == {"measured"}


def test_an_unmeasured_card_borrows_a_sibling_through_the_power_rule() -> None:
    a10 = load_gpu_spec("A10")  # GA102 at 150 W for 125 TFLOP/s
    ceiling = matmul_ceiling(a10, 125e12, A)
    # same die, nearest in power per peak FLOP: the RTX A6000 (300 W for 154.8)
    assert ceiling.basis == "sibling" and ceiling.source.startswith("RTX A6000")
    ratio = (150 / 125) / (300 / 154.8)
    assert ceiling.fraction == pytest.approx(123.34 / 154.8 * ratio ** (1 / 3), rel=1e-6)
    # a lower power limit per FLOP sustains less clock: H100 PCIe below the SXM's fraction
    assert matmul_ceiling(load_gpu_spec("H100 PCIe"), 756e12, A).fraction < 794.5 / 989.5
    # power to spare never lifts a rule-derived ceiling above the rated rate
    assert matmul_ceiling(load_gpu_spec("L40"), 181e12, A).fraction <= 1.0
    # no measured card of the architecture: the default fraction
    t4 = matmul_ceiling(load_gpu_spec("T4"), 65e12, A)
    assert (t4.basis, t4.fraction) == ("default", A.matmul_fraction_default)


def test_compute_bound_job_faster_on_the_4090_only_where_physics_says_so() -> None:
    l40s, rtx4090 = load_gpu_spec("L40S"), load_gpu_spec("RTX 4090")
    # compute-bound QLoRA of an 8B model: the L40S's ceiling (269 TFLOP/s) beats the 4090's
    # (165): the L40S is faster per GPU
    big = Strategy(method=Method.QLORA, batch_size=8, seq_len=2048)
    on_l40s = estimate_throughput(MODEL, big, l40s)
    on_4090 = estimate_throughput(MODEL, big, rtx4090)
    assert on_l40s.bound == on_4090.bound == "compute"
    assert on_l40s.tokens_per_second > 1.4 * on_4090.tokens_per_second
    # ... and the 4090 reaches the larger share of its own peak (its MFU is higher)
    assert on_4090.mfu > on_l40s.mfu
    # a memory-bound phase (NF4 dequantization each pass, tiny micro-batch) runs on
    # bandwidth, where the 4090 (1008 GB/s) beats the L40S (864 GB/s): its term is shorter
    tiny = Strategy(method=Method.QLORA, batch_size=1, seq_len=128)
    dq = "micro-batch/nf4-dequantize"
    small_4090, small_l40s = (estimate_throughput(MODEL, tiny, g) for g in (rtx4090, l40s))
    assert small_4090.step.value(dq) < small_l40s.step.value(dq)
    # ... and where those phases outweigh the matmuls, the whole job is faster on the 4090
    for small in (small_4090, small_l40s):
        assert small.bound_seconds()["memory"] > small.bound_seconds()["compute"]
    assert small_4090.tokens_per_second > small_l40s.tokens_per_second


def test_nf4_and_gptq_qlora_differ_by_their_kernels() -> None:
    gpu = load_gpu_spec("A100 80GB SXM4")
    nf4 = estimate_throughput(MODEL, Strategy(method=Method.QLORA, quant=Quant.NF4), gpu)
    gptq = estimate_throughput(MODEL, Strategy(method=Method.QLORA, quant=Quant.GPTQ_INT4), gpu)
    nf4_term = nf4.step.get("micro-batch/nf4-dequantize")
    gptq_term = gptq.step.get("micro-batch/gptq-int4-kernels")
    assert nf4_term is not None and gptq_term is not None
    assert nf4.step.get("micro-batch/gptq-int4-kernels") is None
    # the streaming bitsandbytes kernel beats the auto-gptq dequantize-then-GEMM path
    assert nf4_term.value < gptq_term.value
    assert nf4.tokens_per_second > gptq.tokens_per_second
    # bytes per weight and pass: 0.5 packed + double-quant absmax (1/64 + 4/16384) + bf16 out
    assert nf4_term.inputs["bytes_per_param"] == pytest.approx(0.5 + 1 / 64 + 4 / 16384 + 2,
                                                               abs=1e-5)
    assert nf4_term.inputs["efficiency"] == A.nf4_dequant_bandwidth_efficiency
    assert gptq_term.inputs["efficiency"] == A.dequant_bandwidth_efficiency


def test_zero3_step_grows_with_fabric_latency_and_shrinks_with_bandwidth() -> None:
    gpu = load_gpu_spec("H100 SXM5")
    job = Strategy(method=Method.FULL, gpus=8, sharding=Sharding.ZERO3, batch_size=1,
                   seq_len=512, grad_accum=4)
    links = NodeLinks(intra="pcie")
    base = estimate_throughput(MODEL, job, gpu, links=links).step_seconds
    fast_pcie = dataclasses.replace(A, pcie_efficiency=2 * A.pcie_efficiency)
    assert estimate_throughput(MODEL, job, gpu, links=links,
                               assumptions=fast_pcie).step_seconds < base
    # across nodes: the fabric's own latency per ring step and its bandwidth (NodeLinks)
    two_nodes = dataclasses.replace(job, nodes=2)
    nccl_net_hop = dict(A.nccl_hop_latency_s)["net"]

    def step(latency: float, rate: float) -> float:
        got = estimate_throughput(MODEL, two_nodes, gpu, links=NodeLinks(
            inter_node_bytes_per_s=rate, inter_node_latency_s=latency))
        term = got.step.get("step/communication-exposed")
        assert term is not None
        # NCCL's ring model: base + 14 intra-node hops + 1 network hop per gather
        assert term.inputs["latency_per_collective_s"] == pytest.approx(
            A.nccl_base_latency_s + 14 * dict(A.nccl_hop_latency_s)["nvlink"] + latency)
        return got.step_seconds

    assert step(10 * nccl_net_hop, 50e9) > step(nccl_net_hop, 50e9)
    assert step(nccl_net_hop, 400e9) < step(nccl_net_hop, 50e9)
    # no flat multi-GPU factor on top of the collectives model
    assert estimate_throughput(MODEL, job, gpu, links=links).step.get(
        "step/multi-node-fitted-slowdown") is None
    # DeepSpeed ZeRO-3 gathers again for the recompute; FSDP does not
    assert gathering_passes(job) == 3
    assert gathering_passes(dataclasses.replace(job, sharding=Sharding.FSDP)) == 2
    assert gathering_passes(dataclasses.replace(job, checkpointing=Checkpointing.NONE)) == 2


def test_qlora_fsdp_gathers_the_packed_4bit_weights() -> None:
    gpu = load_gpu_spec("H100 SXM5")
    job = Strategy(method=Method.QLORA, gpus=2, sharding=Sharding.FSDP, double_quant=True)
    gathered = estimate_throughput(MODEL, job, gpu).communication.get("all-gather/params")
    assert gathered is not None
    base = MODEL.stored_block_params
    packed = base * (0.5 + 1 / 64 + 4 / 16384) + (MODEL.total_params - base) * 2
    assert gathered.inputs["param_bytes"] == round(packed)
    assert gathered.inputs["param_bytes"] < MODEL.total_params  # < 1 B per parameter


def test_offloading_a_4bit_model_moves_4bit_bytes_overlapped_with_compute() -> None:
    job = Strategy(method=Method.QLORA, gpus=1, sharding=Sharding.ZERO3,
                   offload=Offload.OPTIMIZER_PARAMS, double_quant=False, batch_size=4)
    base = MODEL.stored_block_params
    expected = base * (0.5 + 4 / 64) + (MODEL.total_params - base) * 2
    assert stored_weight_bytes(MODEL, job) == pytest.approx(expected)
    slow_host = dataclasses.replace(A, host_link_bytes_per_s=1e9)
    result = estimate_throughput(MODEL, job, load_gpu_spec("A100 80GB SXM4"),
                                 assumptions=slow_host)
    term = result.step.get("micro-batch/param-offload-exposed")
    assert term is not None
    assert term.inputs["bytes"] == round(2 * expected)  # forward and backward
    # prefetch hides the copy behind compute: only the excess shows
    assert term.value == pytest.approx(term.inputs["copy_s"] - term.inputs["compute_s"])
    fast = estimate_throughput(MODEL, job, load_gpu_spec("A100 80GB SXM4"))
    assert fast.step.value("micro-batch/param-offload-exposed") == 0.0


def test_cpu_adam_runs_on_the_stated_host_cores() -> None:
    job = Strategy(method=Method.FULL, offload=Offload.OPTIMIZER, gpus=2,
                   sharding=Sharding.ZERO2, precision=Precision.BF16_MIXED)
    gpu = load_gpu_spec("A100 80GB SXM4")
    few = estimate_throughput(MODEL, job, gpu, links=NodeLinks(host_vcpus=8))
    many = estimate_throughput(MODEL, job, gpu, links=NodeLinks(host_vcpus=64))
    term = few.step.get("step/optimizer-offloaded")
    assert term is not None and term.inputs["cpu_adam_params_per_s"] == pytest.approx(
        4 * A.cpu_adam_params_per_s_per_core)
    assert many.step_seconds < few.step_seconds


def test_the_json_states_mfu_bound_and_assumptions() -> None:
    result = estimate_throughput(MODEL, Strategy(method=Method.QLORA),
                                 load_gpu_spec("RTX 4090"))
    doc = result.as_dict()
    assert doc["bound"] in ("compute", "memory", "communication", "host")
    assert set(doc["bound_seconds"]) == {"compute", "memory", "communication", "host"}
    assert sum(doc["bound_seconds"].values()) == pytest.approx(result.step_seconds)
    assert 0 < doc["mfu"] < 1
    assert "RTX 4090" in doc["assumptions"]["measured_matmul_tflops"]["value"]
    # calibrated or assumed, with the range the model's error gives the figures
    basis = doc["time_basis"]
    assert basis["basis"] == "assumed"
    low, high = basis["tokens_per_second_range"]
    assert low < doc["tokens_per_second"] < high
    assert low == pytest.approx(doc["tokens_per_second"] / (1 + A.assumed_error_range[1]))
    matmul = result.step.get("micro-batch/matmul")
    assert matmul is not None and matmul.inputs["efficiency_entry"] == "ceiling measured"


def test_each_measurement_names_a_catalogued_gpu_with_its_peak_and_power() -> None:
    # the peak and board power recorded with a measurement are the catalogue's own figures
    for name, word, _, tflops, peak, watts, source in A.measured_matmul_tflops:
        gpu = load_gpu_spec(name)
        assert gpu.architecture.split()[0] == word, name
        assert gpu.bf16_flops_per_s == pytest.approx(peak * 1e12), name
        assert gpu.tdp_w == watts, name
        assert tflops > 0 and source, name


def test_attention_kernel_is_its_own_term_flash_compute_bound_eager_memory_bound() -> None:
    from tuneplan.core.job.strategy import Attention

    gpu = load_gpu_spec("A100 80GB SXM4")
    job = Strategy(method=Method.LORA, seq_len=8192, batch_size=1)
    flash = estimate_throughput(MODEL, job, gpu)
    eager = estimate_throughput(MODEL, dataclasses.replace(job, attention=Attention.EAGER), gpu)
    fa2 = flash.step.get("micro-batch/attention")
    assert fa2 is not None and fa2.inputs["kernel"] == "flash-attention 2"
    # FlashAttention-2 at its published share of the A100's measured ceiling
    speed = fa2.inputs["flops"] / fa2.value
    assert speed == pytest.approx(312e12 * (271.2 / 312) * A.flash_share("Ampere"), rel=1e-6)
    # eager: the full s x s scores in batched GEMMs, plus their traffic through HBM
    scores = eager.step.get("micro-batch/eager-attention-scores")
    assert scores is not None and flash.step.get("micro-batch/eager-attention-scores") is None
    elements = 1 * MODEL.spec.num_heads * 8192**2 * MODEL.num_layers
    per = 2 * A.eager_score_bytes_forward + A.eager_score_bytes_backward  # with recompute
    bandwidth = float(gpu.memory_bandwidth_bytes_per_s or 0) * A.elementwise_bandwidth_efficiency
    assert scores.value == pytest.approx(elements * per / bandwidth)
    assert eager.step_seconds > flash.step_seconds
    # sdpa runs FlashAttention-2 on sm80+, but not on a V100 (no FA2 kernels there)
    sdpa = estimate_throughput(MODEL, dataclasses.replace(job, attention=Attention.SDPA), gpu)
    assert sdpa.step.get("micro-batch/attention").inputs["kernel"] == "flash-attention 2"
    v100 = estimate_throughput(MODEL, dataclasses.replace(job, precision=Precision.FP16_MIXED,
                                                           seq_len=1024),
                               load_gpu_spec("V100 SXM2 16GB"))
    assert v100.step.get("micro-batch/attention").inputs["kernel"] == "batched GEMM"
    # Hopper's FA2 reaches a smaller share of its ceiling (FA3 paper: 35 % of peak)
    assert A.flash_share("Hopper (GH100)") < A.flash_share("Ampere (GA100)")


def test_fused_loss_moves_fewer_logit_bytes_than_the_standard_one() -> None:
    from tuneplan.core.job.recipes import Recipe
    from tuneplan.core.job.strategy import Loss

    gpu = load_gpu_spec("L40S")
    job = Strategy(method=Method.LORA, seq_len=2048, batch_size=2)
    standard = estimate_throughput(MODEL, dataclasses.replace(job, loss=Loss.STANDARD), gpu)
    fused = estimate_throughput(MODEL, dataclasses.replace(job, loss=Loss.CHUNKED), gpu)
    s_term, f_term = standard.step.get("micro-batch/loss"), fused.step.get("micro-batch/loss")
    assert s_term is not None and f_term is not None
    assert s_term.inputs["bytes_per_logit"] == A.standard_loss_bytes_per_logit
    assert f_term.inputs["kernel"] == "Liger fused linear cross-entropy"
    assert f_term.inputs["bytes_per_logit"] == A.fused_loss_bytes_per_logit
    assert s_term.inputs["logits"] == 2 * 2048 * MODEL.vocab_size
    assert f_term.value < s_term.value and fused.step_seconds < standard.step_seconds
    # torchtune's chunked CE is only fused under torch.compile
    tune = dataclasses.replace(job, recipe=Recipe.TORCHTUNE, precision=Precision.BF16)
    eager_tt = estimate_throughput(MODEL, tune, gpu).step.get("micro-batch/loss")
    compiled_tt = estimate_throughput(MODEL, dataclasses.replace(tune, compile=True),
                                      gpu).step.get("micro-batch/loss")
    assert eager_tt is not None and compiled_tt is not None
    assert eager_tt.inputs["bytes_per_logit"] == A.standard_loss_bytes_per_logit
    assert compiled_tt.inputs["bytes_per_logit"] == A.compiled_loss_bytes_per_logit
    # the loss is memory-bound: it runs on bandwidth, where the RTX 4090 beats the L40S
    on_4090 = estimate_throughput(MODEL, dataclasses.replace(job, loss=Loss.STANDARD),
                                  load_gpu_spec("RTX 4090")).step.value("micro-batch/loss")
    assert on_4090 < s_term.value


def test_a_probe_calibration_is_per_gpu_not_per_architecture() -> None:
    a100, a6000 = load_gpu_spec("A100 80GB SXM4"), load_gpu_spec("RTX A6000")
    calibrated = dataclasses.replace(A, matmul_efficiency_by_gpu=(
        ("A100 80GB SXM4", 0.3, "calibrated from probe #1"),))
    job = Strategy(method=Method.LORA, seq_len=2048, batch_size=4)
    slow = estimate_throughput(MODEL, job, a100, assumptions=calibrated)
    assert slow.time_basis.basis == "calibrated"
    assert slow.tokens_per_second < estimate_throughput(MODEL, job, a100).tokens_per_second
    # the same architecture on another card keeps its own (assumed) ceiling
    other = estimate_throughput(MODEL, job, a6000, assumptions=calibrated)
    assert other.time_basis.basis == "assumed"
    assert other.tokens_per_second == pytest.approx(
        estimate_throughput(MODEL, job, a6000).tokens_per_second)
    # the calibration scales the flash attention term with the linears
    term = slow.step.get("micro-batch/attention")
    assert term is not None and term.inputs["calibration_scale"] < 1


def test_torch_compile_is_its_own_named_saving() -> None:
    gpu = load_gpu_spec("A100 80GB SXM4")
    job = Strategy(method=Method.LORA, seq_len=2048, batch_size=4)
    eager = estimate_throughput(MODEL, job, gpu)
    compiled = estimate_throughput(MODEL, dataclasses.replace(job, compile=True), gpu)
    assert eager.step.get("micro-batch/torch-compile") is None
    term = compiled.step.get("micro-batch/torch-compile")
    assert term is not None and term.value < 0
    # the linears' time is the eager one; the saving is (1/speedup - 1) of it
    matmul = compiled.step.value("micro-batch/matmul")
    assert matmul == pytest.approx(eager.step.value("micro-batch/matmul"))
    assert term.value == pytest.approx(matmul * (1 / A.compile_speedup - 1))
    assert compiled.bound_seconds()["compute"] == pytest.approx(
        matmul + term.value + compiled.step.value("micro-batch/attention"))
    assert compiled.tokens_per_second > eager.tokens_per_second


def test_each_framework_sends_its_gradients_in_the_dtype_it_really_sends() -> None:
    gpu = load_gpu_spec("H100 SXM5")
    trainable = MODEL.total_params
    share = 3 / 4                                  # (n - 1) / n over 4 ranks

    def sent(sharding: Sharding, precision: Precision) -> tuple[dict[str, float], int]:
        job = Strategy(method=Method.FULL, gpus=4, sharding=sharding, precision=precision,
                       grad_accum=2)
        got = estimate_throughput(MODEL, job, gpu)
        term = got.step.get("step/communication-exposed")
        assert term is not None
        return ({t.path: float(t.value) for t in got.communication},
                term.inputs["grad_bytes_per_param"])

    # DDP all-reduces .grad in the parameters' dtype: fp32 masters under mixed precision,
    # once a step (no_sync while accumulating)
    ddp, width = sent(Sharding.DDP, Precision.BF16_MIXED)
    assert width == 4
    assert ddp == {"all-reduce/grads": pytest.approx(2 * share * trainable * 4)}
    assert sent(Sharding.DDP, Precision.BF16)[1] == 2
    # DeepSpeed ZeRO-2 reduces in bf16 every micro-batch, then gathers the updated bf16 weights
    zero2, width = sent(Sharding.ZERO2, Precision.BF16_MIXED)
    assert width == 2
    assert zero2 == {"reduce-scatter/grads": pytest.approx(2 * share * trainable * 2),
                     "all-gather/updated-params": pytest.approx(share * trainable * 2)}
    # ZeRO-1 reduces once a step; FSDP gathers the weights in forward and backward
    zero1, _ = sent(Sharding.ZERO1, Precision.BF16_MIXED)
    assert zero1["reduce-scatter/grads"] == pytest.approx(share * trainable * 2)
    fsdp, width = sent(Sharding.FSDP, Precision.BF16_MIXED)
    assert width == 2
    assert fsdp["all-gather/params"] == pytest.approx(2 * 2 * share * MODEL.total_params * 2,
                                                      rel=1e-6)
    # FSDP SHARD_GRAD_OP gathers each unit once per micro-batch (before its forward; freed
    # after its backward) and needs no gather of updated shards after the step
    grad_op, _ = sent(Sharding.FSDP_GRAD_OP, Precision.BF16_MIXED)
    assert grad_op == {
        "all-gather/params": pytest.approx(1 * 2 * share * MODEL.total_params * 2, rel=1e-6),
        "reduce-scatter/grads": pytest.approx(2 * share * trainable * 2)}


def test_adamw_step_passes_follow_the_implementation_the_job_runs() -> None:
    from tuneplan.adapters.probe.harness import StepSetup
    from tuneplan.core.job.recipes import Recipe
    from tuneplan.core.job.stack import Stack

    gpu = load_gpu_spec("H100 SXM5")
    hf = Strategy(method=Method.FULL, precision=Precision.BF16, batch_size=1, seq_len=512)
    plain = dataclasses.replace(hf, recipe=Recipe.PLAIN)
    older = dataclasses.replace(hf, stack=Stack.parse("transformers=4.50,torch=2.6"))

    def optimizer(s: Strategy) -> tuple[float, str]:
        term = next(t for t in estimate_throughput(MODEL, s, gpu).step.terms
                    if t.path == "step/optimizer")
        return float(term.value), str(term.inputs["implementation"])

    fused, impl = optimizer(hf)
    # pure bf16: p, g, m, v 2 B each, read 4 and written 3 times by the fused kernel
    rate = float(gpu.memory_bandwidth_bytes_per_s or 0) * A.optimizer_bandwidth_efficiency
    assert impl == "fused"   # transformers 5 + torch >= 2.8: adamw_torch_fused
    assert fused == pytest.approx(MODEL.total_params * 14 / rate, rel=0.02)
    for s in (plain, older):   # torch.optim.AdamW's own default; transformers 4.50's adamw_torch
        seconds, impl = optimizer(s)
        assert impl == "foreach" and seconds == pytest.approx(fused * 20 / 7, rel=1e-9)
    # the simulation harness runs the same implementation the estimate assumes
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 128}
    assert StepSetup(config=config, strategy=plain).impl == "foreach"
    assert StepSetup(config=config, strategy=hf).impl == "fused"
    # LitGPT's finetune scripts: torch AdamW without fused; under QLoRA bnb's PagedAdamW
    from tuneplan.core.job.versions import adamw_impl

    lit = dataclasses.replace(hf, recipe=Recipe.LITGPT)
    assert adamw_impl(lit, None) == "foreach"
    assert adamw_impl(dataclasses.replace(lit, method=Method.QLORA), None) == "fused"
    assert adamw_impl(dataclasses.replace(hf, recipe=Recipe.TORCHTUNE), None) == "fused"
