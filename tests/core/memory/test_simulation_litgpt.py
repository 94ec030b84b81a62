"""The analytic allocated peak under ``--recipe litgpt`` held to a simulation of LitGPT's own
fit loop (``adapters/probe/litgpt_step.py``: litgpt's GPT / lora.GPT, chunked_cross_entropy,
Fabric's precision conversions), tiny configs for real on the CPU and full-size ones under fake
tensors. Tolerance ±3 % on the allocated peak for every configuration.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("litgpt")

from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Checkpointing, Loss, Precision, Strategy
from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import parse_model_config

pytestmark = pytest.mark.probe

_BASE = {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-5, "hidden_act": "silu", "model_type": "llama",
         "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}
CONFIGS = {
    "llama-gqa": _BASE,
    "llama-mha": {**_BASE, "num_key_value_heads": 4},       # v stays a view of the fused qkv
    "llama-small-vocab": {**_BASE, "vocab_size": 128},      # blocks, not the loss, matter more
}
BF16, MIXED, FP32 = Precision.BF16, Precision.BF16_MIXED, Precision.FP32
ALL = ("all-linear",)
QV = ("q_proj", "v_proj")   # litgpt finetune/lora.py's defaults: zero_pad + index_copy
Case = tuple[str, str, int, int, bool, Precision, tuple[str, ...]]
CASES: list[Case] = [
    ("llama-gqa", "lora", 2, 256, False, BF16, ALL),
    ("llama-gqa", "full", 2, 256, False, BF16, ALL),
    ("llama-gqa", "lora", 2, 256, False, FP32, ALL),
    ("llama-gqa", "full", 1, 128, False, FP32, ALL),
    ("llama-gqa", "lora", 1, 512, False, BF16, QV),
    ("llama-gqa", "lora", 4, 128, True, BF16, ALL),
    ("llama-gqa", "full", 2, 256, True, BF16, ALL),
    ("llama-mha", "lora", 2, 256, False, BF16, ALL),
    ("llama-mha", "full", 3, 128, False, BF16, ALL),
    ("llama-small-vocab", "lora", 2, 256, False, BF16, ALL),
    ("llama-small-vocab", "full", 2, 256, False, BF16, ALL),
    ("llama-gqa", "lora", 2, 256, False, MIXED, ALL),
    ("llama-gqa", "full", 2, 256, False, MIXED, ALL),
    ("llama-gqa", "lora", 2, 256, True, MIXED, ALL),
    ("llama-gqa", "full", 2, 256, True, MIXED, ALL),
    ("llama-gqa", "lora", 2, 256, False, MIXED, ("q_proj", "k_proj")),
    ("llama-mha", "lora", 2, 256, True, FP32, QV),
]
#: LoRA dropout 0.05: the CPU kernel keeps its noise in the input's dtype, at most the 4 B the
#: estimate is told here (CUDA: a bool mask, the default 1 B), as ``probe`` on the CPU does.
DROPOUT: list[Case] = [
    ("llama-gqa", "lora", 2, 256, False, BF16, ALL),
    ("llama-gqa", "lora", 2, 256, False, FP32, ALL),
    ("llama-gqa", "lora", 2, 256, False, MIXED, ALL),
    ("llama-gqa", "lora", 2, 256, False, BF16, QV),
]


def _strategy(method: str, b: int, s: int, ckpt: bool, precision: Precision,
              targets: tuple[str, ...], dropout: float = 0.0) -> Strategy:
    return Strategy(method=Method(method), recipe=Recipe.LITGPT, precision=precision,
                    batch_size=b, seq_len=s, lora_rank=8, lora_alpha=16, lora_targets=targets,
                    lora_dropout=dropout,
                    checkpointing=Checkpointing.FULL if ckpt else Checkpointing.NONE)


def _tensors(est: object) -> int:
    peak: int = est.allocated_peak_bytes  # type: ignore[attr-defined]
    return peak - int(est.breakdown.value("overheads/cublas_workspace"))  # type: ignore[attr-defined]


def _case_id(c: Case) -> str:
    return "-".join(str(x) for x in c[:6]) + ("-qv" if c[6] == QV else "")


@pytest.mark.parametrize("case", [*CASES, *[(*c, 0.05) for c in DROPOUT]],
                         ids=lambda c: _case_id(c[:7]) + ("-dropout" if len(c) > 7 else ""))
def test_litgpt_peak_matches_simulation(case: tuple[object, ...]) -> None:
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    arch, method, b, s, ckpt, precision, targets = case[:7]
    dropout = float(case[7]) if len(case) > 7 else 0.0  # type: ignore[arg-type]
    assert isinstance(arch, str) and isinstance(precision, Precision)
    config = CONFIGS[arch]
    strategy = _strategy(str(method), int(b), int(s), bool(ckpt),  # type: ignore[call-overload]
                         precision, targets, dropout)  # type: ignore[arg-type]
    measured = measure_step(StepSetup(config=config, strategy=strategy, optimizer_impl="fused"))
    estimate = estimate_memory(parse_model_config(config, name=arch), strategy,
                               MemoryAssumptions(adamw_impl="fused", dropout_mask_bytes=4))
    assert estimate.trainable_params == measured.trainable_params
    tensors = _tensors(estimate)
    assert abs(tensors - measured.peak_bytes) / measured.peak_bytes <= 0.03, (
        f"estimated {tensors} ({estimate.peak_phase}) vs simulated {measured.peak_bytes} "
        f"({measured.peak_phase})")


# Full-size models under fake tensors: (bundled name, method, checkpointing, precision, batch,
# sequence), LoRA r16 "all-linear". Llama-2-7B has as many kv heads as heads (no repeat).
FULL_SIZE = [
    ("meta-llama/Llama-3.1-8B", "lora", False, BF16, 1, 1024),
    ("meta-llama/Llama-3.1-8B", "full", True, BF16, 1, 2048),
    ("meta-llama/Llama-3.1-8B", "lora", True, BF16, 2, 2048),
    ("meta-llama/Llama-3.1-8B", "lora", False, MIXED, 1, 512),
    ("meta-llama/Llama-2-7b-hf", "lora", False, BF16, 1, 1024),
]


@pytest.mark.parametrize("case", FULL_SIZE, ids=lambda c: "-".join(str(x) for x in c))
def test_litgpt_full_size_peak_matches_fake_simulation(
        case: tuple[str, str, bool, Precision, int, int]) -> None:
    from tuneplan.adapters.hub import find_bundled, load_bundled_config, resolve_model
    from tuneplan.adapters.probe.harness import StepSetup, measure_step

    name, method, ckpt, precision, b, s = case
    bundled = find_bundled(name)
    assert bundled is not None
    strategy = Strategy(method=Method(method), recipe=Recipe.LITGPT, precision=precision,
                        batch_size=b, seq_len=s, lora_rank=16, lora_alpha=32,
                        checkpointing=Checkpointing.FULL if ckpt else Checkpointing.NONE)
    measured = measure_step(StepSetup(config=load_bundled_config(bundled), strategy=strategy,
                                      fake=True))
    estimate = estimate_memory(resolve_model(name), strategy)
    assert estimate.trainable_params == measured.trainable_params
    tensors = _tensors(estimate)
    assert abs(tensors - measured.peak_bytes) / measured.peak_bytes <= 0.03, (
        f"estimated {tensors} ({estimate.peak_phase}) vs simulated {measured.peak_bytes}")


def test_litgpt_layout_differs_from_hf() -> None:
    """The same LoRA job: litgpt's fp32 logits kept by the loop make its peak larger than the
    hf layout's, and the estimate says which layout it used."""
    from tuneplan.adapters.hub import resolve_model

    model = resolve_model("meta-llama/Llama-3.1-8B")
    lit = _strategy("lora", 1, 2048, True, BF16, ALL)
    est = estimate_memory(model, lit)
    hf = estimate_memory(model, Strategy(**{**{f: getattr(lit, f) for f in (
        "method", "precision", "batch_size", "seq_len", "lora_rank", "lora_alpha",
        "lora_targets", "checkpointing")}, "recipe": Recipe.HF}))
    assert est.breakdown.value("logits/fp32_logits") == 2048 * 128256 * 4
    assert est.allocated_peak_bytes != hf.allocated_peak_bytes
    assert any("LitGPT's own layout" in n for n in est.notes)
    dora = estimate_memory(model, Strategy(method=Method.DORA, recipe=Recipe.LITGPT,
                                           precision=BF16, seq_len=512))
    assert any("not --method dora: the hf layout with litgpt's dtypes stands in" in n
               for n in dora.notes)
    standard = estimate_memory(model, Strategy(**{**{f: getattr(lit, f) for f in (
        "method", "precision", "batch_size", "seq_len", "lora_rank", "lora_alpha",
        "lora_targets", "checkpointing", "recipe")}, "loss": Loss.STANDARD}))
    assert any("--loss standard" in n for n in standard.notes)
    assert standard.allocated_peak_bytes != est.allocated_peak_bytes


