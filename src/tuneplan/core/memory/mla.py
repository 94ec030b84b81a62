"""Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2) and shared experts: what their
blocks save for backward, in bytes per token.

Read off the autograd graph of transformers 5.24 ``models/deepseek_v3/modeling_deepseek_v3.py``
(``DeepseekV3Attention``, ``DeepseekV3MoE``) and ``models/qwen2_moe/modeling_qwen2_moe.py``
(``Qwen2MoeSparseMoeBlock``), checked with ``torch.autograd.graph.saved_tensors_hooks`` on tiny
configs and held to the CPU simulation (``tests/core/memory/test_simulation_mla.py``).

MLA per block: ``q_a_proj`` (H -> q rank) and ``kv_a_proj_with_mqa`` (H -> kv rank + rope) read
the block's normed input; ``q_a_layernorm`` / ``kv_a_layernorm`` (RMSNorms of the ranks) feed
``q_b_proj`` / ``kv_b_proj``, so those two read latent inputs of their own. Attention runs on
``query = cat(q_nope, q_rope)`` and ``key`` (a new H·(nope+rope) tensor), with ``value`` a view
of ``kv_b_proj``'s whole H·(nope+v) output, which therefore stays saved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.core.job.strategy import Attention
from tuneplan.core.models import LayerSpec, LinearRole, ModelSpec
from tuneplan.core.models.latent import MlaDims, mla_dims, qkv_dims, rope_dim

if TYPE_CHECKING:
    from tuneplan.core.job.strategy import Strategy
    from tuneplan.core.memory.activations import Shape, Widths

__all__ = ["LATENT_GROUPS", "MlaDims", "mla_dims", "qkv_dims", "rope_dim"]

#: The latent projections and the group (saved input) each reads.
LATENT_GROUPS = {"q_b_proj": "q_lat_in", "kv_b_proj": "kv_lat_in"}


def latent_width(w: Widths) -> int:
    """Bytes per element of a latent RMSNorm's output: its weight times its input (a linear's
    output, ``w.mlp``), type-promoted (fp32 norm weights under autocast give fp32)."""
    return max(w.mlp, w.norm_weight)


def attention_saved(d: MlaDims, strategy: Strategy, w: Widths, shape: Shape) -> int:
    """Bytes one MLA block's attention saves, beyond its linears' inputs (``layer_inputs``).

    Latent norms: each saves its fp32 input (at fp32 compute ``kv_a_layernorm``'s input is a
    view of the whole kv_rank+rope output), rsqrt, and the normalized tensor if it trains.
    Eager: query, key, the value's contiguous copy (its batched matmul reshapes the strided
    view), fp32 softmax and its cast. SDPA/flash: query, key, value (a view keeping
    kv_b_proj's whole output), output and the fp32 logsumexp.
    """
    c, b = w.compute, shape.batch
    t_q, t_kv = b * shape.seq_q, b * shape.seq_kv
    x_in = w.mlp
    norms = 0
    for rank, tail in ((d.q_rank, 0), (d.kv_rank, d.rope)):
        if rank:
            fp32_in = (rank + tail) * 4 if x_in == 4 else rank * 4
            norms += t_q * (fp32_in + 4 + (rank * x_in if w.norm_trains else 0))
    q = k = d.heads * d.qk
    v_storage = d.heads * (d.nope + d.v)
    if strategy.attention is Attention.EAGER:
        scores = b * d.heads * shape.seq_q * shape.seq_kv
        cast = scores * c if c != 4 else 0
        return norms + t_q * q * c + t_kv * (k + d.heads * d.v) * c + scores * 4 + cast
    return norms + t_q * q * c + t_kv * (k + v_storage) * c + t_q * d.heads * d.v * c + \
        b * d.heads * shape.seq_q * 4


def output_is_copied(model: ModelSpec, strategy: Strategy) -> bool:
    """Whether ``o_proj`` reads a copy of the attention output (not a view of it).

    MLA's query is a ``torch.cat``, laid out (B, heads, S, D); flash kernels (CUDA flash and the
    CPU flash kernel, chosen when query, key and value share a head size) allocate their output
    in the query's layout, so transformers' ``transpose(1, 2).contiguous()`` copies it. With
    v_head_dim != qk_head_dim (DeepSeek-V3: 128 vs 192) CUDA SDPA runs the memory-efficient
    kernel, whose output is (B, S, heads, D): o_proj's input is then a view. Eager always copies.
    """
    d = mla_dims(model)
    if d is None or strategy.attention is Attention.EAGER:
        return strategy.attention is Attention.EAGER
    return d.v == d.qk


def shared_expert_saved(layer: LayerSpec, w: Widths, shape: Shape) -> int:
    """Shared experts: a gated MLP beside the routed experts (gate, act and up outputs,
    3·T·I_s·bytes); Qwen2-MoE's ``shared_expert_gate`` adds sigmoid(gate)·out, which keeps the
    T·H shared output and the T·1 sigmoid. Linear inputs are counted in ``layer_inputs``."""
    shared = [lin for lin in layer.linears if lin.role is LinearRole.SHARED_EXPERT]
    if not shared:
        return 0
    inter = next(lin.out_features for lin in shared if lin.name.endswith("gate_proj"))
    t, c = shape.tokens, w.mlp
    saved = 3 * t * inter * c
    gates = [lin for lin in layer.linears if lin.name.endswith("shared_expert_gate")]
    if gates:
        saved += t * shared[-1].out_features * c + t * gates[0].out_features * c
    return saved


#: Model types whose router computes in fp32 whatever the model's dtype: transformers 5.24
#: DeepseekV3TopkRouter and DeepseekV2TopkRouter do ``F.linear(hidden_states.type(
#: torch.float32), weight.float())`` (``_keep_in_fp32_modules_strict`` keeps ``gate.weight``
#: fp32). V3 picks experts by sigmoid scores, limited to ``topk_group`` of ``n_group`` groups
#: (top-2 sums per group); V2 by softmax scores, greedily or group-limited (group maxima).
FP32_ROUTER_TYPES = frozenset({"deepseek_v3", "deepseek_v2"})


def fp32_router_input_saved(model: ModelSpec, w: Widths) -> bool:
    """Whether a trained fp32 router saves its own fp32 copy of the block's normed input
    (instead of that very tensor): its input is cast unless it is fp32 already."""
    return model.model_type in FP32_ROUTER_TYPES and w.norm_out != 4


def group_router_saved(model: ModelSpec, layer: LayerSpec, w: Widths, shape: Shape,
                       router_trains: bool) -> int:
    """What DeepSeek's group-limited router and its grouped-matmul dispatch save beyond the
    generic router term (softmax/sigmoid scores T·E·4 and top-k weights T·k·4, ``mlp_saved``).

    Per token: the fp32 input copy H·4 when the router trains (and compute is not fp32); the
    per-group top-2 indices n_group·2·8, the kept groups topk_group·8, the expert mask E·1
    (bool), the top-k indices k·8 and, with ``norm_topk_prob``, the fp32 denominator 4. Per
    routed pair: three int64 permutation indices 3·8 and the fp32 routing weight 4 (transformers
    ``integrations/moe.py`` grouped_mm dispatch; seen with saved_tensors_hooks).
    """
    if model.model_type not in FP32_ROUTER_TYPES or not layer.num_experts:
        return 0
    t, e, k = shape.tokens, layer.num_experts, layer.experts_per_token
    groups = int(model.extra.get("n_group", 1))
    kept = int(model.extra.get("topk_group", 1))
    if model.model_type == "deepseek_v2":
        # greedy: the top-k indices; group_limited_greedy: also each group's max index, the
        # kept groups' indices and the expert mask (masked_fill)
        grouped = model.extra.get("topk_method") == "group_limited_greedy"
        selection = k * 8 + (groups * 8 + kept * 8 + e if grouped else 0)
    else:
        selection = groups * 2 * 8 + kept * 8 + e + k * 8 + (
            4 if model.extra.get("norm_topk_prob", True) else 0)
    per_token = selection + k * (3 * 8 + 4)
    if router_trains and fp32_router_input_saved(model, w):
        per_token += model.hidden_size * 4
    return t * per_token
