"""QLoRA on fused (3-D) routed experts: bitsandbytes quantizes nn.Linear modules only, so
transformers 5's stacked experts stay unquantized and peft's prepare_model_for_kbit_training
casts them to fp32; where they dominate, QLoRA's weights outweigh LoRA's, and a note (repeated
as a plan warning) says so."""

from __future__ import annotations

from dataclasses import replace

from tuneplan.core.job.methods import Method
from tuneplan.core.job.stack import Stack
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.memory.estimate import estimate_memory
from tuneplan.core.memory.experts import QLORA_EXPERTS_NOTE
from tuneplan.core.models import parse_model_config

BASE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
        "max_position_embeddings": 64, "tie_word_embeddings": False}
MOE = parse_model_config(BASE | {"model_type": "mixtral", "num_local_experts": 8,
                                 "num_experts_per_tok": 2}, name="tiny-mixtral")
DENSE = parse_model_config(BASE | {"model_type": "llama"}, name="tiny-llama")


def _job(method: Method) -> Strategy:
    return Strategy(method=method, seq_len=32, batch_size=1)


def _note(model_spec: object, s: Strategy) -> list[str]:
    est = estimate_memory(model_spec, s)  # type: ignore[arg-type]
    return [n for n in est.notes if n.startswith(QLORA_EXPERTS_NOTE)]


def _weights(model_spec: object, s: Strategy) -> int:
    est = estimate_memory(model_spec, s)  # type: ignore[arg-type]
    return int(est.breakdown.subtotal("weights"))


def test_qlora_on_fused_experts_says_it_needs_more_than_lora() -> None:
    qlora, lora = _job(Method.QLORA), _job(Method.LORA)
    assert _weights(MOE, qlora) > _weights(MOE, lora)   # the fp32 experts
    [note] = _note(MOE, qlora)
    assert "fused 3-D parameters" in note and "fp32" in note
    assert f"{_weights(MOE, lora) / 2**30:,.1f} GiB with --method lora" in note
    assert not _note(MOE, lora) and not _note(DENSE, _job(Method.QLORA))


def test_no_note_where_transformers_4_quantizes_each_expert_linear() -> None:
    old = replace(_job(Method.QLORA), lora_targets=("q_proj", "v_proj"),
                  stack=Stack.parse("transformers=4.46"))
    assert not _note(MOE, old)