def test_litgpt_qlora_quantizes_the_head_and_keeps_bf16_adapters() -> None:
    """Not simulated (bitsandbytes' 4-bit matmul needs CUDA): modelled from litgpt
    finetune/lora.py + Lightning's BitsandbytesPrecision, which replaces every nn.Linear,
    lm_head included; LoRA A/B stay in the bf16-true module dtype."""
    from tuneplan.adapters.hub import resolve_model

    model = resolve_model("meta-llama/Llama-3.1-8B")
    job = Strategy(method=Method.QLORA, recipe=Recipe.LITGPT, precision=BF16, seq_len=2048,
                   lora_rank=16, lora_alpha=32, checkpointing=Checkpointing.FULL)
    lit = estimate_memory(model, job)
    hf = estimate_memory(model, Strategy(method=Method.QLORA, recipe=Recipe.HF, precision=BF16,
                                         seq_len=2048, lora_rank=16, lora_alpha=32,
                                         checkpointing=Checkpointing.FULL))
    head = 128256 * 4096
    # 4-bit packs two weights a byte: the head's V·H/2 more than the hf layout's blocks alone
    assert lit.breakdown.value("weights/quantized") - hf.breakdown.value(
        "weights/quantized") == head // 2
    # only the embedding stays bf16 (V·H·2); LoRA r16 all-linear A/B in bf16, not fp32
    assert lit.breakdown.value("weights/unquantized") == head * 2 + 4096 * 65 * 2
    assert lit.breakdown.value("weights/adapters") * 2 == hf.breakdown.value("weights/adapters")
    assert any("LitGPT's own layout" in n for n in lit.notes)
    mixed = estimate_memory(model, Strategy(method=Method.QLORA, recipe=Recipe.LITGPT,
                                            precision=MIXED, seq_len=512))
    assert any("refuses quantization with mixed" in n for n in mixed.notes)


@pytest.mark.parametrize(("changes", "words"), [
    ({"method": Method.DORA}, "--method dora"),
    ({"loss": Loss.STANDARD}, "--loss standard"),
    ({"lora_targets": ("gate_proj",)}, "gate, up and down together"),
    ({"trainable_modules": ("lm_head",)}, "--trainable-modules"),
])
def test_litgpt_simulation_refuses_what_it_does_not_run(changes: dict[str, object],
                                                         words: str) -> None:
    from tuneplan.adapters.probe.harness import StepSetup, measure_step
    from tuneplan.errors import UnsupportedError

    strategy = Strategy(**{"method": Method.LORA, "recipe": Recipe.LITGPT, "precision": BF16,
                           "batch_size": 1, "seq_len": 64, **changes})  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match=words):
        measure_step(StepSetup(config=CONFIGS["llama-gqa"], strategy=strategy))
    # the estimate does not pretend: the hf layout stands in, and says why
    est = estimate_memory(parse_model_config(CONFIGS["llama-gqa"], name="x"), strategy)
    assert any("hf layout with litgpt's dtypes stands in" in n for n in est.notes)
