"""Model architectures: ``ModelSpec`` parsed from a Hugging Face ``config.json`` dict.

Exact learnable-parameter counts by component. This module reads no files: the adapters
(``adapters/hub.py``) load the JSON and call ``parse_model_config``. The spec types live in
``core/models/spec.py`` and the per-family parsers in
``core/models/{decoders,legacy,encoders,seq2seq}.py``; everything public is re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from tuneplan.core.models.spec import (
    LayerSpec,
    Linear,
    LinearRole,
    MlpKind,
    ModelSpec,
    NormKind,
    ParameterCounts,
)
from tuneplan.errors import ModelConfigError

if TYPE_CHECKING:
    from tuneplan.core.models.config import ConfigReader

__all__ = [
    "MAX_TOTAL_PARAMS",
    "SUPPORTED_MODEL_TYPES",
    "LayerSpec",
    "Linear",
    "LinearRole",
    "MlpKind",
    "ModelSpec",
    "NormKind",
    "ParameterCounts",
    "count_parameters",
    "parse_model_config",
]

MAX_TOTAL_PARAMS = 10**14   # beyond this a config is a typo or hostile, not a model

_Parser = Callable[["ConfigReader", str, str], ModelSpec]


@cache
def _parsers() -> dict[str, _Parser]:
    """model_type -> parser; the parser modules load on the first parse (not on import: the
    CLI's start-up needs the spec types, not the parsers)."""
    from tuneplan.core.models.decoders import TRAITS, parse_deepseek_v3, parse_llama_like
    from tuneplan.core.models.deepseek_v2 import parse_deepseek_v2
    from tuneplan.core.models.encoders import parse_bert, parse_gemma3, parse_t5
    from tuneplan.core.models.legacy import (
        parse_bloom,
        parse_falcon,
        parse_gpt2,
        parse_gpt_bigcode,
        parse_gpt_neox,
        parse_opt,
        parse_phi,
        parse_stablelm,
        parse_starcoder2,
    )
    from tuneplan.core.models.remote import (
        parse_baichuan,
        parse_chatglm,
        parse_internlm2,
        parse_kimi_k2,
        parse_qwen1,
    )
    from tuneplan.core.models.seq2seq import parse_bart

    return {
        **dict.fromkeys(TRAITS, parse_llama_like),
        "gemma3": parse_gemma3,
        "deepseek_v3": parse_deepseek_v3,
        "deepseek_v2": parse_deepseek_v2,
        "gpt2": parse_gpt2,
        "gpt_neox": parse_gpt_neox,
        "opt": parse_opt,
        "bloom": parse_bloom,
        "falcon": parse_falcon,
        "phi": parse_phi,
        "stablelm": parse_stablelm,
        "gpt_bigcode": parse_gpt_bigcode,
        "starcoder2": parse_starcoder2,
        "t5": parse_t5,
        "mt5": parse_t5,
        "bert": parse_bert,
        "roberta": parse_bert,
        # remote-code families (their repositories' modeling code is never run)
        "qwen": parse_qwen1,
        "baichuan": parse_baichuan,
        "chatglm": parse_chatglm,
        "internlm2": parse_internlm2,
        "kimi_k2": parse_kimi_k2,
        "bart": parse_bart,
    }


def __getattr__(name: str) -> Any:
    if name == "SUPPORTED_MODEL_TYPES":  # tuple[str, ...]: every model_type with a parser
        return tuple(sorted(_parsers()))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# by_component prefix per LayerSpec.kind, and component name per linear role.
_PREFIX = {"decoder": "layers", "encoder": "encoder", "decoder-cross": "decoder",
           "vision": "vision/layers"}
_ROLE = {LinearRole.ATTENTION: "attention", LinearRole.MLP: "mlp",
         LinearRole.EXPERT: "experts", LinearRole.SHARED_EXPERT: "shared_experts",
         LinearRole.ROUTER: "router", LinearRole.CROSS_ATTENTION: "cross_attention"}


def parse_model_config(config: Mapping[str, Any], *, name: str) -> ModelSpec:
    """Build a ModelSpec from a config.json mapping.

    Missing optional keys take the transformers config-class defaults, each recorded in
    ``defaults_applied``. Raises ModelConfigError listing every problem found (missing keys,
    wrong types, out-of-range or inconsistent sizes, unsupported ``model_type``); it raises
    nothing else for any JSON-like input.
    """
    from tuneplan.core.models.config import ConfigReader, describe

    if not isinstance(config, Mapping):
        raise ModelConfigError(f"{name}: config must be a JSON object, got {describe(config)}",
                               problems=("config is not an object",))
    parsers = _parsers()
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in parsers:
        problem = ("missing 'model_type'" if model_type is None else
                   f"unsupported model_type {model_type[:40]!r}" if isinstance(model_type, str)
                   else f"model_type must be a string, got {describe(model_type)}")
        raise ModelConfigError(
            f"{name}: {problem}; supported: {', '.join(sorted(parsers))}",
            problems=(problem,))
    reader = ConfigReader(config, family=model_type)
    spec = parsers[model_type](reader, model_type, name)
    if not reader.problems:
        total = count_parameters(spec).total
        if total > MAX_TOTAL_PARAMS:
            reader.problems.append(f"total parameters {total:,} exceed {MAX_TOTAL_PARAMS:,}")
    if reader.problems:
        raise ModelConfigError(
            f"{name}: invalid {model_type} config: " + "; ".join(reader.problems),
            problems=tuple(reader.problems))
    return spec


def count_parameters(spec: ModelSpec) -> ParameterCounts:
    """Exact learnable parameter counts by component, total and active per token.

    Components (slash-keyed, zero entries dropped except ``lm_head``): ``embeddings``,
    ``<stack>/attention|cross_attention|mlp|experts|shared_experts|router|norms|<extra>`` with
    stack ``layers`` (decoder-only), ``encoder``/``decoder`` (T5) or ``vision/layers``,
    ``final_norm``, ``lm_head`` (0 when tied: counted once, in ``embeddings``) and the vision
    extras. Linear biases are counted inside their module and totalled in ``bias_params``.
    Active per token: routed experts count ``experts_per_token / num_experts`` of their
    parameters; everything else counts fully (equal to ``total`` for dense models).
    """
    parts: dict[str, int] = {"embeddings": spec.embedding_params}
    inactive = bias = 0
    for layer in (*spec.layers, *spec.vision_layers):
        prefix = _PREFIX.get(layer.kind, layer.kind)
        for linear in layer.linears:
            _add(parts, f"{prefix}/{_ROLE[linear.role]}", linear.params * layer.count)
            if linear.role is LinearRole.EXPERT and linear.copies > 0:
                idle = max(linear.copies - layer.experts_per_token, 0)
                inactive += linear.params // linear.copies * idle * layer.count
        _add(parts, f"{prefix}/norms", layer.norm_params * layer.count)
        for key, value in layer.extra_params.items():
            _add(parts, f"{prefix}/{key}", value * layer.count)
        bias += layer.bias_params * layer.count
    _add(parts, "final_norm", spec.final_norm_params)
    parts["lm_head"] = spec.head_params
    for key, value in spec.vision_extra_params.items():
        _add(parts, key, value)
    bias += spec.vocab_size if spec.head_bias else 0
    by_component = {k: v for k, v in parts.items() if v or k == "lm_head"}
    total = sum(by_component.values())
    return ParameterCounts(total=total, active_per_token=total - inactive,
                           by_component=by_component, bias_params=bias)


def _add(parts: dict[str, int], key: str, value: int) -> None:
    parts[key] = parts.get(key, 0) + value
