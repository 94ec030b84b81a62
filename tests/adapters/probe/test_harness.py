"""The measuring harness: exact bytes on hand-computable cases, fake == real on tiny models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.adapters.probe.harness import (  # noqa: E402
    StepSetup,
    measure_step,
    register_model,
    run_steps,
)
from tuneplan.adapters.probe.tracker import StorageTracker  # noqa: E402
from tuneplan.core.job.methods import Method, Quant  # noqa: E402
from tuneplan.core.job.recipes import Recipe  # noqa: E402
from tuneplan.core.job.strategy import (  # noqa: E402
    Attention,
    Checkpointing,
    Loss,
    Offload,
    Optimizer,
    Precision,
    Sharding,
    Strategy,
    Task,
)
from tuneplan.errors import UnsupportedError  # noqa: E402

pytestmark = pytest.mark.probe


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # Tiny tensors gain nothing from threads; on a busy 2-core machine OpenMP spinning
    # made this file 3x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def tiny(name: str, **overrides: Any) -> dict[str, Any]:
    path = resources.files("tuneplan") / "data" / "models" / f"{name}.json"
    cfg = {**json.loads(path.read_text()), **TINY, **overrides}
    if "head_dim" in cfg:
        cfg["head_dim"] = 16
    return cfg


LLAMA = tiny("meta-llama__Llama-3.1-8B")
# StepSetup's own knobs; every other keyword of ``step`` is a Strategy field.
_HARNESS_KNOBS = ("config", "optimizer_impl", "steps", "fake", "seed")


def job(**fields: Any) -> Strategy:
    """The tests' job, small and fast unless told: full fine-tuning in fp32, no
    checkpointing, seq 128, LoRA rank 8 / alpha 16, 8 virtual tokens."""
    small: dict[str, Any] = {
        "method": Method.FULL, "precision": Precision.FP32, "checkpointing": Checkpointing.NONE,
        "seq_len": 128, "lora_rank": 8, "lora_alpha": 16, "num_virtual_tokens": 8}
    return Strategy(**(small | fields))


def step(**kw: Any) -> StepSetup:
    """A StepSetup on tiny Llama: harness knobs from ``kw``, the rest is the job."""
    knobs = {k: kw.pop(k) for k in _HARNESS_KNOBS if k in kw}
    return StepSetup(**({"config": LLAMA} | knobs), strategy=job(**kw))


def test_tracker_counts_a_storage_once_across_views() -> None:
    tracker = StorageTracker()
    t = torch.zeros(10, 4)
    tracker.register(t, "activations")
    tracker.register(t[2:5], "activations")
    tracker.register(t.t(), "gradients")
    assert tracker.live_bytes == 160


def test_tracker_follows_in_place_resizes_and_frees() -> None:
    with StorageTracker() as tracker:
        t = torch.empty(0)
        t.resize_(100)  # 400 bytes, same storage
        assert tracker.live_bytes == 400
        u = t * 2
        assert tracker.live_bytes == 800
        del u
        assert tracker.live_bytes == 400
    result = tracker.result()
    assert result.peak_bytes == 800
    assert result.max_by_category["other"] == 800  # allocated outside any phase


def test_linear_sgd_step_by_hand() -> None:
    # Linear(64→32) fp32: W 8192 B + b 128 B = 8320 B; x 4×64×4 = 1024 B. SGD with momentum,
    # one step, single-tensor: the step clones each grad into its momentum buffer while the
    # grads are alive, so the peak is params + grads + momentum + input = 3·8320 + 1024.
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    x = torch.randn(4, 64)
    setup = step(config={}, optimizer=Optimizer.SGD, optimizer_impl="single", steps=1)
    tracker = StorageTracker()
    register_model(tracker, model, {"x": x})
    run_steps(model, lambda: model(x).sum(), setup, tracker)
    r = tracker.result()
    assert r.peak_bytes == 3 * 8320 + 1024
    assert r.peak_phase == "optimizer"
    expect = {"parameters": 8320, "inputs": 1024, "gradients": 8320, "optimizer": 8320}
    assert {k: v for k, v in r.peak_by_category.items() if v} == expect
    assert r.max_by_category["activations"] == 512 + 4  # y (4×32 fp32) and the loss
    assert r.peak_by_phase["forward"] == 8320 + 1024 + 512 + 4
    assert r.peak_by_phase["optimizer"] == r.peak_bytes
    # Afterwards grads are gone (set_to_none) and so is the momentum (the optimizer lived
    # inside run_steps): frees are booked too.
    assert tracker.live_bytes == 8320 + 1024


def test_full_adamw_categories_are_exact() -> None:
    m = measure_step(step(seq_len=16, batch_size=2))
    n = m.total_params
    tensors = 2 * (4 + 2 + 3) + 2 + 1  # per layer: q k v o, 2 norms, 3 mlp; embed, norm, head
    assert m.trainable_params == n == 106_816
    assert m.max_by_category["parameters"] == 4 * n
    assert m.max_by_category["gradients"] == 4 * n
    assert m.max_by_category["optimizer"] == 8 * n + 4 * tensors  # exp_avg, exp_avg_sq, step
    assert m.max_by_category["inputs"] == 2 * 2 * 16 * 8
    assert m.peak_phase == "backward"
    assert m.peak_step == 2


QWEN2 = tiny("Qwen__Qwen2.5-0.5B")  # biases on q/k/v, tied embeddings

CKPT = Checkpointing.FULL
VARIANTS: list[dict[str, Any]] = [
    {"method": Method.FULL},
    {"method": Method.FULL, "precision": Precision.BF16_MIXED},  # fp32 weights, bf16 autocast
    {"method": Method.LORA},
    # bf16-mixed LoRA is a bf16 base under bf16 autocast (fp32 adapters); an fp32 base under
    # autocast is no Strategy (the estimate cannot describe it), so it is not run here.
    {"method": Method.LORA, "lora_dropout": 0.1, "precision": Precision.BF16_MIXED},
    {"method": Method.DORA, "precision": Precision.BF16, "checkpointing": CKPT},
    {"method": Method.PREFIX},
    {"method": Method.PROMPT, "checkpointing": CKPT},
    {"method": Method.IA3, "optimizer": Optimizer.SGD, "optimizer_impl": "foreach"},
    {"method": Method.LORA, "task": Task.SEQ_CLS, "attention": Attention.EAGER},
    {"method": Method.FULL, "config": QWEN2, "attention": Attention.EAGER,
     "optimizer_impl": "single"},
]


def _variant_id(v: dict[str, Any]) -> str:
    names = {"config": "qwen2", "checkpointing": "ckpt"}
    return "-".join(names.get(k, str(x)) for k, x in v.items())


@pytest.mark.parametrize("variant", VARIANTS, ids=_variant_id)
def test_fake_matches_real_to_the_byte(variant: dict[str, Any]) -> None:
    kw: dict[str, Any] = {"seq_len": 32, "batch_size": 2, **variant}
    real = measure_step(step(**kw))
    fake = measure_step(step(**kw, fake=True))
    assert real.peak_bytes == fake.peak_bytes
    assert dict(real.peak_by_category) == dict(fake.peak_by_category)
    assert dict(real.max_by_category) == dict(fake.max_by_category)
    assert (real.trainable_params, real.total_params) == (fake.trainable_params, fake.total_params)


def test_lora_freezes_the_base_and_keeps_adapters_fp32() -> None:
    m = measure_step(step(method=Method.LORA, precision=Precision.BF16, seq_len=16))
    base = 106_816
    assert m.total_params - m.trainable_params == base
    # 7 targets × 2 layers: A (r×in) + B (out×r), r = 8; adapters stay fp32 on a bf16 base.
    assert m.max_by_category["parameters"] == 2 * base + 4 * m.trainable_params
    assert m.max_by_category["gradients"] == 4 * m.trainable_params


def test_checkpointing_lowers_the_peak() -> None:
    kw: dict[str, Any] = {"method": Method.LORA, "seq_len": 64, "batch_size": 2}
    plain = measure_step(step(**kw))
    ckpt = measure_step(step(**kw, checkpointing=Checkpointing.FULL))
    assert ckpt.max_by_category["activations"] < plain.max_by_category["activations"]
    assert ckpt.peak_bytes < plain.peak_bytes


def test_moe_runs_real_and_fake() -> None:
    cfg = tiny("mistralai__Mixtral-8x7B-v0.1", num_local_experts=4)
    kw: dict[str, Any] = {"config": cfg, "precision": Precision.BF16, "seq_len": 16}
    real = measure_step(step(**kw))
    fake = measure_step(step(**kw, fake=True))
    assert real.peak_bytes == fake.peak_bytes
    assert real.max_by_category["parameters"] == 2 * real.total_params


def test_gemma2_eager_runs_real_and_fake() -> None:
    cfg = tiny("google__gemma-2-2b", sliding_window=16)
    kw: dict[str, Any] = {"config": cfg, "attention": Attention.EAGER, "method": Method.LORA,
                          "seq_len": 32}
    real = measure_step(step(**kw))
    fake = measure_step(step(**kw, fake=True))
    assert real.peak_bytes == fake.peak_bytes
    # Tied embeddings are counted once.
    assert real.max_by_category["parameters"] == 4 * real.total_params


def test_qlora_real_and_fake_agree_and_weights_are_packed() -> None:
    pytest.importorskip("bitsandbytes")
    kw: dict[str, Any] = {"method": Method.QLORA, "precision": Precision.BF16,
                          "recipe": Recipe.HF}  # HF: prepare_model_for_kbit_training
    real = measure_step(step(**kw, seq_len=16))
    fake = measure_step(step(**kw, seq_len=16, fake=True))
    assert real.peak_bytes == fake.peak_bytes
    assert dict(real.max_by_category) == dict(fake.max_by_category)
    # 2 layers × (q 64·64 + k, v 32·64 + o 64·64 + 3 mlp 64·128) = 73,728 4-bit values → 36,864 B;
    # prepare_model_for_kbit_training upcasts embed, head (256·64 each) and 5 norms to fp32;
    # the 16,384 LoRA values are fp32.
    assert (
        real.max_by_category["parameters"] == 73_728 // 2 + 4 * (2 * 256 * 64 + 5 * 64) + 4 * 16_384
    )
    # Per Linear4bit: absmax uint8 per 64 values, fp32 absmax per 256 blocks, fp32 offset,
    # NF4 code (16 fp32) and the 8-bit map (256 fp32): 1152 + 14·(4 + 4 + 64 + 1024).
    assert real.max_by_category["quant_state"] == 1152 + 14 * (4 + 4 + 64 + 1024)
    assert real.total_params == 106_816 + real.trainable_params


@pytest.mark.parametrize("optimizer", [Optimizer.ADAMW8BIT, Optimizer.LION])
def test_bitsandbytes_optimizers_real_and_fake_agree(optimizer: Optimizer) -> None:
    pytest.importorskip("bitsandbytes")
    kw: dict[str, Any] = {"optimizer": optimizer, "seq_len": 16}
    real = measure_step(step(**kw))
    fake = measure_step(step(**kw, fake=True))
    assert real.peak_bytes == fake.peak_bytes
    assert dict(real.max_by_category) == dict(fake.max_by_category)
    if optimizer is Optimizer.LION:  # one fp32 moment per parameter, no step tensor
        assert real.max_by_category["optimizer"] == 4 * real.trainable_params


def test_unrunnable_method_is_refused_with_a_reason() -> None:
    with pytest.raises(UnsupportedError, match="--method adapter"):
        step(method=Method.ADAPTER)


# Strategy settings the harness cannot run: each refused when the StepSetup is made, naming
# the flag (none may be silently measured as something else).
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"sharding": Sharding.ZERO3}, "--sharding zero3"),
    ({"sharding": Sharding.FSDP}, "--sharding fsdp"),
    ({"gpus": 2}, "more than one GPU"),
    ({"offload": Offload.OPTIMIZER}, "--offload optimizer"),
    ({"checkpointing": Checkpointing.OFFLOAD}, "--offload-activations"),
    ({"recipe": Recipe.UNSLOTH}, "--recipe unsloth"),
    ({"recipe": Recipe.TORCHTUNE, "method": Method.QLORA, "quant": Quant.FP4},
     "torchtune simulation cannot run --quant fp4"),
    ({"recipe": Recipe.TORCHTUNE, "method": Method.DORA},
     "torchtune simulation cannot run --method dora"),
    ({"precision": Precision.FP16_MIXED}, "--precision fp16-mixed"),
    ({"optimizer": Optimizer.PAGED_ADAMW8BIT}, "--optimizer paged-adamw8bit"),
    ({"optimizer_in_backward": True}, "--optimizer-in-backward"),
    ({"grad_accum": 4}, "--grad-accum"),
    ({"packing": True}, "--packing"),
    ({"attention": Attention.FLASH}, "--attention flash"),
    ({"compile": True}, "--compile"),
    ({"loss": Loss.CHUNKED}, "--loss chunked"),
    ({"num_labels": 3, "task": Task.SEQ_CLS}, "--num-labels"),
    ({"method": Method.QLORA, "quant": Quant.GPTQ_INT4}, "--quant gptq-int4"),
    ({"method": Method.FREEZE, "trainable_layers": 1}, "--method freeze"),
]


@pytest.mark.parametrize(("fields", "flag"), REFUSED, ids=[f for _, f in REFUSED])
def test_strategy_the_harness_cannot_run_is_refused_naming_the_flag(
        fields: dict[str, Any], flag: str) -> None:
    with pytest.raises(UnsupportedError, match=flag):
        step(**fields)


@pytest.mark.parametrize(("precision", "method", "param", "autocast"), [
    (Precision.FP32, Method.FULL, torch.float32, None),
    (Precision.FP32, Method.LORA, torch.float32, None),
    (Precision.BF16, Method.FULL, torch.bfloat16, None),
    (Precision.BF16, Method.QLORA, torch.bfloat16, None),
    (Precision.BF16_MIXED, Method.FULL, torch.float32, torch.bfloat16),  # fp32 master weights
    (Precision.BF16_MIXED, Method.LORA, torch.bfloat16, torch.bfloat16),  # bf16 frozen base
    (Precision.BF16_MIXED, Method.PREFIX, torch.bfloat16, torch.bfloat16),
])
def test_dtypes_come_from_the_strategy_precision(
        precision: Precision, method: Method, param: Any, autocast: Any) -> None:
    setup = step(precision=precision, method=method)
    assert setup.param_dtype is param
    assert setup.autocast_dtype is autocast


def test_job_derived_knobs_follow_the_strategy() -> None:
    assert step(recipe=Recipe.HF, method=Method.QLORA).kbit_prepare
    assert not step(recipe=Recipe.PLAIN, method=Method.QLORA).kbit_prepare
    assert step(checkpointing=Checkpointing.FULL).checkpointing
    assert not step(checkpointing=Checkpointing.NONE).checkpointing
    assert step().impl == "fused"
    assert step(optimizer=Optimizer.ADAFACTOR).impl == "foreach"  # torch has no fused one
    assert step(optimizer=Optimizer.ADAFACTOR, optimizer_impl="single").impl == "single"


def test_trainable_modules_train_with_prompt_tuning() -> None:
    # --trainable-modules is honoured for prompt learning too (PEFT modules_to_save): the
    # lm_head copy (256×64) trains beside the 8×64 prompt embedding.
    m = measure_step(step(method=Method.PROMPT, trainable_modules=("lm_head",), seq_len=16,
                          fake=True))
    assert m.trainable_params == 256 * 64 + 8 * 64


def test_fake_moe_in_fp32_is_refused_with_a_reason() -> None:
    cfg = tiny("mistralai__Mixtral-8x7B-v0.1", num_local_experts=4)
    with pytest.raises(UnsupportedError, match="bfloat16"):
        measure_step(step(config=cfg, fake=True))
