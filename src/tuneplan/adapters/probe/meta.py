"""The generic model path: a ModelSpec read off the real module tree that transformers builds.

For a config whose ``model_type`` tuneplan's own parsers (``core.models``) do not know but the
installed ``transformers`` does, the model is built on the meta device (shapes only, no
memory, no weights, never remote code), and every parameter's shape and module is read:
``nn.Linear`` (and transformers' ``Conv1D``) modules inside the repeated blocks become the
spec's linears, named by their path in the block (``attn.c_attn``, ``self_attn.q_proj``) so
adapter targets match PEFT's; normalisation modules become norm parameters; 3-D parameters
become routed experts; everything else learnable is kept by name (``extra_params``). The spec
counts exactly the learnable parameters of the built model (checked here, else refused).

What the module tree does not say (the order of norms, what attention saves) follows the
analytic pre-norm decoder model: the spec says so in ``notes`` and ``extra["structure"]``,
which every estimate built on it repeats. Needs the ``probe`` extra (torch + transformers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from tuneplan.core.models import (
    MAX_TOTAL_PARAMS,
    LayerSpec,
    Linear,
    LinearRole,
    MlpKind,
    ModelSpec,
    NormKind,
    count_parameters,
)
from tuneplan.core.models.blocks import group_blocks
from tuneplan.errors import ModelConfigError

#: ``ModelSpec.extra["structure"]`` of a spec made here (the analytic parsers set none).
META_STRUCTURE = "transformers-meta"

# Path segments that put a linear in the attention part of a block (transformers' names:
# self_attn (llama family), attn (gpt2, gpt_bigcode), attention (gpt_neox), self_attention).
_ATTENTION_SEGMENTS = frozenset({"self_attn", "attn", "attention", "self_attention"})
_SHARED_SEGMENTS = frozenset({"shared_expert", "shared_experts", "shared_mlp"})
_ROUTER_NAMES = frozenset({"gate", "router"})
_DROP_KEYS = ("torch_dtype", "dtype", "transformers_version", "quantization_config")
#: Most blocks a config may ask the generic path to build. The deepest bundled decoder has 126
#: (Llama-3.1-405B); building the module tree costs time per block even on the meta device,
#: so a bound of 1,000 (about 8x the deepest real model) keeps a hostile config from stalling.
MAX_META_LAYERS = 1_000


def spec_from_transformers(config: Mapping[str, Any], *, name: str) -> ModelSpec:
    """The ModelSpec of ``config`` as transformers builds it on the meta device.

    Raises ModelConfigError (one line) when the probe extra is missing, transformers does not
    know the ``model_type`` (remote code is never run), it has no causal-LM class for it, the
    build fails, or the module tree is not one of repeated blocks.
    """
    text = json.dumps(dict(config), sort_keys=True, default=str)
    return _spec_cached(text, name)


@lru_cache(maxsize=32)
def _spec_cached(text: str, name: str) -> ModelSpec:
    return _build(json.loads(text), name)


def transformers_knows(model_type: str) -> bool:
    """True when the installed transformers has a config class for ``model_type``."""
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return False
    return model_type in CONFIG_MAPPING


def _build(config: dict[str, Any], name: str) -> ModelSpec:
    model_type = str(config.get("model_type", ""))
    try:
        import torch
        import transformers
        from transformers import CONFIG_MAPPING, AutoModelForCausalLM
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError as exc:
        raise ModelConfigError(
            f"{name}: model_type {model_type!r} is read from the module tree transformers "
            "builds, which needs the probe extra (pip install 'tuneplan[probe]')") from exc
    version = transformers.__version__
    if model_type not in CONFIG_MAPPING:
        remote = " and its config asks for remote code (auto_map), which tuneplan never runs" \
            if "auto_map" in config else ""
        raise ModelConfigError(
            f"{name}: unsupported model_type {model_type[:40]!r}: neither tuneplan's models nor "
            f"transformers {version} know it{remote}")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelConfigError(
            f"{name}: transformers {version} has no causal-LM class for model_type "
            f"{model_type!r}; only decoders are read from their module tree")
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        layers = config.get(key)
        if isinstance(layers, int) and not 0 < layers <= MAX_META_LAYERS:
            raise ModelConfigError(f"{name}: {key}={layers} is not read from a module tree "
                                   f"(1 to {MAX_META_LAYERS:,} blocks)")
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)   # its config warnings would print each time
    try:
        hf = CONFIG_MAPPING[model_type].from_dict(
            {k: v for k, v in config.items() if k not in _DROP_KEYS})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf)  # type: ignore[no-untyped-call]
    except Exception as exc:  # the library's own validation of the config, in one line
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise ModelConfigError(f"{name}: transformers {version} cannot build this "
                               f"{model_type} config: {first}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    return _read_tree(model, hf, config, name=name, model_type=model_type, version=version)


def _read_tree(model: Any, hf: Any, config: Mapping[str, Any], *, name: str, model_type: str,
               version: str) -> ModelSpec:
    from torch import nn

    blocks_name, blocks = _block_list(model, nn)
    if blocks is None:
        raise ModelConfigError(f"{name}: no list of repeated blocks found in "
                               f"{type(model).__name__}; its structure cannot be read")
    hidden = _attr(hf, "hidden_size", "n_embd", "d_model")
    if hidden is None:
        raise ModelConfigError(f"{name}: the {model_type} config has no hidden size")
    experts = _attr(hf, "num_local_experts", "num_experts", "n_routed_experts") or 0
    top_k = _attr(hf, "num_experts_per_tok", "num_experts_per_token", "moe_topk") or 0
    specs = [_block_spec(block, nn, experts=experts, top_k=top_k) for block in blocks]
    in_blocks = {id(p) for block in blocks for p in block.parameters()}
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    embedding_params = final_norm = head_params = 0
    head_bias = False
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in in_blocks or id(param) in seen:
                continue
            seen.add(id(param))
            if head is not None and module is head:
                if param_name == "bias":
                    head_bias = True
                head_params += param.numel()
            elif _is_norm(module) and not module_name.startswith(blocks_name):
                final_norm += param.numel()
            else:   # token and position embeddings, an embedding norm, anything else outside
                embedding_params += param.numel()
    layers = group_blocks(specs)
    first = specs[0]
    attn = [lin for lin in first.linears if lin.role is LinearRole.ATTENTION]
    state_space = not attn or any(
        not any(lin.role is LinearRole.ATTENTION for lin in s.linears) for s in specs)
    heads = _attr(hf, "num_attention_heads", "n_head") or 0
    head_dim = _attr(hf, "head_dim") or (hidden // heads if heads else hidden)
    kv_heads = _kv_heads(hf, attn, heads, head_dim, hidden)
    inter = _intermediate(first, hidden) or _attr(hf, "intermediate_size", "n_inner") or 4 * hidden
    norm_kind = _norm_kind(blocks[0], nn)
    mlp_names = {lin.name.rsplit(".", 1)[-1] for lin in first.linears
                 if lin.role in (LinearRole.MLP, LinearRole.EXPERT)}
    gated = any("gate" in n for n in mlp_names) or {"w1", "w3"} <= mlp_names or any(
        lin.role is LinearRole.MLP and lin.out_features == 2 * inter for lin in first.linears)
    vocab = _attr(hf, "vocab_size") or (embed.weight.shape[0] if embed is not None else 0)
    max_pos = _attr(hf, "max_position_embeddings", "n_positions")
    head_weight = 0 if tied or head is None else vocab * hidden
    why = ("state-space (mixer) blocks, whose scan activations are not modelled"
           if state_space else
           "attention and norm order follow the analytic pre-norm decoder model")
    spec = ModelSpec(
        name=name, model_type=model_type, hidden_size=hidden, num_layers=len(blocks),
        num_heads=max(heads, 1), num_kv_heads=max(kv_heads, 1), head_dim=max(head_dim, 1),
        intermediate_size=inter, vocab_size=vocab,
        max_position_embeddings=max_pos if isinstance(max_pos, int) else None,
        tie_word_embeddings=tied or head is None, norm_kind=norm_kind,
        mlp_kind=MlpKind.GATED if gated else MlpKind.PLAIN,
        hidden_act=str(_attr(hf, "hidden_act", "activation_function", "hidden_activation")
                       or "unknown"),
        layers=layers, embedding_params=embedding_params, final_norm_params=final_norm,
        head_bias=head_bias, num_experts=experts if any(s.num_experts for s in specs) else 0,
        num_experts_per_token=top_k if any(s.num_experts for s in specs) else 0,
        moe_intermediate_size=_attr(hf, "moe_intermediate_size") or 0,
        sliding_window=_attr(hf, "sliding_window"),
        torch_dtype=_dtype(config),
        head_extra_params=head_params - head_weight - (vocab if head_bias else 0),
        extra={"structure": META_STRUCTURE, "transformers_version": version,
               "model_class": type(model).__name__, "state_space": state_space,
               "confidence": "low" if state_space else "medium"},
        notes=(f"structure read from transformers {version} {type(model).__name__} built on "
               f"the meta device (model_type {model_type!r} has no analytic parser): exact "
               f"parameter shapes; memory confidence "
               f"{'low' if state_space else 'medium'}: {why}",))
    total = count_parameters(spec).total
    built = sum(p.numel() for p in model.parameters())
    if total != built or total > MAX_TOTAL_PARAMS:
        raise ModelConfigError(
            f"{name}: the module tree of {type(model).__name__} could not be read exactly "
            f"({total:,} of {built:,} parameters placed)")
    return spec


def _attr(hf: Any, *names: str) -> Any:
    for key in names:
        value = getattr(hf, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _block_list(model: Any, nn: Any) -> tuple[str, Any]:
    """The ``nn.ModuleList`` holding most parameters: the repeated blocks."""
    best: tuple[int, str, Any] = (0, "", None)
    for module_name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            size = sum(p.numel() for p in module.parameters())
            if size > best[0]:
                best = (size, module_name, module)
    return best[1] + ".", best[2]


def _is_norm(module: Any) -> bool:
    return "norm" in type(module).__name__.lower()


def _role(path: str, module: Any, nn: Any) -> LinearRole | None:
    segments = path.split(".")
    short = segments[-1]
    if _SHARED_SEGMENTS.intersection(segments):
        return LinearRole.ROUTER if "gate" in short and not isinstance(module, nn.Linear) \
            else LinearRole.SHARED_EXPERT
    if (short in _ROUTER_NAMES and "mlp" in segments) or short == "router":
        return LinearRole.ROUTER
    if _ATTENTION_SEGMENTS.intersection(segments):
        return LinearRole.ATTENTION
    return LinearRole.MLP


def _block_spec(block: Any, nn: Any, *, experts: int, top_k: int) -> LayerSpec:
    """One block's linears (every nn.Linear / Conv1D), norms and other parameters."""
    from transformers.pytorch_utils import Conv1D

    linears: list[Linear] = []
    norms = 0
    extra: dict[str, int] = {}
    placed: set[int] = set()
    for path, module in block.named_modules():
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        weight = own.get("weight")
        bias = own.get("bias")
        if isinstance(module, nn.Linear | Conv1D) and weight is not None:
            n_out, n_in = weight.shape if isinstance(module, nn.Linear) else weight.shape[::-1]
            role = _role(path, module, nn)
            linears.append(Linear(name=path, in_features=int(n_in), out_features=int(n_out),
                                  bias=bias is not None, role=role or LinearRole.MLP))
            placed.update({id(weight), id(bias)} - {id(None)})
        elif _is_norm(module):
            norms += sum(p.numel() for p in own.values())
            placed.update(id(p) for p in own.values())
        for param_name, param in own.items():
            if id(param) in placed:
                continue
            full = f"{path}.{param_name}" if path else param_name
            conv = isinstance(module, nn.modules.conv._ConvNd)
            if param.dim() == 3 and not conv:  # stacked experts: (experts, out, in)
                copies, a, b = (int(x) for x in param.shape)
                linears.append(Linear(name=full, in_features=b, out_features=a, bias=False,
                                      role=LinearRole.EXPERT, copies=copies))
            elif param.dim() == 2 and param_name == "weight" and module_name_is_router(path):
                linears.append(Linear(name=path, in_features=int(param.shape[1]),
                                      out_features=int(param.shape[0]), bias=False,
                                      role=LinearRole.ROUTER))
            else:
                extra[full] = extra.get(full, 0) + param.numel()
            placed.add(id(param))
    moe = any(lin.role is LinearRole.EXPERT for lin in linears)
    return LayerSpec(kind="decoder", count=1, linears=tuple(linears), norm_params=norms,
                     extra_params=extra, num_experts=experts if moe else 0,
                     experts_per_token=top_k if moe else 0)


