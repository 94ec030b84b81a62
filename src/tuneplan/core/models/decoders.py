"""Parsers for the Llama-style decoder families (RMSNorm, gated MLP, rotary positions).

llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, gemma3_text,
phi3, gpt_oss and deepseek_v3 (MLA). Each mirrors the transformers 5 module layout and config
defaults; nothing here reads files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneplan.core.models.blocks import (
    DimKeys,
    Dims,
    block,
    fused_experts,
    gated_mlp,
    group_blocks,
    lin,
    qkvo,
    read_dims,
    read_dtype,
)
from tuneplan.core.models.config import MAX_EXPERTS, ConfigReader
from tuneplan.core.models.spec import LayerSpec, Linear, LinearRole, MlpKind, ModelSpec, NormKind

ROUTER = LinearRole.ROUTER
SHARED = LinearRole.SHARED_EXPERT


@dataclass(frozen=True, slots=True, kw_only=True)
class Traits:
    """How one family departs from Llama: defaults, biases, norms, MoE flavour."""

    kv_default: int | None = None
    head_dim_default: int | None = None
    tie_default: bool = False
    norms_per_layer: int = 2                # RMSNorms of hidden_size per block
    qk_norm: bool = False                   # per-head q_norm/k_norm (head_dim weights each)
    qk_norm_full: bool = False              # OLMo 2: q_norm/k_norm over all heads' widths
    qkv_bias: str | bool = "attention_bias"  # a config key (default False) or a fixed value
    o_bias: str | bool = "attention_bias"
    mlp_bias: str | bool = False
    bias_default: bool = False              # default of the bias keys above when absent
    fused: bool = False                     # phi3: qkv_proj and gate_up_proj
    act_keys: tuple[str, ...] = ("hidden_act",)
    act_default: str = "silu"
    fallback: Mapping[str, int] = field(default_factory=dict)
    moe: str = ""                           # "", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss"
    note: str = ""


_GEMMA_ACT = ("hidden_activation", "hidden_act")
TRAITS: dict[str, Traits] = {
    "llama": Traits(mlp_bias="mlp_bias"),
    "mistral": Traits(kv_default=8, qkv_bias=False, o_bias=False),
    "mixtral": Traits(kv_default=8, qkv_bias=False, o_bias=False, moe="mixtral"),
    "qwen2": Traits(kv_default=32, qkv_bias=True, o_bias=False,
                    note="q_proj/k_proj/v_proj bias=True (Qwen2 always has Q/K/V biases)"),
    "qwen2_moe": Traits(kv_default=16, qkv_bias="qkv_bias", o_bias=False, bias_default=True,
                        moe="qwen2_moe"),
    "qwen3": Traits(kv_default=32, head_dim_default=128, qk_norm=True),
    "qwen3_moe": Traits(kv_default=4, qk_norm=True, moe="qwen3_moe"),
    "gemma": Traits(kv_default=16, head_dim_default=256, tie_default=True, act_keys=_GEMMA_ACT,
                    act_default="gelu_pytorch_tanh"),
    "gemma2": Traits(kv_default=4, head_dim_default=256, tie_default=True, norms_per_layer=4,
                     act_keys=_GEMMA_ACT, act_default="gelu_pytorch_tanh"),
    "gemma3_text": Traits(kv_default=4, head_dim_default=256, tie_default=True,
                          norms_per_layer=4, qk_norm=True, act_keys=_GEMMA_ACT,
                          act_default="gelu_pytorch_tanh",
                          fallback={"heads": 8, "vocab": 262_208, "hidden": 2304,
                                    "layers": 26, "inter": 9216}),
    "phi3": Traits(qkv_bias=False, o_bias=False, fused=True),
    # Llama layouts under other names (transformers 5.24 GraniteConfig / SmolLM3Config
    # defaults): Granite's embedding/residual/logit multipliers and SmolLM3's layers without
    # RoPE change no tensor.
    "granite": Traits(mlp_bias="mlp_bias"),
    "smollm3": Traits(kv_default=4, tie_default=True, mlp_bias="mlp_bias"),
    # OLMo 2 (modeling_olmo2.py): RMSNorm on the whole q and k projections, and its two block
    # norms after attention and after the MLP (post-norm; same count and width as pre-norm).
    "olmo2": Traits(qk_norm_full=True,
                    note="olmo2 normalises block outputs (post-norm); the memory model's "
                         "saved norm tensors are those of pre-norm blocks (same widths)"),
    "gpt_oss": Traits(kv_default=8, head_dim_default=64, bias_default=True, moe="gpt_oss"),
}


def _flag(r: ConfigReader, spec: str | bool, default: bool = False) -> bool:
    return spec if isinstance(spec, bool) else r.get_bool(spec, default=default)


def _attention(r: ConfigReader, t: Traits, d: Dims) -> tuple[Linear, ...]:
    qkv_bias = _flag(r, t.qkv_bias, t.bias_default)
    o_bias = qkv_bias if t.o_bias == t.qkv_bias else _flag(r, t.o_bias, t.bias_default)
    if not t.fused:
        return qkvo(d, qkv_bias=qkv_bias, o_bias=o_bias)
    qkv_out = (d.heads + 2 * d.kv_heads) * d.head_dim
    return (lin("qkv_proj", d.hidden, qkv_out, bias=qkv_bias),
            lin("o_proj", d.heads * d.head_dim, d.hidden, bias=o_bias))


def _dense_mlp(t: Traits, d: Dims, mlp_bias: bool) -> tuple[Linear, ...]:
    if t.fused:
        return (lin("gate_up_proj", d.hidden, 2 * d.inter, LinearRole.MLP),
                lin("down_proj", d.inter, d.hidden, LinearRole.MLP))
    return gated_mlp(d.hidden, d.inter, bias=mlp_bias)


@dataclass(frozen=True, slots=True)
class _Moe:
    experts: int
    top_k: int
    inter: int
    shared_inter: int = 0
    sparse_step: int = 1
    dense_layers: tuple[int, ...] = ()

    def is_moe(self, i: int) -> bool:
        return self.experts > 0 and i not in self.dense_layers and (i + 1) % self.sparse_step == 0


def _read_moe(r: ConfigReader, t: Traits, d: Dims) -> _Moe | None:
    if not t.moe:
        return None
    if t.moe in ("mixtral", "gpt_oss"):
        experts = r.get_int("num_local_experts", "num_experts",
                            default=8 if t.moe == "mixtral" else 128, hi=MAX_EXPERTS)
        top_k = r.get_int("num_experts_per_tok", "experts_per_token", default=2 if t.moe ==
                          "mixtral" else 4, hi=MAX_EXPERTS)
        moe = _Moe(experts, top_k, d.inter)
    else:
        qwen2 = t.moe == "qwen2_moe"
        experts = r.get_int("num_experts", default=60 if qwen2 else 128, lo=0, hi=MAX_EXPERTS)
        top_k = r.get_int("num_experts_per_tok", default=4 if qwen2 else 8, hi=MAX_EXPERTS)
        inter = r.get_int("moe_intermediate_size", default=1408 if qwen2 else 768)
        shared = r.get_int("shared_expert_intermediate_size", default=5632) if qwen2 else 0
        step = r.get_int("decoder_sparse_step", default=1, hi=10_000)
        moe = _Moe(experts, top_k, inter, shared, step, r.int_list("mlp_only_layers"))
    if moe.experts > 0:
        r.check(moe.top_k <= moe.experts, ("num_experts_per_tok",),
                f"num_experts_per_tok={moe.top_k} exceeds the number of experts {moe.experts}")
    return moe


def _moe_linears(t: Traits, d: Dims, m: _Moe) -> tuple[Linear, ...]:
    bias = t.moe == "gpt_oss"
    router = lin("router" if bias else "gate", d.hidden, m.experts, ROUTER, bias=bias)
    linears = (router, *fused_experts(d.hidden, m.inter, m.experts, bias=bias))
    if t.moe == "qwen2_moe":
        linears += (*gated_mlp(d.hidden, m.shared_inter, SHARED),
                    lin("shared_expert_gate", d.hidden, 1, ROUTER))
    return linears


def parse_llama_like(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """Parse any family in ``TRAITS``."""
    t = TRAITS[model_type]
    d = read_dims(r, DimKeys(kv_default=t.kv_default, head_dim_default=t.head_dim_default,
                             fallback=t.fallback))
    if t.note:
        r.defaults.append(t.note)
    attn = _attention(r, t, d)
    mlp_bias = _flag(r, t.mlp_bias)
    moe = _read_moe(r, t, d)
    norms = t.norms_per_layer * d.hidden + (2 * d.head_dim if t.qk_norm else 0) + (
        (d.heads + d.kv_heads) * d.head_dim if t.qk_norm_full else 0)
    extra = {"attention_sinks": d.heads} if t.moe == "gpt_oss" else {}
    dense = block(attn + _dense_mlp(t, d, mlp_bias), norms, extra=extra)
    sparse = dense if moe is None else block(attn + _moe_linears(t, d, moe), norms, extra=extra,
                                             experts=moe.experts, top_k=moe.top_k)
    blocks = [sparse if moe is not None and moe.is_moe(i) else dense for i in range(d.layers)]
    act = r.get_str(*t.act_keys, default=t.act_default)
    return finish(r, name=name, model_type=model_type, d=d, layers=group_blocks(blocks),
                  tie=r.get_bool("tie_word_embeddings", default=t.tie_default),
                  norm_kind=NormKind.RMSNORM, mlp_kind=MlpKind.GATED, act=act,
                  embedding_params=d.vocab * d.hidden, final_norm_params=d.hidden, moe=moe)


def finish(r: ConfigReader, *, name: str, model_type: str, d: Dims,
           layers: tuple[LayerSpec, ...], tie: bool, norm_kind: NormKind, mlp_kind: MlpKind,
           act: str, embedding_params: int, final_norm_params: int, moe: _Moe | None = None,
           **more: Any) -> ModelSpec:
    """Assemble the ModelSpec from parsed parts (common fields read here)."""
    sliding = r.opt_int("sliding_window", hi=10**12)
    if moe is None or moe.experts == 0:
        moe = _Moe(experts=0, top_k=0, inter=0)
    return ModelSpec(
        name=name, model_type=model_type, hidden_size=d.hidden, num_layers=d.layers,
        num_heads=d.heads, num_kv_heads=d.kv_heads, head_dim=d.head_dim,
        intermediate_size=d.inter, vocab_size=d.vocab, max_position_embeddings=d.max_pos,
        tie_word_embeddings=tie, norm_kind=norm_kind, mlp_kind=mlp_kind, hidden_act=act,
        layers=layers, embedding_params=embedding_params, final_norm_params=final_norm_params,
        num_experts=moe.experts, num_experts_per_token=moe.top_k, moe_intermediate_size=moe.inter,
        sliding_window=sliding, torch_dtype=read_dtype(r), defaults_applied=tuple(r.defaults),
        **more)


def _mla(r: ConfigReader, d: Dims) -> tuple[tuple[Linear, ...], int, dict[str, Any]]:
    """Multi-head latent attention linears, its extra norm weights, and its ranks."""
    q_rank = r.opt_int("q_lora_rank")
    kv_rank = r.get_int("kv_lora_rank", default=512)
    nope = r.get_int("qk_nope_head_dim", default=128)
    rope = r.get_int("qk_rope_head_dim", default=64)
    v_dim = r.get_int("v_head_dim", default=128)
    bias = r.get_bool("attention_bias", default=False)
    qk = nope + rope
    if q_rank is None:
        q: tuple[Linear, ...] = (lin("q_proj", d.hidden, d.heads * qk),)
    else:
        q = (lin("q_a_proj", d.hidden, q_rank, bias=bias),
             lin("q_b_proj", q_rank, d.heads * qk))
    attn = (*q, lin("kv_a_proj_with_mqa", d.hidden, kv_rank + rope, bias=bias),
            lin("kv_b_proj", kv_rank, d.heads * (nope + v_dim)),
            lin("o_proj", d.heads * v_dim, d.hidden, bias=bias))
    ranks = {"q_lora_rank": q_rank, "kv_lora_rank": kv_rank, "qk_nope_head_dim": nope,
             "qk_rope_head_dim": rope, "v_head_dim": v_dim}
    return attn, kv_rank + (q_rank or 0), ranks   # q_a_layernorm, kv_a_layernorm


def parse_deepseek_v3(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """DeepSeek-V3: MLA attention, ``first_k_dense_replace`` dense blocks, then routed + shared
    experts. The multi-token-prediction layer is not part of the transformers model."""
    return deepseek_v3_spec(r, model_type, name, per_expert_linears=False, notes=(
        "multi-token-prediction layers (num_nextn_predict_layers) excluded: "
        "not part of the transformers model",
        "router e_score_correction_bias not counted: a buffer in transformers "
        "(extra['e_score_correction_bias_elements'])"))


def deepseek_v3_spec(r: ConfigReader, model_type: str, name: str, *, per_expert_linears: bool,
                     notes: tuple[str, ...]) -> ModelSpec:
    """The DeepSeek-V3 layout; routed experts fused (transformers 5: 3-D ``gate_up_proj`` and
    ``down_proj``) or, with ``per_expert_linears``, one ``gate_proj``/``up_proj``/``down_proj``
    nn.Linear per expert (the repository's own modeling code). Same parameter count."""
    d = read_dims(r, DimKeys(kv_default=128, head_dim=()))
    attn, mla_norms, ranks = _mla(r, d)
    d = dataclasses.replace(d, head_dim=ranks["qk_nope_head_dim"] + ranks["qk_rope_head_dim"])
    norms = 2 * d.hidden + mla_norms
    experts = r.get_int("n_routed_experts", default=256, hi=MAX_EXPERTS)
    shared = r.get_int("n_shared_experts", default=1, lo=0, hi=MAX_EXPERTS)
    top_k = r.get_int("num_experts_per_tok", default=8, hi=MAX_EXPERTS)
    moe_inter = r.get_int("moe_intermediate_size", default=2048)
    n_dense = min(r.get_int("first_k_dense_replace", default=3, lo=0, hi=10_000), d.layers)
    r.check(top_k <= experts, ("num_experts_per_tok", "n_routed_experts"),
            f"num_experts_per_tok={top_k} exceeds n_routed_experts={experts}")
    moe_linears = (lin("gate", d.hidden, experts, ROUTER),
                   *(per_expert(d.hidden, moe_inter, experts) if per_expert_linears
                     else fused_experts(d.hidden, moe_inter, experts)),
                   *(gated_mlp(d.hidden, moe_inter * shared, SHARED) if shared else ()))
    # The remote code's MoEGate holds e_score_correction_bias as an nn.Parameter: counted.
    bias_param = {"e_score_correction_bias": experts} if per_expert_linears else {}
    layers = tuple(g for g in (
        block(attn + gated_mlp(d.hidden, d.inter), norms, count=n_dense) if n_dense else None,
        block(attn + moe_linears, norms, count=d.layers - n_dense, experts=experts, top_k=top_k,
              extra=bias_param)
        if d.layers > n_dense else None) if g is not None)
    # e_score_correction_bias: a buffer in transformers (not learned by the optimizer), a
    # Parameter in DeepSeek's own modeling code: reported in ``extra``, not counted.
    # Group-limited routing (DeepseekV3TopkRouter): experts in n_group groups, topk_group kept.
    routing = {"n_group": r.get_int("n_group", default=8, hi=MAX_EXPERTS),
               "topk_group": r.get_int("topk_group", default=4, hi=MAX_EXPERTS),
               "norm_topk_prob": r.get_bool("norm_topk_prob", default=True, note=False)}
    extra = {**ranks, **routing, "first_k_dense_replace": n_dense,
             "e_score_correction_bias_elements": experts * (d.layers - n_dense)}
    return finish(r, name=name, model_type=model_type, d=d, layers=layers,
                  tie=r.get_bool("tie_word_embeddings", default=False), norm_kind=NormKind.RMSNORM,
                  mlp_kind=MlpKind.GATED, act=r.get_str("hidden_act", default="silu"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=d.hidden,
                  moe=_Moe(experts, top_k, moe_inter), num_shared_experts=shared, extra=extra,
                  per_expert_linears=per_expert_linears, notes=notes)


def per_expert(hidden: int, inter: int, experts: int) -> tuple[Linear, ...]:
    """Routed experts as a ModuleList of gated MLPs: ``gate_proj``/``up_proj`` (hidden ->
    inter) and ``down_proj`` (inter -> hidden), one nn.Linear each per expert."""
    return tuple(dataclasses.replace(x, role=LinearRole.EXPERT, copies=experts)
                 for x in gated_mlp(hidden, inter))
