"""Card and model facts in `fit` and `plan`: the precision a card trains in and its tensor
layout, one-GPU suggestions before more GPUs, Gemma-2's soft-capping, bitsandbytes on AMD."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from tests.core.test_planner import SPECS, offer, run
from tuneplan.adapters.bundled import read_data_text
from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Attention, Optimizer, Precision, Strategy
from tuneplan.core.launch.bundle import render_bundle
from tuneplan.core.memory import MemoryEstimate, estimate_memory
from tuneplan.core.planner.caveats import card_notes, card_problem, precision_on
from tuneplan.core.planner.fit import fit
from tuneplan.core.planner.record import saved_plan
from tuneplan.core.planner.search import StrategySearch, memory_limit
from tuneplan.errors import UnsupportedError

LLAMA8B = "meta-llama/Llama-3.1-8B"
NO_BF16 = {"T4": "Turing TU104", "V100 SXM2 16GB": "Volta GV100"}
FP16_WHY = ("{gpu} has no BF16 ({arch}): plans FP16 mixed precision with dynamic loss scaling "
            "(HF Trainer fp16=True / accelerate mixed_precision fp16, DeepSpeed fp16 "
            "loss_scale 0); fp16's narrower range can overflow on some models")


def _search(model: str, **strategy: object) -> StrategySearch:
    return StrategySearch(model=resolve_model(model), base=Strategy(**strategy),  # type: ignore[arg-type]
                          tokens=None, epochs=1)


def _terms(est: MemoryEstimate) -> dict[str, int]:
    return {t.path: int(t.value) for t in est.breakdown.terms}


@pytest.mark.parametrize("gpu", sorted(NO_BF16))
def test_fit_full_on_a_card_without_bf16_plans_fp16_mixed_with_the_amp_layout(gpu: str) -> None:
    report = fit(_search(LLAMA8B, method=Method.FULL), SPECS[gpu])
    assert report.precision is not None
    doc = report.as_dict()["precision"]
    assert doc == {
        "requested": "bf16-mixed", "chosen": "fp16-mixed",
        "why": FP16_WHY.format(gpu=gpu, arch=NO_BF16[gpu]),
        "layout": "fp32 trainable weights (the optimizer's masters) with fp16 autocast copies "
                  "for the matmuls; activations in fp16"}
    assert report.base.precision is Precision.FP16_MIXED
    assert report.notes[0] == f"no BF16 on {gpu}: " + FP16_WHY.format(
        gpu=gpu, arch=NO_BF16[gpu]).split(": ", 1)[1]
    # A V100 (7.0) also needs an older PyTorch build than PyPI's default; a T4 (7.5) does not.
    assert len(report.notes) == (2 if gpu.startswith("V100") else 1)
    # The memory is HF Trainer fp16=True over an fp32 model: 4 B weights + 4 B grads + 8 B
    # AdamW per parameter, never pure-fp16 weights (GradScaler refuses fp16 gradients).
    model = resolve_model(LLAMA8B)
    fp16 = estimate_memory(model, report.base, generation=SPECS[gpu].generation)
    params = fp16.trainable_params
    terms = _terms(fp16)
    assert terms["weights/trainable"] == 4 * params
    assert terms["gradients/trainable"] == 4 * params
    assert terms["optimizer/states"] == 8 * params
    bf16 = estimate_memory(model, replace(report.base, precision=Precision.BF16_MIXED),
                           generation=SPECS[gpu].generation)
    assert report.methods[0].peak_bytes == fp16.device_total_bytes == bf16.device_total_bytes


def test_lora_and_qlora_on_t4_keep_fp32_adapters_over_an_fp16_base() -> None:
    report = fit(_search(LLAMA8B, method=Method.FULL), SPECS["T4"])
    layouts = {m.method: m.layout for m in report.methods}
    assert layouts[Method.LORA] == ("fp16 frozen base weights, fp32 adapters "
                                    "(PEFT autocast_adapter_dtype); activations in fp16")
    assert layouts[Method.QLORA] == ("nf4 quantized base (compute dtype fp16), fp32 adapters "
                                     "(PEFT autocast_adapter_dtype); activations in fp16")


def test_a_card_with_bf16_keeps_bf16_mixed() -> None:
    choice = precision_on(SPECS["A100 80GB SXM4"], Precision.BF16_MIXED)
    assert (choice.chosen, choice.why) == (Precision.BF16_MIXED,
                                           "bf16-mixed as asked (A100 80GB SXM4 has BF16)")
    assert card_notes(Strategy(), SPECS["A100 80GB SXM4"]) == []


def test_the_launch_bundle_of_a_t4_plan_sets_fp16_never_bf16() -> None:
    result = run("Qwen/Qwen2.5-0.5B", "lora", [offer("T4", 1, "0.35")])
    plan = result.plans[0]
    files = render_bundle(saved_plan(plan, result), ["all"], train_script="")
    assert json.loads(files["train_config.json"])["precision"] == "fp16-mixed"
    assert 'mixed_precision: "fp16"' in files["accelerate_config.yaml"]
    ds = json.loads(files["ds_config.json"])
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    assert "bf16" not in ds and "bf16" not in files["accelerate_config.yaml"].replace(
        'downcast_bf16: "no"', "")
    # train.py turns the plan's precision into Trainer fp16=True, full models loaded in fp32.
    script = read_data_text("launch/train.py")
    assert 'fp16=precision == "fp16-mixed"' in script
    # full weights and LISA's load in fp32 under mixed precision (freeze upcasts only what
    # trains; adapters' bases stay in half)
    assert re.search(r'method in \([^)]*"full"[^)]*\) and precision\.endswith\("mixed"\)',
                     script)


def test_the_deepspeed_config_of_a_v100_zero_plan_uses_dynamic_loss_scaling() -> None:
    # AdamW kept as asked (--optimizer given): free, the planner reaches for 8-bit AdamW and
    # FSDP fits without offload; fixed, only ZeRO with CPU offload fits.
    result = run(LLAMA8B, "full", [offer("V100 SXM2 16GB", 8, "10", interconnect="NVLink 2.0")],
                 fixed=("optimizer",))
    plan = result.plans[0]
    assert plan.strategy.sharding.value.startswith("zero")
    assert plan.strategy.precision is Precision.FP16_MIXED
    assert plan.warnings[0] == "no BF16 on V100 SXM2 16GB: " + FP16_WHY.format(
        gpu="V100 SXM2 16GB", arch="Volta GV100").split(": ", 1)[1]
    ds = json.loads(render_bundle(saved_plan(plan, result), ["deepspeed"],
                                  train_script="")["ds_config.json"])
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    assert "bf16" not in ds


def test_fit_on_one_t4_answers_with_one_gpu_first_and_labels_more_nodes() -> None:
    gpu = SPECS["T4"]
    report = fit(_search(LLAMA8B, method=Method.FULL), gpu, node_gpus=8)
    got = [(s.change, s.scope, s.gpus, s.nodes) for s in report.suggestions]
    assert got == [
        ("together: QLoRA (--method qlora) + chunked cross-entropy (--loss chunked)",
         "one GPU", 1, 1),
        ("ZeRO-3 with optimizer and parameters offloaded to host RAM over 2 GPUs "
         "(--gpus 2 --sharding zero3 --offload optimizer+params)",
         "multi-GPU: one node of 2 T4", 2, 1),
        # 32, not 16: DeepSpeed's coordinator keeps up to stage3_max_live_parameters (1e9)
        # prefetched ahead, + the 525 M-element head, gathered (core/memory/zero3_gather.py)
        ("ZeRO-3 over 32 GPUs (--gpus 8 --nodes 4 --sharding zero3)",
         "multi-node: 4 nodes x 8 T4", 32, 4),
    ]
    first = report.suggestions[0]
    assert first.strategy.method is Method.QLORA and first.strategy.loss is not None
    assert first.peak_bytes <= report.limit_bytes == memory_limit(gpu.usable_memory_bytes)
    assert first.saved_bytes == report.methods[0].peak_bytes - first.peak_bytes  # type: ignore[operator]
    assert first.tokens_per_second and first.speed_vs_job
    spread = report.suggestions[2].strategy
    assert (spread.gpus, spread.nodes) == (8, 4)
    # A provider whose T4 nodes hold 4: the same 32 GPUs are 8 nodes.
    four = fit(_search(LLAMA8B, method=Method.FULL), gpu, node_gpus=4)
    assert [s.scope for s in four.suggestions if s.gpus == 32] == ["multi-node: 8 nodes x 4 T4"]
    assert all(s.strategy.gpus <= 4 for s in four.suggestions)


def test_one_gpu_changes_are_ranked_by_the_speed_they_keep() -> None:
    report = fit(_search(LLAMA8B, method=Method.FULL), SPECS["A100 80GB SXM4"])
    one = [s for s in report.suggestions if s.gpus == 1]
    assert [s.change.split(" (")[0].split(":")[0] for s in one] == [
        "QLoRA", "paged 8-bit optimizer",
        "ZeRO-3 with optimizer and parameters offloaded to host RAM"]
    # 8B full on one 80 GB card: bitsandbytes' paged 8-bit AdamW keeps the card at its limit
    # with part of its state in host RAM, far faster than ZeRO-3 offload's CPU Adam
    paged = one[1]
    assert paged.fits and paged.peak_bytes <= report.limit_bytes
    assert paged.host_ram_bytes > one[0].host_ram_bytes
    assert paged.speed_vs_job is not None and one[2].speed_vs_job is not None
    assert paged.speed_vs_job > 4 * one[2].speed_vs_job
    speeds = [s.speed_vs_job for s in one]
    assert speeds == sorted(speeds, reverse=True)  # type: ignore[type-var]
    first_multi = next(i for i, s in enumerate(report.suggestions) if s.gpus > 1)
    assert all(s.gpus > 1 for s in report.suggestions[first_multi:])


def test_gemma2_refuses_sdpa_and_fit_suggests_eager_attention() -> None:
    model = resolve_model("google/gemma-2-2b")
    with pytest.raises(UnsupportedError, match=r"^gemma2 caps its attention logits \(soft-"
                       r"capping\), which SDPA cannot do: transformers 5\.24 refuses "
                       r"attn_implementation='sdpa' for it; use --attention eager \(or flash "
                       r"with flash-attn 2\.6\+\)$"):
        estimate_memory(model, Strategy(method=Method.LORA))
    for attention in (Attention.EAGER, Attention.FLASH):
        estimate_memory(model, Strategy(method=Method.LORA, attention=attention))
    report = fit(_search("google/gemma-2-2b", method=Method.LORA), SPECS["L4"])
    assert not report.fits and report.methods[0].refusal is not None
    assert report.suggestions[0].change == (
        "eager attention (--attention eager: SDPA cannot soft-cap Gemma-2's logits)")
    assert report.suggestions[0].strategy.attention is Attention.EAGER
    assert report.suggestions[0].fits


def test_bitsandbytes_on_amd_needs_a_rocm_build_and_a_supported_target() -> None:
    qlora = Strategy(method=Method.QLORA)
    assert card_notes(qlora, SPECS["MI300X"]) == [
        "nf4 4-bit base weights on AMD MI300X (gfx942): needs PyTorch for ROCm and a ROCm "
        "build of bitsandbytes (bitsandbytes 0.50.0 PyPI wheels: ROCm 6.4.4 to 7.14.0 builds)"]
    assert card_problem(qlora, SPECS["MI300X"]) is None
    assert card_problem(qlora, SPECS["Radeon Instinct MI25"]) == (
        "nf4 4-bit base weights need bitsandbytes, which has no ROCm kernel for Radeon "
        "Instinct MI25 (gfx900) in bitsandbytes 0.50.0; use --method lora and --optimizer adamw")
    eight = Strategy(method=Method.LORA, optimizer=Optimizer.ADAMW8BIT)
    assert card_problem(eight, SPECS["MI250X"]) is None
    assert card_problem(Strategy(method=Method.LORA), SPECS["Radeon Instinct MI25"]) is None
    assert card_problem(Strategy(method=Method.LORA8BIT), SPECS["V100 SXM2 16GB"]) == (
        "LLM.int8() (lora8bit) needs compute capability 7.5+, V100 SXM2 16GB is 7.0 "
        "(bitsandbytes 0.50.0); use --method qlora or lora")
    plans = run("Qwen/Qwen2.5-0.5B", "qlora", [offer("MI300X", 1, "2.00"),
                                               offer("Radeon Instinct MI25", 1, "0.10")])
    assert [p.gpu.name for p in plans.plans] == ["MI300X"]
    warnings = plans.plans[0].warnings
    assert any(w.startswith("nf4 4-bit base weights on AMD MI300X") for w in warnings)
    assert [r.reason.split(" need ")[0] for r in plans.rejected] == ["nf4 4-bit base weights"]


def test_fp8_is_never_offered_since_no_recipe_here_trains_in_it() -> None:
    result = run("Qwen/Qwen2.5-0.5B", "lora", [offer("H100 SXM5", 1, "2.99"),
                                               offer("T4", 1, "0.35")])
    assert "fp8" not in {p.value for p in Precision}
    assert not any("fp8" in w.lower() for p in result.plans for w in p.warnings)
    report = fit(_search(LLAMA8B, method=Method.LORA), SPECS["H100 SXM5"])
    assert "fp8" not in json.dumps(report.as_dict()).lower()


def test_auto_method_on_a_card_without_bitsandbytes_kernels_drops_qlora() -> None:
    # 8B on a 16 GB MI25: only QLoRA would fit, and bitsandbytes has no gfx900 kernel.
    result = run(LLAMA8B, "auto", [offer("Radeon Instinct MI25", 1, "0.10")])
    assert not result.plans
    assert result.rejected[0].reason.startswith("nf4 4-bit base weights need bitsandbytes")


def test_fit_refuses_qlora_on_a_card_bitsandbytes_has_no_kernel_for() -> None:
    report = fit(_search(LLAMA8B, method=Method.FULL), SPECS["Radeon Instinct MI25"])
    qlora = next(m for m in report.methods if m.method is Method.QLORA)
    assert (qlora.fits, qlora.largest_batch) == (False, 0)
    assert qlora.refusal is not None and qlora.refusal.startswith(
        "nf4 4-bit base weights need bitsandbytes, which has no ROCm kernel")
    assert all(card_problem(s.strategy, SPECS["Radeon Instinct MI25"]) is None
               for s in report.suggestions)
    assert not any(s.strategy.optimizer.is_8bit or s.strategy.method is Method.QLORA
                   for s in report.suggestions)


def test_pure_bf16_is_refused_by_fit_and_plan_alike_on_a_t4() -> None:
    report = fit(_search("Qwen/Qwen2.5-0.5B", method=Method.LORA, precision=Precision.BF16),
                 SPECS["T4"])
    reasons = {m.refusal for m in report.methods}
    assert reasons == {"no BF16 on T4: pure bf16 training needs it "
                       "(--precision fp16-mixed would run)"}
    assert report.precision is not None and report.precision.chosen is Precision.BF16
