"""Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2) sizes read off a ModelSpec.

The deepseek parser keeps MLA's ranks in ``ModelSpec.extra`` (``kv_lora_rank``, ``q_lora_rank``,
``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``); the memory and speed models read
them here. Layout as transformers 5.24 ``models/deepseek_v3/modeling_deepseek_v3.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.models.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class MlaDims:
    """MLA ranks and per-head sizes (``ModelSpec.extra`` of the deepseek parsers)."""

    heads: int
    q_rank: int          # 0: a plain q_proj (DeepSeek-V2-Lite)
    kv_rank: int
    nope: int
    rope: int
    v: int

    @property
    def qk(self) -> int:
        return self.nope + self.rope


def mla_dims(model: ModelSpec) -> MlaDims | None:
    """The model's MLA sizes, or None for other attention."""
    kv = model.extra.get("kv_lora_rank")
    if not isinstance(kv, int) or kv <= 0:
        return None
    q = model.extra.get("q_lora_rank")
    return MlaDims(heads=model.num_heads, q_rank=q if isinstance(q, int) else 0, kv_rank=kv,
                   nope=int(model.extra["qk_nope_head_dim"]),
                   rope=int(model.extra["qk_rope_head_dim"]), v=int(model.extra["v_head_dim"]))


def rope_dim(model: ModelSpec) -> int:
    """Width of the RoPE cos/sin tables: the rotary part only under MLA (transformers'
    DeepseekV3Config sets ``head_dim = qk_rope_head_dim`` for its rotary embedding)."""
    d = mla_dims(model)
    return model.head_dim if d is None else d.rope


def qkv_dims(model: ModelSpec) -> tuple[int, int, int]:
    """Per-token widths (elements) of the query, key and value attention runs on: MLA's key
    is expanded to every head (H·(nope+rope)), its value is H·v."""
    d = mla_dims(model)
    if d is None:
        return (model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim,
                model.num_kv_heads * model.head_dim)
    return d.heads * d.qk, d.heads * d.qk, d.heads * d.v


def score_dim(model: ModelSpec) -> int:
    """``d_attn`` of the attention FLOPs 4·s·d_attn per token and block: the mean of the
    query-key width and the value width over all heads, since QK^T costs 2·s·H·d_qk and AV
    2·s·H·d_v (GQA shares keys, not score products: every head counts). H·head_dim for
    ordinary attention; MLA: H·(nope + rope + v) / 2 (DeepSeek-V3: 128·(192+128)/2 = 20,480),
    rounded down when odd."""
    d = mla_dims(model)
    if d is None:
        return model.num_heads * model.head_dim
    return d.heads * (d.qk + d.v) // 2
