"""--lora-targets q_proj,v_proj on a fused-QKV model (GPT-NeoX, BLOOM, Falcon) wraps the fused
``query_key_value``, as PEFT's default targets do; counts checked against real peft."""

from __future__ import annotations

from typing import Any

import pytest

from tuneplan.adapters.bundled import load_gpu_spec
from tuneplan.core.compute.throughput import estimate_throughput
from tuneplan.core.job.methods import (
    FUSED_QKV,
    Method,
    count_trainable,
    fused_qkv_note,
    peft_lora_targets,
)
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.models import parse_model_config

TINY: dict[str, dict[str, Any]] = {
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4,
                 "num_hidden_layers": 2, "intermediate_size": 256, "vocab_size": 128,
                 "max_position_embeddings": 256},
    "bloom": {"model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 2,
              "vocab_size": 128},
    "falcon": {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4,
               "num_hidden_layers": 2, "vocab_size": 128, "new_decoder_architecture": False,
               "multi_query": True},
}


def _spec(kind: str) -> Any:
    return parse_model_config(TINY[kind], name=f"tiny-{kind}")


@pytest.mark.parametrize("kind", sorted(TINY))
@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("k_proj",), ("q_proj", "dense")])
def test_split_names_map_onto_the_fused_linear(kind: str, targets: tuple[str, ...]) -> None:
    strategy = Strategy(method=Method.LORA, lora_targets=targets, seq_len=64)
    mapped = peft_lora_targets(_spec(kind), strategy)
    assert mapped == (FUSED_QKV, *[t for t in targets if t == "dense"])
    note = fused_qkv_note(_spec(kind), strategy)
    assert note is not None and FUSED_QKV in note
    assert note in estimate_memory(_spec(kind), strategy).notes
    assert note in estimate_throughput(_spec(kind), strategy, load_gpu_spec("RTX A5000")).notes


def test_split_models_and_all_linear_are_unchanged() -> None:
    llama = parse_model_config({"model_type": "llama", "hidden_size": 64,
                                "num_attention_heads": 4, "num_hidden_layers": 2,
                                "intermediate_size": 128, "vocab_size": 128}, name="tiny-llama")
    s = Strategy(method=Method.LORA, lora_targets=("q_proj", "v_proj"))
    assert peft_lora_targets(llama, s) == ("q_proj", "v_proj") and fused_qkv_note(llama, s) is None
    assert peft_lora_targets(_spec("bloom"), Strategy()) == Strategy().lora_targets


@pytest.mark.parametrize("kind", sorted(TINY))
def test_trainable_count_equals_peft_on_the_fused_linear(kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = transformers.AutoConfig.for_model(**TINY[kind])
    model = transformers.AutoModelForCausalLM.from_config(config)
    strategy = Strategy(method=Method.LORA, lora_rank=4, lora_targets=("q_proj", "v_proj"))
    # PEFT matches by module-name suffix: the split names themselves find nothing.
    with pytest.raises(ValueError, match="not found"):
        peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model = transformers.AutoModelForCausalLM.from_config(config)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(
        r=4, target_modules=list(peft_lora_targets(_spec(kind), strategy))))
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    assert count_trainable(_spec(kind), strategy).total == trainable


def test_train_script_gives_peft_the_fused_name() -> None:
    transformers = pytest.importorskip("transformers")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "src" / "tuneplan" / "data" / "launch" / "train.py"
    spec = importlib.util.spec_from_file_location("tuneplan_train_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**TINY["gpt_neox"]))
    assert module.peft_targets(model, ["q_proj", "v_proj"]) == [FUSED_QKV]
    assert module.peft_targets(model, ["all-linear"]) == ["all-linear"]

