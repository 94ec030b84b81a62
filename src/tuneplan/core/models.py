"""Model architectures: ``ModelSpec`` parsed from a Hugging Face ``config.json`` dict.

Exact learnable-parameter counts by component. This module reads no files: the adapters
(``adapters/hub.py``) load the JSON and call ``parse_model_config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class NormKind(StrEnum):
    RMSNORM = "rmsnorm"            # weight only
    LAYERNORM = "layernorm"        # weight + bias
    LAYERNORM_NOBIAS = "layernorm-nobias"


class MlpKind(StrEnum):
    GATED = "gated"                # gate_proj, up_proj, down_proj (SwiGLU/GeGLU)
    PLAIN = "plain"                # up (fc1) and down (fc2)


class LinearRole(StrEnum):
    ATTENTION = "attention"
    MLP = "mlp"
    EXPERT = "expert"              # routed expert weight: ``copies`` = num_experts
    SHARED_EXPERT = "shared_expert"
    ROUTER = "router"
    CROSS_ATTENTION = "cross_attention"


@dataclass(frozen=True, slots=True, kw_only=True)
class Linear:
    """One linear map inside a block, named as the Hugging Face module is (``q_proj``).

    ``copies`` > 1 for routed experts (one per expert). Parameters:
    copies · (in_features · out_features + out_features·bias).
    """

    name: str
    in_features: int
    out_features: int
    bias: bool
    role: LinearRole
    copies: int = 1

    @property
    def weight_params(self) -> int:
        return self.copies * self.in_features * self.out_features

    @property
    def bias_params(self) -> int:
        return self.copies * self.out_features if self.bias else 0

    @property
    def params(self) -> int:
        return self.weight_params + self.bias_params


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerSpec:
    """A group of ``count`` identical transformer blocks.

    ``norm_params`` counts every normalisation weight/bias in one block (incl. q/k norms);
    ``extra_params`` names anything else learnable in one block (attention sinks, relative
    position bias, MLA norms...). ``experts_per_token`` is 0 for dense blocks.
    """

    kind: str                                   # "decoder", "encoder", "decoder-cross"
    count: int
    linears: tuple[Linear, ...]
    norm_params: int
    extra_params: Mapping[str, int] = field(default_factory=dict)
    num_experts: int = 0
    experts_per_token: int = 0

    @property
    def params(self) -> int:
        return sum(lin.params for lin in self.linears) + self.norm_params + sum(
            self.extra_params.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """What tuneplan knows of one model: dimensions in one vocabulary, blocks, and defaults.

    Dimensions use the house names (num_layers, hidden_size, num_heads, num_kv_heads,
    head_dim, intermediate_size, vocab_size, num_experts, num_experts_per_token).
    ``defaults_applied`` lists every value taken from the library's defaults, not the file.
    """

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    norm_kind: NormKind
    mlp_kind: MlpKind
    hidden_act: str
    layers: tuple[LayerSpec, ...]
    embedding_params: int                      # token + learned positions + embedding norm
    final_norm_params: int
    head_bias: bool = False
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    is_encoder_decoder: bool = False
    sliding_window: int | None = None
    torch_dtype: str | None = None
    defaults_applied: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # architecture-specific (MLA ranks)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def head_params(self) -> int:
        """Output head parameters (0 when tied to the embedding, plus its bias if any)."""
        weight = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return weight + (self.vocab_size if self.head_bias else 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterCounts:
    """Exact learnable parameters: ``by_component`` sums to ``total``."""

    total: int
    active_per_token: int
    by_component: Mapping[str, int]


def parse_model_config(config: Mapping[str, Any], *, name: str) -> ModelSpec:
    """Build a ModelSpec from a config.json mapping. Raises ModelConfigError (all problems)."""
    raise NotImplementedError


def count_parameters(spec: ModelSpec) -> ParameterCounts:
    """Exact learnable parameter counts by component, total and active per token."""
    raise NotImplementedError


SUPPORTED_MODEL_TYPES: tuple[str, ...] = ()
