"""Elementwise ops timed from bytes moved / memory bandwidth (core.compute.elementwise)."""

from __future__ import annotations

import dataclasses

import pytest

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.elementwise import elementwise_ops
from tuneplan.core.compute.throughput import adapted_linears, estimate_throughput
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Checkpointing, Precision, Strategy
from tuneplan.explain import Term

from .test_compute_per_gpu import MODEL

# counted in full (the default counts 0: the fitted matmul share carries them)
A = dataclasses.replace(ThroughputAssumptions(), elementwise_exposed_share=1.0)
TERMS = ("norms", "rotary", "activation", "residual-adds", "dropout",
         "mixed-precision-casts", "weight-casts")


def _terms(result: object) -> dict[str, float]:
    return {t.path.split("/")[-1]: float(t.value) for t in result.step.terms}  # type: ignore[attr-defined]


def test_rmsnorm_bytes_by_hand() -> None:
    # bf16 LoRA (no autocast on the residual stream, bf16 everywhere): per hidden element,
    # forward: upcast 2+4, pow 4+4, mean 4, x*rsqrt 4+4, cast back 4+2, weight mul 2+2 = 36
    s = Strategy(method=Method.LORA, precision=Precision.BF16, batch_size=1, seq_len=1024)
    norms = next(op for op in elementwise_ops(MODEL, s) if op.name == "norms")
    assert norms.forward == (2 * 32 + 1) * 4096 * 36
    assert norms.backward > norms.forward


def test_bandwidth_poor_card_spends_a_larger_share_in_elementwise() -> None:
    # bandwidth per measured matmul FLOP: L40S 864 GB/s / 269 TFLOP/s = 3.2 B per kFLOP,
    # H100 SXM 3350 / 794 = 4.2, A100 SXM 2039 / 271 = 7.5 (the RTX 4090, 1008 / 165 = 6.1,
    # and the L4, 300 / 71 = 4.2, are not poorer than the H100 by this measure)
    s = Strategy(method=Method.LORA, precision=Precision.BF16, batch_size=4, seq_len=2048,
                 checkpointing=Checkpointing.FULL)
    shares, norm_s = {}, {}
    for name in ("H100 SXM5", "L40S", "A100 80GB SXM4", "L4"):
        gpu = load_gpu_spec(name)
        r = estimate_throughput(MODEL, s, gpu, assumptions=A)
        terms = _terms(r)
        ew = sum(v for k, v in terms.items() if k in TERMS)
        shares[name] = ew / float(r.step.total)
        norm_s[name] = terms["norms"]
        # by hand: one norm term = tokens x (2 x forward + backward) / (bandwidth x 0.7)
        op = next(op for op in elementwise_ops(MODEL, s) if op.name == "norms")
        bw = float(gpu.memory_bandwidth_bytes_per_s or 0) * A.elementwise_bandwidth_efficiency
        assert terms["norms"] == pytest.approx(
            s.grad_accum * 4 * 2048 * (2 * op.forward + op.backward) / bw, rel=1e-9)
    assert shares["L40S"] > shares["H100 SXM5"] > shares["A100 80GB SXM4"]
    # the H100's HBM3 (3.35 TB/s) vs the L4's GDDR6 (300 GB/s): the same bytes take ~11x
    h100, l4 = load_gpu_spec("H100 SXM5"), load_gpu_spec("L4")
    ratio = float(h100.memory_bandwidth_bytes_per_s or 0) / float(
        l4.memory_bandwidth_bytes_per_s or 1)
    assert norm_s["L4"] / norm_s["H100 SXM5"] == pytest.approx(ratio, rel=1e-9)


def test_terms_scale_with_tokens_and_recompute() -> None:
    gpu = load_gpu_spec("A100 80GB SXM4")
    no_l2 = dataclasses.replace(A, l2_cache_bytes=())  # counted, no L2 credit

    def run(seq: int, a: ThroughputAssumptions = no_l2,
            ckpt: Checkpointing = Checkpointing.FULL) -> dict[str, float]:
        return _terms(estimate_throughput(
            MODEL, Strategy(method=Method.LORA, batch_size=1, seq_len=seq, checkpointing=ckpt),
            gpu, assumptions=a))

    short, long = run(512), run(4096)
    for name in ("norms", "rotary", "activation", "residual-adds"):
        assert long[name] == pytest.approx(8 * short[name], rel=1e-9)
    # with the A100's 40 MB L2: 512 tokens' fp32 norm copy (8 MB) stays there, 4096's
    # (67 MB) does not, so the long sequence costs more than 8x the short one
    cached_short, cached_long = run(512, A), run(4096, A)
    assert cached_short["norms"] < short["norms"]
    assert cached_long["norms"] == pytest.approx(long["norms"], rel=1e-9)
    assert cached_long["norms"] > 8 * cached_short["norms"]
    plain = run(512, ckpt=Checkpointing.NONE)
    ops = {op.name: op for op in elementwise_ops(
        MODEL, Strategy(method=Method.LORA, batch_size=1, seq_len=512))}
    act = ops["activation"]
    assert short["activation"] / plain["activation"] == pytest.approx(
        (2 * act.forward + act.backward) / (act.forward + act.backward), rel=1e-9)


