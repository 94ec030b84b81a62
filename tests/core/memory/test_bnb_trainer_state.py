"""The 8-bit AdamW state the HF Trainer really builds, against the estimate's
``optimizer/states``: transformers 5.24 ``Trainer.create_optimizer`` registers
``optim_bits=32`` for every ``nn.Embedding`` weight, so the token embedding keeps two fp32
states while the head and other large matrices keep uint8 states with fp32 absmax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Checkpointing, Optimizer, Precision, Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.models import parse_model_config

#: vocab x hidden = 8192 elements, over bitsandbytes' 4096-element 8-bit minimum; every block
#: matrix (at most 64 x 32) under it, so only the embedding and the head are 8-bit candidates.
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def _tiny_model() -> Any:
    """``TINY`` as a seeded fp32 transformers model (skips without torch, transformers or
    bitsandbytes)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**TINY), dtype=torch.float32)


def _one_step_state(model: Any, tmp_path: Path) -> tuple[Any, int]:
    """One HF Trainer step of ``model`` with adamw_bnb_8bit on the CPU: (its optimizer state
    by parameter, the bytes it holds without the shared quantization maps)."""
    import torch
    import transformers

    rows = [{"input_ids": torch.arange(8) % 256, "labels": torch.arange(8) % 256}] * 2
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), optim="adamw_bnb_8bit", max_steps=1,
        per_device_train_batch_size=2, use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    state = trainer.optimizer.optimizer.state if hasattr(trainer.optimizer, "optimizer") \
        else trainer.optimizer.state
    held = sum(t.numel() * t.element_size() for s in state.values() for k, t in s.items()
               if torch.is_tensor(t) and not k.startswith("qmap"))  # qmaps: shared tables
    return state, held


@pytest.mark.parametrize("recipe", [Recipe.HF, Recipe.PLAIN])
def test_the_trainers_8bit_adamw_keeps_the_embedding_state_in_fp32(tmp_path, recipe) -> None:
    torch = pytest.importorskip("torch")
    model = _tiny_model()
    state, held = _one_step_state(model, tmp_path)
    assert state[model.model.embed_tokens.weight]["state1"].dtype == torch.float32
    assert state[model.lm_head.weight]["state1"].dtype == torch.uint8
    est = estimate_memory(parse_model_config(TINY, name="tiny"), Strategy(
        method=Method.FULL, optimizer=Optimizer.ADAMW8BIT, precision=Precision.FP32,
        recipe=recipe, seq_len=8, checkpointing=Checkpointing.NONE))
    assert est.breakdown.value("optimizer/states") == held


def test_the_time_models_optimizer_step_reads_the_same_fp32_embedding_state() -> None:
    """One fact, two models: the optimizer step's bytes add the embedding's fp32 states
    (2 x (8 - 2) B per element, read and written) over torchtune's all-8-bit step."""
    from dataclasses import replace

    from tuneplan.adapters.bundled import load_gpu_spec
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.core.compute.assumptions import ThroughputAssumptions
    from tuneplan.core.compute.throughput import estimate_throughput

    gpu, a = load_gpu_spec("H100 SXM5"), ThroughputAssumptions()
    model = resolve_model("meta-llama/Llama-3.1-8B")
    hf = Strategy(method=Method.FULL, optimizer=Optimizer.ADAMW8BIT, precision=Precision.BF16)
    step = estimate_throughput(model, hf, gpu).step.get("step/optimizer")
    tune = estimate_throughput(model, replace(hf, recipe=Recipe.TORCHTUNE), gpu).step.get(
        "step/optimizer")
    assert step is not None and tune is not None
    embedding = 128_256 * 4096
    assert step.inputs["fp32_state_embedding_per_rank"] == embedding
    rate = float(gpu.memory_bandwidth_bytes_per_s or 0) * a.optimizer_bandwidth_efficiency
    assert step.value - tune.value == pytest.approx(
        embedding * 2 * (8 - 2) * a.optimizer_passes / rate, rel=1e-9)


def test_peft_modules_to_save_copies_get_the_trainers_8bit_state_rules(tmp_path) -> None:
    """LoRA with ``modules_to_save`` embedding and head: PEFT's trainable copies are an
    ``nn.Embedding`` (the Trainer's override: two fp32 states) and an ``nn.Linear`` (uint8
    states with fp32 absmax), sized like any trained matrix, not 8 B per element flat."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_tiny_model(), peft.LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
        modules_to_save=["embed_tokens", "lm_head"]))
    state, held = _one_step_state(model, tmp_path)
    copies = {n: state[p]["state1"].dtype for n, p in model.named_parameters()
              if p in state and p.numel() == 256 * 32}
    assert sorted((n.split(".")[-4], str(d)) for n, d in copies.items()) == [
        ("embed_tokens", "torch.float32"), ("lm_head", "torch.uint8")], copies
    est = estimate_memory(parse_model_config(TINY, name="tiny"), Strategy(
        method=Method.LORA, lora_rank=8, lora_alpha=16, lora_targets=("q_proj", "v_proj"),
        trainable_modules=("embed_tokens", "lm_head"), optimizer=Optimizer.ADAMW8BIT,
        precision=Precision.FP32, seq_len=8, checkpointing=Checkpointing.NONE))
    assert est.breakdown.value("optimizer/states") == held
