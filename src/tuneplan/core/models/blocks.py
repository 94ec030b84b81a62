"""Building blocks shared by the model parsers: core dimensions, linears, block grouping.

Pure helpers over ``ConfigReader``; no family-specific knowledge beyond the arguments given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tuneplan.core.models.config import (
    MAX_HEADS,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
    ConfigReader,
)
from tuneplan.core.models.spec import LayerSpec, Linear, LinearRole

ATTN = LinearRole.ATTENTION
MLP = LinearRole.MLP


@dataclass(frozen=True, slots=True, kw_only=True)
class Dims:
    """The house dimensions read from one config (placeholders where a key was bad)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    max_pos: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DimKeys:
    """Config key names (first present wins) and family defaults for the core dimensions."""

    hidden: tuple[str, ...] = ("hidden_size",)
    layers: tuple[str, ...] = ("num_hidden_layers",)
    heads: tuple[str, ...] = ("num_attention_heads",)
    kv_heads: tuple[str, ...] = ("num_key_value_heads",)
    head_dim: tuple[str, ...] = ("head_dim",)
    inter: tuple[str, ...] = ("intermediate_size",)
    vocab: tuple[str, ...] = ("vocab_size",)
    max_pos: tuple[str, ...] = ("max_position_embeddings",)
    kv_default: int | None = None        # None: equal to the number of heads (MHA)
    head_dim_default: int | None = None  # None: hidden // heads
    fallback: Mapping[str, int] | None = None  # defaults for otherwise required keys


def read_dims(r: ConfigReader, keys: DimKeys) -> Dims:
    """Read and cross-check hidden size, layers, heads, KV heads, head_dim, MLP width, vocab."""
    fb = keys.fallback or {}
    hidden = r.get_int(*keys.hidden, default=fb.get("hidden"))
    layers = r.get_int(*keys.layers, default=fb.get("layers"), hi=MAX_LAYERS)
    heads = r.get_int(*keys.heads, default=fb.get("heads"), hi=MAX_HEADS)
    kv_default = heads if keys.kv_default is None else keys.kv_default
    kv_why = "equal to num_attention_heads" if keys.kv_default is None else ""
    kv_heads = (r.get_int(*keys.kv_heads, default=kv_default, why=kv_why, hi=MAX_HEADS)
                if keys.kv_heads else heads)
    head_dim = _read_head_dim(r, keys, hidden, heads)
    inter = (r.get_int(*keys.inter, default=fb.get("inter"))
             if keys.inter else 0)   # 0: the caller derives it (gpt2 n_inner, bloom 4 x hidden)
    vocab = r.get_int(*keys.vocab, default=fb.get("vocab"), hi=MAX_VOCAB) if keys.vocab else 0
    max_pos = r.opt_int(*keys.max_pos, hi=MAX_POSITIONS) if keys.max_pos else None
    r.check(heads % kv_heads == 0, (keys.heads[0], keys.kv_heads[0] if keys.kv_heads else ""),
            f"{keys.kv_heads[0] if keys.kv_heads else 'kv heads'}={kv_heads} must divide "
            f"{keys.heads[0]}={heads}")
    return Dims(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                inter=inter, vocab=vocab, max_pos=max_pos)


def _read_head_dim(r: ConfigReader, keys: DimKeys, hidden: int, heads: int) -> int:
    if keys.head_dim and r.has(keys.head_dim[0]):
        return r.get_int(*keys.head_dim)
    if keys.head_dim_default is not None:
        r.default(keys.head_dim[0], keys.head_dim_default)
        return keys.head_dim_default
    r.check(hidden % heads == 0, (keys.hidden[0], keys.heads[0]),
            f"{keys.hidden[0]}={hidden} is not divisible by {keys.heads[0]}={heads} "
            "(and no head_dim is given)")
    head_dim = max(hidden // heads, 1)
    if keys.head_dim and r.ok(keys.hidden[0], keys.heads[0]):
        r.default(keys.head_dim[0], head_dim, "hidden_size // num_attention_heads")
    return head_dim


def lin(name: str, n_in: int, n_out: int, role: LinearRole = ATTN, *, bias: bool = False,
        copies: int = 1) -> Linear:
    """A Linear named as the Hugging Face module."""
    return Linear(name=name, in_features=n_in, out_features=n_out, bias=bias, role=role,
                  copies=copies)


def qkvo(d: Dims, *, qkv_bias: bool, o_bias: bool, names: tuple[str, ...] = (
        "q_proj", "k_proj", "v_proj", "o_proj")) -> tuple[Linear, ...]:
    """Separate Q, K, V and output projections with grouped KV heads."""
    q, k, v, o = names
    return (lin(q, d.hidden, d.heads * d.head_dim, bias=qkv_bias),
            lin(k, d.hidden, d.kv_heads * d.head_dim, bias=qkv_bias),
            lin(v, d.hidden, d.kv_heads * d.head_dim, bias=qkv_bias),
            lin(o, d.heads * d.head_dim, d.hidden, bias=o_bias))


def gated_mlp(hidden: int, inter: int, role: LinearRole = MLP, *, bias: bool = False
              ) -> tuple[Linear, ...]:
    """SwiGLU/GeGLU MLP: gate_proj and up_proj (hidden -> inter), down_proj (inter -> hidden)."""
    return (lin("gate_proj", hidden, inter, role, bias=bias),
            lin("up_proj", hidden, inter, role, bias=bias),
            lin("down_proj", inter, hidden, role, bias=bias))


def fused_experts(hidden: int, inter: int, experts: int, *, bias: bool = False
                  ) -> tuple[Linear, ...]:
    """Routed experts as transformers 5 stores them: 3-D ``gate_up_proj`` and ``down_proj``."""
    return (lin("gate_up_proj", hidden, 2 * inter, LinearRole.EXPERT, bias=bias, copies=experts),
            lin("down_proj", inter, hidden, LinearRole.EXPERT, bias=bias, copies=experts))


def group_blocks(blocks: Iterable[LayerSpec]) -> tuple[LayerSpec, ...]:
    """Merge runs of consecutive identical blocks (each given with count 1) into groups."""
    groups: list[LayerSpec] = []
    for block in blocks:
        last = groups[-1] if groups else None
        if last is not None and _same(last, block):
            groups[-1] = LayerSpec(kind=last.kind, count=last.count + block.count,
                                   linears=last.linears, norm_params=last.norm_params,
                                   extra_params=last.extra_params, num_experts=last.num_experts,
                                   experts_per_token=last.experts_per_token)
        else:
            groups.append(block)
    return tuple(groups)


def _same(a: LayerSpec, b: LayerSpec) -> bool:
    return (a.kind, a.linears, a.norm_params, dict(a.extra_params), a.num_experts,
            a.experts_per_token) == (b.kind, b.linears, b.norm_params, dict(b.extra_params),
                                     b.num_experts, b.experts_per_token)


def block(linears: tuple[Linear, ...], norm_params: int, *, kind: str = "decoder",
          count: int = 1, extra: Mapping[str, int] | None = None, experts: int = 0,
          top_k: int = 0) -> LayerSpec:
    """One LayerSpec (``count`` identical blocks)."""
    return LayerSpec(kind=kind, count=count, linears=linears, norm_params=norm_params,
                     extra_params=dict(extra or {}), num_experts=experts,
                     experts_per_token=top_k)


def read_dtype(r: ConfigReader) -> str | None:
    """The checkpoint's declared dtype (``torch_dtype`` or transformers 5's ``dtype``)."""
    _, value = r.raw("torch_dtype", "dtype")
    return value if isinstance(value, str) else None
