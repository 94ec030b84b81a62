"""Remote-code families mapped onto the analytic decoder (``core/models/remote.py``): the
module names and shapes their modeling code has, so adapter targets are their real names.
Pure: their code is never run, and transformers cannot build them without it."""

from __future__ import annotations

from tuneplan.adapters.hub import resolve_model
from tuneplan.core.job.methods import Method, count_trainable
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.models import Linear, ModelSpec, count_parameters


def _linears(spec: ModelSpec) -> dict[str, Linear]:
    # names are unique per block except Qwen-1's two c_proj (attention and MLP): keep the first
    out: dict[str, Linear] = {}
    for lin in spec.layers[0].linears:
        out.setdefault(lin.name, lin)
    return out


def _lora(targets: str, rank: int = 8) -> Strategy:
    return Strategy(method=Method.LORA, lora_targets=tuple(targets.split(",")), lora_rank=rank)


def test_qwen1_fused_c_attn_and_half_width_mlp() -> None:
    spec = resolve_model("Qwen/Qwen-7B")
    lins = _linears(spec)
    assert (lins["c_attn"].out_features, lins["c_attn"].bias) == (3 * 4096, True)
    assert lins["w1"].out_features == lins["w2"].out_features == 22016 // 2
    assert spec.intermediate_size == 11008 and not spec.tie_word_embeddings
    # LoRA on c_attn: r x (4096 + 12288) per layer
    assert count_trainable(spec, _lora("c_attn")).adapter_params == 32 * 8 * (4096 + 12288)


def test_baichuan2_w_pack() -> None:
    spec = resolve_model("baichuan-inc/Baichuan2-7B-Base")
    lins = _linears(spec)
    assert (lins["W_pack"].out_features, lins["W_pack"].bias) == (3 * 4096, False)
    assert count_trainable(spec, _lora("W_pack")).adapter_params == 32 * 8 * (4096 + 12288)


def test_chatglm3_multi_query_groups_and_split_names_map_to_query_key_value() -> None:
    spec = resolve_model("THUDM/chatglm3-6b")
    lins = _linears(spec)
    assert spec.num_kv_heads == 2 and spec.head_dim == 128 and spec.num_layers == 28
    assert (lins["query_key_value"].out_features, lins["query_key_value"].bias) == (
        4096 + 2 * 2 * 128, True)
    assert lins["dense_h_to_4h"].out_features == 2 * 13696
    qkv = 28 * 8 * (4096 + 4608)
    assert count_trainable(spec, _lora("query_key_value")).adapter_params == qkv
    # PEFT's default target for chatglm is query_key_value; split names wrap it whole
    assert count_trainable(spec, _lora("q_proj,v_proj")).adapter_params == qkv


def test_internlm2_wqkv_with_gqa() -> None:
    spec = resolve_model("internlm/internlm2_5-7b-chat")
    lins = _linears(spec)
    assert lins["wqkv"].out_features == (32 + 2 * 8) * 128 and not lins["wqkv"].bias
    assert {"wo", "w1", "w2", "w3"} <= set(lins)
    assert count_parameters(spec).total == 7_737_708_544