def module_name_is_router(path: str) -> bool:
    """A custom router module (transformers 5 keeps a bare ``weight`` on ``mlp.gate``)."""
    return path.rsplit(".", 1)[-1] in _ROUTER_NAMES


def _kv_heads(hf: Any, attn: list[Linear], heads: int, head_dim: int, hidden: int) -> int:
    kv = _attr(hf, "num_key_value_heads", "n_head_kv", "num_kv_heads")
    if kv:
        return int(kv)
    if getattr(hf, "multi_query", False):
        return 1
    fused = [lin for lin in attn if lin.in_features == hidden
             and lin.out_features > heads * head_dim]
    if fused and head_dim and heads:   # one q+k+v linear: (heads + 2 kv) * head_dim outputs
        return max((fused[0].out_features // head_dim - heads) // 2, 1)
    return heads


def _intermediate(block: LayerSpec, hidden: int) -> int:
    """The MLP width: the input of the MLP linear that returns to the hidden size."""
    downs = [lin.in_features for lin in block.linears
             if lin.role is LinearRole.MLP and lin.out_features == hidden
             and lin.in_features != hidden]
    return max(downs) if downs else 0


def _norm_kind(block: Any, nn: Any) -> NormKind:
    for module in block.modules():
        if _is_norm(module):
            if "rms" in type(module).__name__.lower():
                return NormKind.RMSNORM
            has_bias = getattr(module, "bias", None) is not None
            return NormKind.LAYERNORM if has_bias else NormKind.LAYERNORM_NOBIAS
    return NormKind.RMSNORM


def _dtype(config: Mapping[str, Any]) -> str | None:
    value = config.get("torch_dtype", config.get("dtype"))
    return value if isinstance(value, str) else None
