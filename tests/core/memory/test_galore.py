"""GaLore's optimizer state held to galore-torch's real optimizer, built the way the HF Trainer
builds it (transformers' own target matching and parameter groups), after one real step on a
tiny random Llama on the CPU: state and projector bytes must match the estimate exactly."""

from __future__ import annotations

from typing import Any

import pytest

from tuneplan.core.job.galore import galore_matrices
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Checkpointing, Optimizer, Precision, Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.models import parse_model_config
from tuneplan.errors import UnsupportedError

# hidden 64, intermediate 176, 2 blocks: q/o 64x64, k/v 32x64, gate/up 176x64, down 64x176
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128,
         "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}


def _strategy(precision: Precision, rank: int, targets: tuple[str, ...] | None = None,
              optimizer: Optimizer = Optimizer.GALORE_ADAMW) -> Strategy:
    extra = {"galore_targets": targets} if targets else {}
    return Strategy(method=Method.FULL, recipe=Recipe.PLAIN, precision=precision,
                    optimizer=optimizer, galore_rank=rank, batch_size=1, seq_len=16,
                    checkpointing=Checkpointing.NONE, **extra)


def _state_bytes(optimizer: Any) -> tuple[int, int]:
    """(bytes of the optimizer's state tensors, bytes of its projectors' storages), each
    storage counted once."""
    import torch

    seen: set[int] = set()

    def size(t: torch.Tensor) -> int:
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return int(storage.nbytes())

    states = projectors = 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                states += size(value)
            elif key == "projector" and value.ortho_matrix is not None:
                projectors += size(value.ortho_matrix)
    return states, projectors


def _one_real_step(strategy: Strategy, tmp_path: Any) -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    dtype = torch.bfloat16 if strategy.precision is Precision.BF16 else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**LLAMA), dtype=dtype)
    args = TrainingArguments(
        output_dir=str(tmp_path), optim="galore_adamw", use_cpu=True, report_to="none",
        optim_target_modules=list(strategy.galore_targets),
        optim_args=f"rank={strategy.galore_rank},update_proj_gap=200,scale=0.25")
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    optimizer = cls(kwargs.pop("params"), **kwargs)
    ids = torch.randint(0, LLAMA["vocab_size"], (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return optimizer


@pytest.mark.probe
@pytest.mark.parametrize(("precision", "rank", "targets"), [
    (Precision.FP32, 8, None),              # r < min side everywhere: fp32 views of the factor
    (Precision.FP32, 48, None),             # r beyond k/v's 32 rows: clamped there
    (Precision.BF16, 8, None),              # 16-bit: the r x k factor is a cast copy
    (Precision.FP32, 8, ("q_proj", "model.layers.1.mlp.down_proj")),  # names and one block
])
def test_galore_state_bytes_match_galore_torch_exactly(
        precision: Precision, rank: int, targets: tuple[str, ...] | None, tmp_path: Any) -> None:
    pytest.importorskip("galore_torch")
    strategy = _strategy(precision, rank, targets)
    optimizer = _one_real_step(strategy, tmp_path)
    states, projectors = _state_bytes(optimizer)
    est = estimate_memory(parse_model_config(LLAMA, name="tiny-llama"), strategy)
    assert int(est.breakdown.value("optimizer/states")) == states
    assert int(est.breakdown.value("optimizer/galore_projectors")) == projectors
    # the real optimizer projected exactly the weights the estimate targets
    galore_group = optimizer.param_groups[1]
    expected = sum(k for _, _, k in galore_matrices(
        parse_model_config(LLAMA, name="tiny-llama"), strategy))
    assert len(galore_group["params"]) == expected and galore_group["rank"] == rank


def test_galore_state_is_smaller_than_adamw_by_the_projection() -> None:
    """The states of a projected (m, n) weight are 2·r·max(m,n) elements, not 2·m·n."""
    spec = parse_model_config(LLAMA, name="tiny-llama")
    plain = estimate_memory(spec, _strategy(Precision.FP32, 8, optimizer=Optimizer.ADAMW))
    galore = estimate_memory(spec, _strategy(Precision.FP32, 8))
    # per block: q,o 64x64 -> 8x64; k,v 32x64 -> 8x64; gate,up 176x64 -> 176x8; down -> 8x176
    block_full = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 176 * 64
    block_low = 2 * 8 * 64 + 2 * 8 * 64 + 3 * 176 * 8
    saved = 2 * 4 * 2 * (block_full - block_low)  # 2 states, 4 B, 2 blocks
    assert (int(plain.breakdown.value("optimizer/states"))
            - int(galore.breakdown.value("optimizer/states"))) == saved
    # projectors: fp32 views keep min(m,n)^2 per weight
    proj = 2 * 4 * (2 * 64 * 64 + 2 * 32 * 32 + 3 * 64 * 64)
    assert int(galore.breakdown.value("optimizer/galore_projectors")) == proj


def test_galore_refusals_name_the_reason() -> None:
    spec = parse_model_config(LLAMA, name="tiny-llama")
    with pytest.raises(UnsupportedError, match="full fine-tuning optimizer"):
        estimate_memory(spec, Strategy(method=Method.LORA, optimizer=Optimizer.GALORE_ADAMW,
                                       seq_len=16))
    with pytest.raises(UnsupportedError, match="No target modules found"):
        estimate_memory(spec, _strategy(Precision.FP32, 8, ("nothing_here",)))
    with pytest.raises(UnsupportedError, match="lm_head"):
        estimate_memory(spec, _strategy(Precision.FP32, 8, ("lm_head",)))
