"""The generic model path: a config tuneplan's parsers do not know, read off the module tree
transformers builds on the meta device (``adapters/probe/meta.py``), and what says so."""

from __future__ import annotations

from typing import Any

import pytest

from tuneplan.adapters.hub import spec_from_config
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.models import (
    SUPPORTED_MODEL_TYPES,
    LinearRole,
    MlpKind,
    NormKind,
    count_parameters,
)
from tuneplan.errors import ModelConfigError, UnsupportedError

pytestmark = pytest.mark.probe
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128}


def _built_total(config: dict[str, Any]) -> int:
    cfg = {k: v for k, v in config.items() if k != "model_type"}
    hf = transformers.CONFIG_MAPPING[config["model_type"]].from_dict(cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("config", [
    # LayerNorm without bias, tied head (CohereConfig defaults)
    {"model_type": "cohere", **_TINY},
    # mixture of experts with a 3-D expert tensor and a custom router module
    {"model_type": "granitemoe", **_TINY, "num_local_experts": 4, "num_experts_per_tok": 2},
    # OLMo (1): LayerNorm without weights at all
    {"model_type": "olmo", **_TINY},
], ids=lambda c: c["model_type"])
def test_spec_counts_every_parameter_transformers_builds(config: dict[str, Any]) -> None:
    assert config["model_type"] not in SUPPORTED_MODEL_TYPES   # else the analytic path runs
    spec = spec_from_config(config, name=config["model_type"])
    assert spec.extra["structure"] == "transformers-meta"
    assert spec.extra["confidence"] == "medium"
    assert count_parameters(spec).total == _built_total(config)
    names = {lin.name for layer in spec.layers for lin in layer.linears}
    assert {"self_attn.q_proj", "self_attn.o_proj"} <= names   # PEFT's module paths
    assert spec.num_layers == 2 and spec.num_kv_heads == 2 and spec.head_dim == 16


def test_moe_experts_and_router_are_read_as_such() -> None:
    config = {"model_type": "granitemoe", **_TINY, "num_local_experts": 4,
              "num_experts_per_tok": 2}
    spec = spec_from_config(config, name="moe")
    roles = {lin.role for lin in spec.layers[0].linears}
    assert {LinearRole.EXPERT, LinearRole.ROUTER} <= roles
    assert spec.num_experts == 4 and spec.num_experts_per_token == 2
    counts = count_parameters(spec)
    assert 0 < counts.active_per_token < counts.total


def test_norm_and_mlp_kinds_are_read_from_the_modules() -> None:
    cohere = spec_from_config({"model_type": "cohere", **_TINY}, name="cohere")
    assert cohere.norm_kind is NormKind.LAYERNORM_NOBIAS and cohere.mlp_kind is MlpKind.GATED
    assert cohere.tie_word_embeddings and cohere.intermediate_size == 96


def test_estimate_says_the_generic_path_was_used() -> None:
    spec = spec_from_config({"model_type": "cohere", **_TINY}, name="cohere")
    est = estimate_memory(spec, Strategy(seq_len=32))
    assert any("meta device" in note and "confidence medium" in note for note in est.notes)


@pytest.mark.parametrize("config", [
    {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128,
     "state_size": 8},
    {"model_type": "mamba2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128,
     "num_heads": 4, "head_dim": 32, "expand": 2, "n_groups": 1, "state_size": 16},
], ids=lambda c: c["model_type"])
def test_state_space_blocks_are_counted_and_their_estimates_refused(
        config: dict[str, Any]) -> None:
    from tuneplan.adapters.bundled import resolve_gpu_spec
    from tuneplan.core.compute.throughput import estimate_throughput

    spec = spec_from_config(config, name=config["model_type"])
    assert count_parameters(spec).total == _built_total(config)
    assert spec.extra["state_space"] and spec.extra["confidence"] == "low"
    with pytest.raises(UnsupportedError, match=r"state-space .* not modelled"):
        estimate_memory(spec, Strategy(seq_len=32))
    with pytest.raises(UnsupportedError, match=r"state-space .* not modelled"):
        estimate_throughput(spec, Strategy(seq_len=32), resolve_gpu_spec("H100"))


def test_unknown_type_with_remote_code_is_refused_never_run() -> None:
    config = {"model_type": "my_remote_arch", "auto_map": {"AutoModelForCausalLM": "x.Y"},
              **_TINY}
    with pytest.raises(ModelConfigError, match=r"remote code .*never runs"):
        spec_from_config(config, name="remote")


def test_a_config_transformers_cannot_build_is_one_line() -> None:
    with pytest.raises(ModelConfigError, match="cannot build this cohere config") as info:
        spec_from_config({"model_type": "cohere", **_TINY, "hidden_act": "no-such-act"},
                         name="bad")
    assert "\n" not in str(info.value)


def test_a_module_tree_too_deep_to_build_is_refused_unbuilt() -> None:
    with pytest.raises(ModelConfigError, match="1 to 1,000 blocks"):
        spec_from_config({"model_type": "cohere", **_TINY, "num_hidden_layers": 5000},
                         name="deep")

