"""``--lora-targets`` naming the output head or the embedding: PEFT wraps them (lora.Linear on
``lm_head``, lora.Embedding on ``embed_tokens``), so they train, hold activations and cost
FLOPs. Counted by ``core.job.methods.outer_targets``; checked against peft itself (probe)."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from tuneplan.core.compute.throughput import estimate_throughput, model_shape_from_spec
from tuneplan.core.job.methods import Method, count_trainable
from tuneplan.core.job.strategy import Strategy, Task
from tuneplan.core.memory import estimate_memory
from tuneplan.core.models import parse_model_config
from tuneplan.errors import UnsupportedError

TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 320,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "hidden_act": "silu"}
CASES = [("q_proj", "lm_head"), ("q_proj", "embed_tokens"), ("lm_head",),
         ("q_proj", "v_proj", "lm_head", "embed_tokens")]


def _spec(tied: bool):  # type: ignore[no-untyped-def]
    return parse_model_config({**TINY, "tie_word_embeddings": tied}, name=f"tiny-{tied}")


@pytest.mark.parametrize("tied", [True, False])
def test_head_and_embedding_adapters_train_r_times_hidden_plus_vocab(tied: bool) -> None:
    spec, r = _spec(tied), 8
    base = Strategy(method=Method.LORA, lora_rank=r, lora_targets=("q_proj",), seq_len=256)
    q_only = count_trainable(spec, base).total
    head = count_trainable(spec, replace(base, lora_targets=("q_proj", "lm_head"))).total
    embed = count_trainable(spec, replace(base, lora_targets=("q_proj", "embed_tokens"))).total
    assert head - q_only == r * (64 + 320) == embed - q_only
    dora = count_trainable(spec, replace(base, method=Method.DORA,
                                         lora_targets=("q_proj", "lm_head"))).total
    dora_q = count_trainable(spec, replace(base, method=Method.DORA)).total
    assert dora - dora_q == r * (64 + 320) + 320  # + the magnitude vector of the head


def test_head_adapter_changes_memory_and_flops() -> None:
    spec = parse_model_config(
        {**TINY, "vocab_size": 32_000, "tie_word_embeddings": False}, name="tiny-wide")
    base = Strategy(method=Method.LORA, lora_targets=("q_proj",), seq_len=256, batch_size=4)
    head = replace(base, lora_targets=("q_proj", "lm_head"))
    a, b = estimate_memory(spec, base), estimate_memory(spec, head)
    assert b.trainable_params - a.trainable_params == 16 * (64 + 32_000)
    t, v = 4 * 256, 32_000
    # the head's own moment: base logits, the scaled update and their sum (bf16 under
    # autocast), before the loss runs; at the loss only the LoRA's saved tensors are added
    assert "forward-head" not in a.phases
    assert b.phases["forward-head"] >= 3 * t * v * 2
    delta = 16 * (64 + 32_000)
    held = delta * (4 + 2 * 4 + 2)  # fp32 adapter, two fp32 AdamW states, its bf16 cast
    saved = t * 64 * 2 + t * 16 * 2  # autocast's bf16 copy of the input, A's output
    assert b.phases["forward"] - a.phases["forward"] == held + saved
    shape = model_shape_from_spec(spec)
    from tuneplan.adapters.bundled import load_gpu_spec

    gpu = load_gpu_spec("H100 SXM5")
    fa = estimate_throughput(shape, base, gpu).flops_per_token.get("adapters").value  # type: ignore[union-attr]
    fb = estimate_throughput(shape, head, gpu).flops_per_token.get("adapters").value  # type: ignore[union-attr]
    assert fb - fa == 6 * 16 * (64 + 32_000)


@pytest.mark.parametrize(("strategy", "words"), [
    (Strategy(method=Method.IA3, lora_targets=("q_proj", "lm_head")), "IA3"),
    (Strategy(method=Method.DORA, lora_targets=("q_proj", "embed_tokens")), "DoRA"),
    (Strategy(lora_targets=("q_proj", "lm_head"), task=Task.SEQ_CLS), "no vocabulary head"),
    (Strategy(lora_targets=("q_proj", "lm_head"), trainable_modules=("lm_head",)), "both"),
    # peft 0.21 skips a name that matches nothing when another matches: a typo is refused
    (Strategy(lora_targets=("q_proj", "v_prj")), "matches --lora-targets v_prj"),
    (Strategy(task=Task.SEQ_CLS, trainable_modules=("lm_head",)), "no vocabulary head"),
])
def test_combinations_not_modelled_are_refused(strategy: Strategy, words: str) -> None:
    with pytest.raises(UnsupportedError, match=words):
        estimate_memory(_spec(False), replace(strategy, seq_len=256))


def test_all_linear_leaves_the_head_alone() -> None:
    spec = _spec(False)
    assert count_trainable(spec, Strategy()).total == count_trainable(
        spec, Strategy(lora_targets=("all-linear", "lm_head"))).total


@pytest.mark.probe
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("targets", CASES)
@pytest.mark.parametrize("method", [Method.LORA, Method.DORA])
def test_counts_agree_with_peft(tied: bool, targets: tuple[str, ...], method: Method) -> None:
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    if method is Method.DORA and "embed_tokens" in targets:
        pytest.skip("DoRA on the embedding is refused (not estimated)")
    config = transformers.LlamaConfig(**{k: v for k, v in TINY.items()
                                         if k not in ("model_type", "architectures")},
                                      tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft warns that a tied twin is not adapted
        wrapped = peft.get_peft_model(model, peft.LoraConfig(
            r=8, lora_alpha=16, target_modules=list(targets), use_dora=method is Method.DORA))
    built = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    strategy = Strategy(method=method, lora_rank=8, lora_targets=targets)
    assert count_trainable(_spec(tied), strategy).total == built


_SIM = {**TINY, "vocab_size": 1024, "intermediate_size": 176, "max_position_embeddings": 2048}
#: tiny configs as tests/core/memory/test_simulation.py's (a 1024-token vocabulary)
CONFIGS = {"llama-gqa": {**_SIM, "tie_word_embeddings": False},
           "qwen2-tied-bias": {**_SIM, "model_type": "qwen2",
                               "architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": True}}
#: (config, targets, precision, checkpointing): measured by the CPU harness (real tensors,
#: peft 0.21 adapters) against the estimate, as tests/core/memory/test_simulation.py does.
SIMULATED = [
    ("llama-gqa", ("q_proj", "v_proj", "lm_head"), "bf16-mixed", False),
    ("qwen2-tied-bias", ("q_proj", "v_proj", "lm_head"), "fp32", False),
    ("llama-gqa", ("q_proj", "v_proj", "embed_tokens"), "bf16-mixed", True),
    ("qwen2-tied-bias", ("q_proj", "v_proj", "embed_tokens"), "bf16", False),
]


@pytest.mark.probe
@pytest.mark.parametrize(("arch", "targets", "precision", "checkpointing"), SIMULATED)
def test_head_and_embedding_adapters_match_the_simulation(
        arch: str, targets: tuple[str, ...], precision: str, checkpointing: bool) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from tuneplan.adapters.probe.harness import StepSetup, measure_step
    from tuneplan.core.job.recipes import Recipe
    from tuneplan.core.job.strategy import Checkpointing, Precision
    from tuneplan.core.memory import MemoryAssumptions

    p = Precision(precision)
    strategy = Strategy(method=Method.LORA, lora_rank=8, lora_alpha=16, lora_targets=targets,
                        precision=p, recipe=Recipe.HF if p.is_mixed else Recipe.PLAIN,
                        batch_size=2, seq_len=128, checkpointing=Checkpointing.FULL
                        if checkpointing else Checkpointing.NONE)
    measured = measure_step(StepSetup(config=CONFIGS[arch], strategy=strategy,
                                      optimizer_impl="fused"))
    estimate = estimate_memory(parse_model_config(CONFIGS[arch], name=arch), strategy,
                               MemoryAssumptions(adamw_impl="fused"))
    tensors = estimate.allocated_peak_bytes - int(
        estimate.breakdown.value("overheads/cublas_workspace"))
    assert estimate.trainable_params == measured.trainable_params
    assert abs(tensors - measured.peak_bytes) / measured.peak_bytes <= 0.03
