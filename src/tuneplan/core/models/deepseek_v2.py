"""DeepSeek-V2 (and V2-Lite, DeepSeek-Coder-V2): MLA attention like DeepSeek-V3, a softmax
router (``topk_method`` greedy or group_limited_greedy), two shared experts by default and
optional MLP biases. Mirrors transformers 5.24 ``models/deepseek_v2`` (module layout and
DeepseekV2Config defaults); nothing here reads files.
"""

from __future__ import annotations

import dataclasses

from tuneplan.core.models.blocks import DimKeys, block, fused_experts, gated_mlp, lin, read_dims
from tuneplan.core.models.config import MAX_EXPERTS, ConfigReader
from tuneplan.core.models.decoders import _mla, _Moe, finish
from tuneplan.core.models.spec import LinearRole, MlpKind, ModelSpec, NormKind

TOPK_METHODS = ("greedy", "group_limited_greedy")


def parse_deepseek_v2(r: ConfigReader, model_type: str, name: str) -> ModelSpec:
    """``first_k_dense_replace`` dense blocks (default 0), then routed + shared experts; the
    router ``gate`` is a custom module with an fp32 weight (no bias), dense MLP and shared
    experts carry ``mlp_bias``. ``num_experts_per_tok`` has no usable default (None)."""
    d = read_dims(r, DimKeys(head_dim=()))          # KV heads default: the attention heads
    attn, mla_norms, ranks = _mla(r, d)
    d = dataclasses.replace(d, head_dim=ranks["qk_nope_head_dim"] + ranks["qk_rope_head_dim"])
    norms = 2 * d.hidden + mla_norms
    experts = r.get_int("n_routed_experts", default=64, hi=MAX_EXPERTS)
    shared = r.get_int("n_shared_experts", default=2, lo=0, hi=MAX_EXPERTS)
    top_k = r.get_int("num_experts_per_tok", hi=MAX_EXPERTS)
    moe_inter = r.get_int("moe_intermediate_size", default=1407)
    n_dense = min(r.get_int("first_k_dense_replace", default=0, lo=0, hi=10_000), d.layers)
    bias = r.get_bool("mlp_bias", default=False)
    method = r.get_str("topk_method", default="greedy")
    if method not in TOPK_METHODS:
        r.problem("topk_method", f"must be one of {', '.join(TOPK_METHODS)}, got {method[:30]!r}")
    r.check(top_k <= experts, ("num_experts_per_tok", "n_routed_experts"),
            f"num_experts_per_tok={top_k} exceeds n_routed_experts={experts}")
    grouped = method == "group_limited_greedy"
    groups = r.get_int("n_group", default=1, hi=MAX_EXPERTS) if grouped else 1
    kept = r.get_int("topk_group", default=1, hi=MAX_EXPERTS) if grouped else 1
    if grouped:
        r.check(experts % groups == 0 and kept <= groups, ("n_group", "topk_group"),
                f"n_routed_experts={experts} must split into n_group={groups} groups and "
                f"topk_group={kept} may not exceed them")
    moe_linears = (lin("gate", d.hidden, experts, LinearRole.ROUTER),
                   *fused_experts(d.hidden, moe_inter, experts),
                   *(gated_mlp(d.hidden, moe_inter * shared, LinearRole.SHARED_EXPERT, bias=bias)
                     if shared else ()))
    layers = tuple(g for g in (
        block(attn + gated_mlp(d.hidden, d.inter, bias=bias), norms, count=n_dense)
        if n_dense else None,
        block(attn + moe_linears, norms, count=d.layers - n_dense, experts=experts, top_k=top_k)
        if d.layers > n_dense else None) if g is not None)
    extra = {**ranks, "first_k_dense_replace": n_dense, "topk_method": method,
             "n_group": groups, "topk_group": kept, "norm_topk_prob": False}
    return finish(r, name=name, model_type=model_type, d=d, layers=layers,
                  tie=r.get_bool("tie_word_embeddings", default=False), norm_kind=NormKind.RMSNORM,
                  mlp_kind=MlpKind.GATED, act=r.get_str("hidden_act", default="silu"),
                  embedding_params=d.vocab * d.hidden, final_norm_params=d.hidden,
                  moe=_Moe(experts, top_k, moe_inter), num_shared_experts=shared, extra=extra)