def test_mixed_precision_casts_only_where_they_happen() -> None:
    # PEFT's fp32 adapters under bf16 autocast: each adapted input cast up and back
    mixed = {op.name for op in elementwise_ops(
        MODEL, Strategy(method=Method.LORA, precision=Precision.BF16_MIXED))}
    pure = {op.name for op in elementwise_ops(
        MODEL, Strategy(method=Method.LORA, precision=Precision.BF16))}
    full = {op.name for op in elementwise_ops(
        MODEL, Strategy(method=Method.FULL, precision=Precision.BF16_MIXED))}
    assert "mixed-precision-casts" in mixed and "mixed-precision-casts" not in pure
    assert "weight-casts" in full and "weight-casts" not in pure


def test_default_reports_the_bandwidth_time_but_counts_none_of_it() -> None:
    gpu = load_gpu_spec("L40S")
    s = Strategy(method=Method.LORA, batch_size=4, seq_len=1024)
    counted = {t.path: t for t in estimate_throughput(MODEL, s, gpu, assumptions=A).step.terms}
    default = estimate_throughput(MODEL, s, gpu)
    shown = {t.path: t for t in default.step.terms}
    for name in ("norms", "rotary", "activation", "residual-adds", "mixed-precision-casts"):
        term = shown[f"micro-batch/{name}"]
        assert term.value == 0
        full = float(counted[f"micro-batch/{name}"].value)
        assert full > 0
        assert term.inputs["bandwidth_seconds"] == pytest.approx(full, rel=1e-9)
        assert term.inputs["confidence"] == "low" and "counted 0" in term.source


def test_adapter_output_bytes_by_hand_and_its_own_share() -> None:
    # PEFT lora.Linear: result + lora_B(lora_A(x)) * scaling, on q_proj and v_proj only
    s = Strategy(method=Method.LORA, precision=Precision.BF16, lora_targets=("q_proj", "v_proj"),
                 batch_size=2, seq_len=1024)
    op = next(op for op in elementwise_ops(MODEL, s) if op.name == "adapter-output")
    lins = adapted_linears(MODEL, s)
    outs = sum(lin.out_features * lin.modules for lin in lins)
    ins = sum(lin.in_features * lin.modules for lin in lins)
    # bf16: forward scale (read, write) + add (read 2, write 1) = 5 x 2 B per output element;
    # backward scale 2 x 2 B per output, the input's two gradients summed 3 x 2 B per input
    assert op.forward == outs * 10 and op.backward == outs * 4 + ins * 6
    assert ins == 2 * 32 * 4096 and op.adapter
    assert "adapter-output" not in {o.name for o in elementwise_ops(
        MODEL, Strategy(method=Method.FULL, precision=Precision.BF16))}
    gpu = load_gpu_spec("H100 SXM5")

    def term(a: ThroughputAssumptions) -> Term:
        r = estimate_throughput(MODEL, s, gpu, assumptions=a)
        return next(t for t in r.step.terms if t.path == "micro-batch/adapter-output")

    # unset, the adapter share follows the generic one (0 by default, 1 in A)
    assert float(term(ThroughputAssumptions()).value) == 0
    assert float(term(A).value) == pytest.approx(
        float(term(A).inputs["bandwidth_seconds"]), rel=1e-12) and float(term(A).value) > 0
    own = dataclasses.replace(ThroughputAssumptions(), adapter_exposed_share=1.0)
    assert float(term(own).value) == pytest.approx(float(term(A).value), rel=1e-12)
    norms = next(t for t in estimate_throughput(MODEL, s, gpu, assumptions=own).step.terms
                 if t.path == "micro-batch/norms")
    assert float(norms.value) == 0   # the generic ops keep their own share
