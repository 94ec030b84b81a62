"""Model architecture types: ``ModelSpec``, its blocks (``LayerSpec``) and linears (``Linear``).

Plain frozen values only; parsing a config.json lives in ``decoders.py``, ``legacy.py`` and
``encoders.py`` beside this file, counting in ``__init__.py`` (which re-exports everything
here: import from ``tuneplan.core.models``).
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
    EXPERT = "expert"              # routed expert weight: ``copies`` = num_experts; in
    # transformers 5 these are 3-D parameters (``experts.gate_up_proj``), not nn.Linear modules
    SHARED_EXPERT = "shared_expert"
    ROUTER = "router"
    CROSS_ATTENTION = "cross_attention"
    # Outside the blocks, only as adapter targets (``core.job.methods.outer_targets``):
    OUTPUT_HEAD = "output_head"    # lm_head (hidden -> vocab)
    EMBEDDING = "embedding"        # embed_tokens, seen as a vocab -> hidden map


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

    kind: str                          # "decoder", "encoder", "decoder-cross" or "vision"
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

    @property
    def bias_params(self) -> int:
        """Linear biases in one block (norm biases are in ``norm_params``)."""
        return sum(lin.bias_params for lin in self.linears)


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
    # Added after the first interface; all default to "absent".
    num_decoder_layers: int = 0                # encoder-decoder only (``num_layers`` = encoder)
    num_shared_experts: int = 0                # always-active experts (DeepSeek, Qwen2-MoE)
    head_in_features: int = 0                  # 0: hidden_size (OPT projects to a smaller dim)
    head_extra_params: int = 0                 # head transform before the vocab (BERT MLM)
    vision_layers: tuple[LayerSpec, ...] = ()  # vision tower blocks (Gemma 3 multimodal)
    vision_extra_params: Mapping[str, int] = field(default_factory=dict)  # "vision/embeddings"...
    notes: tuple[str, ...] = ()                # what is and is not counted, in words
    # Routed experts are one nn.Linear per expert and projection whatever the transformers
    # version (remote modeling code: Kimi-K2's DeepseekV3MoE ModuleList of DeepseekV3MLP).
    per_expert_linears: bool = False
    #: ``is_encoder_only``, decided once from the fields above (the estimate asks it several
    #: times per micro-batch); not an input, not compared
    _encoder_only: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_encoder_only", not self.is_encoder_decoder and bool(
            self.layers) and all(layer.kind == "encoder" for layer in self.layers))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_encoder_only(self) -> bool:
        """A bidirectional encoder stack alone (BERT, RoBERTa): post-LN blocks, absolute
        position embeddings, no causal mask, no vocabulary head when fine-tuned."""
        return self._encoder_only

    @property
    def head_params(self) -> int:
        """Output head parameters (0 when tied to the embedding, plus its bias if any)."""
        in_features = self.head_in_features or self.hidden_size
        weight = 0 if self.tie_word_embeddings else self.vocab_size * in_features
        return weight + (self.vocab_size if self.head_bias else 0) + self.head_extra_params

    @property
    def vision_params(self) -> int:
        """Vision tower and projector parameters (0 for text-only models)."""
        return sum(layer.params * layer.count for layer in self.vision_layers) + sum(
            self.vision_extra_params.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterCounts:
    """Exact learnable parameters: ``by_component`` sums to ``total``."""

    total: int
    active_per_token: int
    by_component: Mapping[str, int]
    bias_params: int = 0   # biases of block linears + lm_head bias (also inside by_component)
