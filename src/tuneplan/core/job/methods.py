"""Fine-tuning methods: which parameters train, and how many, for a model and a strategy.

Counts follow what PEFT builds (``peft`` 0.21): LoRA ``r·(in+out)`` per targeted linear,
DoRA adds an ``out``-sized magnitude, IA3 one vector per target, prefix tuning one
``P × layers·2·kv_dim`` embedding, prompt tuning ``P × hidden``. No memory maths here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from tuneplan.core.models import LayerSpec, Linear, LinearRole, ModelSpec
from tuneplan.errors import UnsupportedError

if TYPE_CHECKING:
    from tuneplan.core.job.strategy import Strategy


class Method(StrEnum):
    FULL = "full"
    FREEZE = "freeze"
    LISA = "lisa"          # layerwise importance sampling: K random blocks train at a time
    LORA = "lora"
    DORA = "dora"
    QLORA = "qlora"
    LORA8BIT = "lora8bit"
    PREFIX = "prefix"
    PROMPT = "prompt"
    P_TUNING = "p-tuning"
    IA3 = "ia3"
    ADAPTER = "adapter"
    LLAMA_ADAPTER = "llama-adapter"
    VERA = "vera"
    ADALORA = "adalora"
    LOHA = "loha"
    LOKR = "lokr"
    OFT = "oft"
    BOFT = "boft"
    LORA_FA = "lora-fa"
    LAYERNORM = "layernorm"
    # peft's newer tuners (core/job/tuners.py models them)
    FOURIERFT = "fourierft"
    HRA = "hra"
    MISS = "miss"
    SHIRA = "shira"
    ROAD = "road"
    RANDLORA = "randlora"
    C3A = "c3a"
    AUTO = "auto"

    @property
    def is_lora(self) -> bool:
        return self in (Method.LORA, Method.DORA, Method.QLORA, Method.LORA8BIT)

    @property
    def trains_base(self) -> bool:
        return self in (Method.FULL, Method.FREEZE, Method.LISA)

    @property
    def is_prompt_learning(self) -> bool:
        return self in (Method.PREFIX, Method.PROMPT)

    @property
    def is_low_rank(self) -> bool:
        """Adapters on the targeted linears (the LoRA family and PEFT's other weight adapters:
        AdaLoRA, LoHa, LoKr, VeRA, LoRA-FA, OFT, BOFT and the newer per-linear tuners): the
        speed model's adapter FLOPs."""
        return self in _LOW_RANK

    @property
    def adds_virtual_tokens(self) -> bool:
        """Prompt tuning and P-tuning prepend ``num_virtual_tokens`` positions to every input."""
        return self in (Method.PROMPT, Method.P_TUNING)

    @property
    def uses_rank(self) -> bool:
        """Whether ``--lora-rank`` sets this method's rank (``tuners.RANK_FIELD``)."""
        return self.is_lora or self in _RANKED


_LOW_RANK = frozenset({Method.LORA, Method.DORA, Method.QLORA, Method.LORA8BIT, Method.ADALORA,
                       Method.LOHA, Method.LOKR, Method.VERA, Method.LORA_FA, Method.OFT,
                       Method.BOFT, Method.FOURIERFT, Method.HRA, Method.MISS, Method.SHIRA,
                       Method.ROAD, Method.RANDLORA, Method.C3A})
# the same set as tuners.RANK_FIELD's keys (a test holds them equal; no import cycle)
_RANKED = frozenset({Method.ADALORA, Method.LOHA, Method.LOKR, Method.VERA, Method.HRA,
                     Method.MISS, Method.SHIRA, Method.RANDLORA, Method.LORA_FA})


#: Methods modelled in core/job/tuners.py (PEFT's other tuners).
_TUNERS = frozenset({Method.ADALORA, Method.LOHA, Method.LOKR, Method.VERA, Method.OFT,
                     Method.BOFT, Method.HRA, Method.FOURIERFT, Method.MISS, Method.SHIRA,
                     Method.ROAD, Method.RANDLORA, Method.C3A, Method.LORA_FA,
                     Method.LAYERNORM, Method.P_TUNING, Method.LLAMA_ADAPTER})


class Quant(StrEnum):
    NF4 = "nf4"
    FP4 = "fp4"
    INT8 = "int8"
    GPTQ_INT4 = "gptq-int4"
    INT2 = "int2"


ESTIMATED_METHODS = frozenset({Method.FULL, Method.FREEZE, Method.LISA, Method.LORA, Method.DORA,
                               Method.QLORA, Method.LORA8BIT, Method.PREFIX, Method.PROMPT,
                               Method.IA3}) | _TUNERS
ESTIMATED_QUANTS = frozenset({Quant.NF4, Quant.FP4, Quant.INT8, Quant.GPTQ_INT4})
# PEFT's IA3 feed-forward modules scale their *input* (vector of in_features), see
# peft/utils/constants.py TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING.
IA3_FEEDFORWARD = frozenset({"down_proj", "w2", "fc2", "dense_4h_to_h", "fc_out", "c_proj"})
EMBED_NAMES = frozenset({"embed_tokens", "wte", "word_embeddings", "embed_in"})
HEAD_NAMES = frozenset({"lm_head", "embed_out", "score"})


def effective_quant(strategy: Strategy) -> Quant | None:
    """The base-weight format: int8 for ``lora8bit``, ``--quant`` for ``qlora``, else None."""
    if strategy.method is Method.LORA8BIT:
        return Quant.INT8
    return strategy.quant if strategy.method is Method.QLORA else None


def context_problem(model: ModelSpec, strategy: Strategy) -> str | None:
    """Why ``--seq-len`` cannot be estimated on ``model`` (beyond its trained context and no
    ``--allow-long-context``), for the memory and the speed model alike; None when it can."""
    limit = model.max_position_embeddings
    if limit and strategy.seq_len > limit and not strategy.allow_long_context:
        return (f"--seq-len {strategy.seq_len} exceeds {model.name}'s limit of {limit}; "
                "pass --allow-long-context if the model is extended (RoPE scaling)")
    return None


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _matches(linear: Linear, targets: Iterable[str]) -> bool:
    return any(t in (linear.name, _short(linear.name)) for t in targets)


# Model types whose MoE weights transformers 5 converts from v4 checkpoints (its
# ``_MODEL_TO_CONVERSION_PATTERN`` → "mixtral"/"qwen2_moe"); for these peft 0.21 re-targets a
# LoRA "all-linear" config by the v4 names (``_convert_peft_config_moe``): the router ``gate`` and
# the fused experts become ``target_parameters`` (``gate_up_proj`` at rank 2r, alpha 2α), and the
# v4 expert names (gate_proj/up_proj/down_proj, w1/w2/w3) leave ``target_modules``, so dense MLPs
# and shared experts so named get no adapter. Checked on tiny mixtral/qwen3_moe/deepseek_v3.
PEFT_MOE_CONVERTED = frozenset({
    "mixtral", "minimax", "minimax_m2", "qwen3_moe", "qwen3_next", "qwen3_omni_moe_text",
    "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe", "glm4_moe",
    "glm4_moe_lite", "hunyuan_v1_moe", "flex_olmo", "olmoe", "exaone_moe", "cohere2_moe",
    "longcat_flash", "afmoe", "solar_open", "mellum", "sarvam_mla"})
_V4_EXPERT_NAMES = frozenset({"gate", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"})
# transformers 5 routers are custom modules (a ``weight`` parameter, no nn.Linear).
_ROUTER_MODULES = frozenset({"gate", "router"})
ROUTER_MODULES = _ROUTER_MODULES


#: The fused attention linear of GPT-NeoX (and StableLM-alpha, Pythia), BLOOM and Falcon: PEFT
#: 0.21's default LoRA target for those types (its
#: ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``).
FUSED_QKV = "query_key_value"
#: Names of split query/key/value projections in other families. PEFT matches ``target_modules``
#: by module-name suffix, so on a fused model these find nothing and ``get_peft_model`` raises
#: "Target modules ... not found"; there the one linear that holds q, k and v is the target.
SPLIT_QKV_NAMES = frozenset({"q_proj", "k_proj", "v_proj", "query", "key", "value"})


def _linear_names(model: ModelSpec) -> frozenset[str]:
    return frozenset(n for layer in model.layers for lin in layer.linears
                     for n in (lin.name, _short(lin.name)))


def peft_lora_targets(model: ModelSpec, strategy: Strategy) -> tuple[str, ...]:
    """The ``target_modules`` PEFT must be given for ``strategy.lora_targets`` on ``model``.

    Unchanged, except on a model with a fused ``query_key_value`` and no split projections:
    there q_proj / k_proj / v_proj (or query / key / value) that match no linear become
    ``query_key_value`` (once), the module PEFT itself targets by default for these types.
    """
    targets = strategy.lora_targets
    if strategy.all_linear:
        return targets
    names = _linear_names(model)
    if FUSED_QKV not in names:
        return targets
    out: list[str] = []
    for t in targets:
        mapped = FUSED_QKV if t in SPLIT_QKV_NAMES and t not in names else t
        if mapped not in out:
            out.append(mapped)
    return tuple(out)


def fused_qkv_note(model: ModelSpec, strategy: Strategy) -> str | None:
    """Why the adapter targets differ from ``--lora-targets`` (None when they do not)."""
    mapped = peft_lora_targets(model, strategy)
    if mapped == strategy.lora_targets:
        return None
    split = [t for t in strategy.lora_targets if t not in mapped]
    return (f"{model.name} has one fused {FUSED_QKV} linear for attention: --lora-targets "
            f"{','.join(split)} wrap it whole (PEFT's default target for this model type); "
            f"targets given to PEFT: {','.join(mapped)}")


def targeted_linears(model: ModelSpec, strategy: Strategy, layer: LayerSpec) -> tuple[Linear, ...]:
    """Linears of one block that carry an adapter (LoRA family and IA3).

    ``all-linear`` follows PEFT 0.21 on transformers 5: every ``nn.Linear`` except the output
    head; routed experts are fused 3-D parameters and routers custom modules, left out — except
    on ``PEFT_MOE_CONVERTED`` model types, where PEFT wraps the router and the experts instead
    of the v4-named MLP linears. Named targets go through ``peft_lora_targets`` (split q/k/v
    names on a fused ``query_key_value`` model wrap the fused linear).
    """
    if strategy.all_linear and model.model_type in PEFT_MOE_CONVERTED and model.num_experts:
        return tuple(lin for lin in layer.linears if lin.role in (
            LinearRole.EXPERT, LinearRole.ROUTER) or _short(lin.name) not in _V4_EXPERT_NAMES)
    if strategy.all_linear:   # per-expert nn.Linear experts (remote code) are wrapped too
        return tuple(lin for lin in layer.linears if (
            lin.role is not LinearRole.EXPERT or model.per_expert_linears) and not (
            lin.role is LinearRole.ROUTER and _short(lin.name) in _ROUTER_MODULES))
    return tuple(lin for lin in layer.linears if _matches(lin, peft_lora_targets(model, strategy)))


def outer_targets(model: ModelSpec, strategy: Strategy) -> tuple[Linear, ...]:
    """The output head and/or input embedding named in ``--lora-targets`` (``lm_head``,
    ``embed_tokens`` and their other families' names), as the maps PEFT 0.21 wraps there:
    ``lm_head`` is an ``nn.Linear`` (hidden -> vocab; lora.Linear: A r x H, B V x r) and the
    embedding a ``lora.Embedding`` (lora_embedding_A r x V, lora_embedding_B H x r), so both
    train r·(H + V). Tied embeddings change nothing: PEFT wraps the named module only (it
    warns that the tied twin is not adapted; checked on a tiny tied Llama, peft 0.21.2).
    ``all-linear`` never includes them (PEFT leaves the output layer out). Raises
    UnsupportedError where the estimate does not model the combination."""
    if strategy.all_linear or not (strategy.method.is_low_rank or strategy.method is Method.IA3):
        return ()
    head = [t for t in strategy.lora_targets if t in HEAD_NAMES]
    embed = [t for t in strategy.lora_targets if t in EMBED_NAMES]
    if not head and not embed:
        return ()
    named = ",".join(head + embed)
    if strategy.method is Method.IA3:
        raise UnsupportedError(f"--lora-targets {named}: IA3 on the head or embedding is not "
                               "estimated; name block linears only")
    if head and strategy.task.value != "causal-lm":  # Task (strategy.py imports this module)
        raise UnsupportedError(f"--lora-targets {','.join(head)}: a {strategy.task.value} "
                               "model has no vocabulary head (its head is a new `score` layer)")
    if embed and strategy.method is Method.DORA:
        raise UnsupportedError(f"--lora-targets {','.join(embed)}: DoRA on the embedding is "
                               "not estimated; use --method lora or drop it")
    both = [t for t in head + embed if t in strategy.trainable_modules or (
        t in HEAD_NAMES and any(m in HEAD_NAMES for m in strategy.trainable_modules)) or (
        t in EMBED_NAMES and any(m in EMBED_NAMES for m in strategy.trainable_modules))]
    if both:
        raise UnsupportedError(f"{','.join(both)} is in both --lora-targets and "
                               "--trainable-modules: a module is either adapted or trained in "
                               "full (PEFT modules_to_save), not both")
    out = []
    if head:
        out.append(Linear(name=head[0], in_features=model.hidden_size,
                          out_features=model.vocab_size, bias=False,
                          role=LinearRole.OUTPUT_HEAD))
    if embed:
        out.append(Linear(name=embed[0], in_features=model.vocab_size,
                          out_features=model.hidden_size, bias=False,
                          role=LinearRole.EMBEDDING))
    return tuple(out)


def outer_adapter_params(model: ModelSpec, strategy: Strategy, role: LinearRole) -> int:
    """Adapter parameters on the output head or the embedding (``outer_targets``)."""
    dora = strategy.method is Method.DORA
    return sum(strategy.lora_rank * (lin.in_features + lin.out_features)
               + (lin.out_features if dora else 0)
               for lin in outer_targets(model, strategy) if lin.role is role)


def expert_adapter_params(model: ModelSpec, strategy: Strategy) -> int:
    """LoRA parameters on stacked experts (lora.ParamWrapper: r·E·(in+out) each, 2r on gate_up)."""
    if not strategy.method.is_lora:
        return 0
    return sum(lora_rank_of(lin, strategy) * lin.copies * (lin.in_features + lin.out_features)
               * layer.count for layer in model.layers
               for lin in targeted_linears(model, strategy, layer)
               if lin.role is LinearRole.EXPERT)


def lora_rank_of(lin: Linear, strategy: Strategy) -> int:
    """PEFT's rank for ``lin``: doubled on fused gate+up experts (``rank_pattern``)."""
    fused = lin.role is LinearRole.EXPERT and _short(lin.name) == "gate_up_proj"
    return strategy.lora_rank * (2 if fused else 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Trainable:
    """Trainable parameters split by where they live.

    ``base_params`` are the model's own weights that train (full, freeze, modules_to_save copies);
    ``adapter_params`` are new adapter tensors; ``largest_tensor`` is the biggest single one.
    """

    base_params: int
    adapter_params: int
    largest_tensor: int
    matrices: tuple[tuple[int, int, int], ...] = ()   # (rows, cols, copies) of 2-D tensors
    #: elements of the token embedding's weight among the trained 2-D tensors (full, lisa:
    #: V·h, once when the head is tied to it; a ``modules_to_save`` or freeze-named
    #: embedding); 0 where it does not train
    embedding_matrix: int = 0
    #: the 2-D weights of ``--trainable-modules`` beside an adapter or a frozen base (PEFT's
    #: ``modules_to_save`` copies, freeze's named embedding/head): trained whole, so an
    #: optimizer sizes their states as any other matrix (8-bit, factored), but no adapter
    saved_matrices: tuple[tuple[int, int, int], ...] = ()

    @property
    def total(self) -> int:
        return self.base_params + self.adapter_params

    @property
    def state_matrices(self) -> tuple[tuple[int, int, int], ...]:
        """Every trained 2-D tensor, as an optimizer's state sees them."""
        return self.matrices + self.saved_matrices


#: Encoder-decoder model types whose blocks the memory model estimates (core/memory/seq2seq.py).
SEQ2SEQ_TYPES = frozenset({"t5", "mt5", "bart"})
#: transformers 5.24 configuration_t5.py / configuration_mt5.py set ``tie_word_embeddings =
#: True`` whatever the config says (T5's ``scale_decoder_outputs`` keeps the old meaning), so
#: ``T5ForConditionalGeneration`` ties ``lm_head`` to ``shared`` even for T5 v1.1 / T0 / mT0
#: checkpoints that store a separate head (checked on the meta device: bigscience/T0_3B builds
#: 2,783,959,040 parameters, its checkpoint holds 2,849,757,184).
HF_T5_FORCED_TIE = (5, 0)


def ties_head(model: ModelSpec, strategy: Strategy) -> bool:
    """The job's transformers ties ``model``'s head to its embedding whatever its config says."""
    return model.model_type in ("t5", "mt5") and strategy.stack.at_least(
        "transformers", HF_T5_FORCED_TIE)


def as_built(model: ModelSpec, strategy: Strategy) -> ModelSpec:
    """``model`` as the job's transformers builds it (a T5 head tied under transformers 5)."""
    if ties_head(model, strategy) and not model.tie_word_embeddings:
        return replace(model, tie_word_embeddings=True)
    return model


def count_trainable(model: ModelSpec, strategy: Strategy) -> Trainable:
    """Trainable parameters of ``strategy.method`` on ``model`` as the job's transformers
    builds it (``as_built``); raises UnsupportedError."""
    model = as_built(model, strategy)
    method = strategy.method
    if method not in ESTIMATED_METHODS:
        raise UnsupportedError(f"method {method.value!r} is not estimated yet; use one of "
                               + ", ".join(sorted(m.value for m in ESTIMATED_METHODS)))
    extra = _modules_to_save(model, strategy)
    if method is Method.FULL:
        mats = _base_matrices(model, model.layers)
        return Trainable(base_params=count_params(model), adapter_params=0,
                         largest_tensor=max(r * c for r, c, _ in mats), matrices=mats,
                         embedding_matrix=model.vocab_size * model.hidden_size)
    if method is Method.FREEZE:
        return _freeze(model, strategy, extra)
    if method is Method.LISA:
        return _lisa(model, strategy)
    if method in _TUNERS:
        from tuneplan.core.job.tuners import tuner_matrices  # it imports this module
        adapters = tuner_matrices(model, strategy)
    else:
        adapters = _adapter_matrices(model, strategy)
    adapter_params = sum(r * c * n for r, c, n in adapters)
    sizes = [r * c for r, c, _ in adapters] + [extra]
    return Trainable(base_params=extra, adapter_params=adapter_params,
                     largest_tensor=max(sizes), matrices=tuple(adapters),
                     saved_matrices=_named_matrices(model, strategy),
                     embedding_matrix=_named_embedding(model, strategy))


def count_params(model: ModelSpec) -> int:
    """Parameters the training step holds: embeddings, blocks, final norm, output head
    (``ModelSpec.layers`` only: a vision tower is not counted)."""
    blocks = sum(layer.params * layer.count for layer in model.layers)
    return model.embedding_params + blocks + model.final_norm_params + model.head_params


def _base_matrices(model: ModelSpec,
                   layers: Iterable[LayerSpec]) -> tuple[tuple[int, int, int], ...]:
    mats = [(model.vocab_size, model.hidden_size, 1)]
    if not model.tie_word_embeddings:
        mats.append((model.vocab_size, model.hidden_size, 1))
    for layer in layers:
        mats += [(lin.out_features, lin.in_features, lin.copies * layer.count)
                 for lin in layer.linears]
    return tuple(mats)


#: The attribute name of the norm after the last block, beside the block list, in
#: transformers 5.24's causal LMs: ``model.norm`` (llama, mistral, qwen2, gemma), ``ln_f``
#: (gpt2, falcon, bloom), ``final_layer_norm`` (gpt-neox), ``final_layernorm`` (phi). Its
#: parameters are the model's ``final_norm_params``.
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm")


def freeze_selection(strategy: Strategy) -> dict[str, object]:
    """What ``--method freeze`` trains, as ``_freeze`` counts it, in the words the launch
    bundle's train.py applies (it imports nothing from here): every parameter frozen, then
    the last ``last_blocks`` entries of the model's block list (the ``ModuleList`` of
    ``num_hidden_layers`` blocks), the final norm (the one child of the block list's parent
    named in ``final_norm``) and every module whose own name is in ``modules``
    (``--trainable-modules``; a tied head is the embedding's Parameter, trained once)."""
    return {"last_blocks": strategy.trainable_layers, "final_norm": list(FINAL_NORM_NAMES),
            "modules": list(strategy.trainable_modules)}


def _one_kind_of_block(model: ModelSpec, method: str, flag: str, n: int) -> LayerSpec:
    """The model's one kind of block, for a method that trains ``n`` of them (``flag``);
    UnsupportedError when ``n`` is out of range or the blocks differ."""
    blocks = sum(layer.count for layer in model.layers)
    if not 0 < n <= blocks:
        raise UnsupportedError(f"{method} needs {flag} between 1 and {blocks}")
    if len(model.layers) != 1:
        raise UnsupportedError(f"{method} is estimated only for models with one kind of block")
    return model.layers[0]


def _freeze(model: ModelSpec, strategy: Strategy, extra: int) -> Trainable:
    n = strategy.trainable_layers
    layer = _one_kind_of_block(model, "freeze", "--trainable-layers", n)
    mats = tuple((lin.out_features, lin.in_features, lin.copies * n) for lin in layer.linears)
    named = set(strategy.trainable_modules)
    if model.tie_word_embeddings and named & EMBED_NAMES and named & HEAD_NAMES:
        # no PEFT copies here: the tied head's weight is the embedding's Parameter, once
        extra -= model.vocab_size * model.hidden_size
    params = layer.params * n + model.final_norm_params + extra
    named_mats = _named_matrices(model, strategy, tied_once=True)
    return Trainable(base_params=params, adapter_params=0,
                     largest_tensor=max(r * c for r, c, _ in mats + named_mats), matrices=mats,
                     saved_matrices=named_mats,
                     embedding_matrix=_named_embedding(model, strategy))


def _lisa(model: ModelSpec, strategy: Strategy) -> Trainable:
    """LISA at any one moment: ``--lisa-layers`` K blocks, plus what it never freezes.

    LMFlow (``src/lmflow/pipeline/utils/lisa_trainer.py`` ``DynamicLayerActivationCallback``,
    at commit f3597db): every ``lisa_interval_steps`` it sets ``requires_grad = False`` on the
    parameters of ``model.model.layers`` and back to True on ``lisa_activated_layers`` blocks
    drawn at random; the embedding, the final norm and the head are never touched, so they
    always train. Every block is the same size, so which K train changes no count."""
    k = strategy.lisa_layers
    layer = _one_kind_of_block(model, "lisa", "--lisa-layers", k)
    embed = [(model.vocab_size, model.hidden_size, 1)]
    if not model.tie_word_embeddings:
        embed.append((model.vocab_size, model.hidden_size, 1))
    mats = tuple(embed) + tuple((lin.out_features, lin.in_features, lin.copies * k)
                                for lin in layer.linears)
    params = (layer.params * k + model.embedding_params + model.final_norm_params
              + model.head_params)
    return Trainable(base_params=params, adapter_params=0,
                     largest_tensor=max(r * c for r, c, _ in mats), matrices=mats,
                     embedding_matrix=model.vocab_size * model.hidden_size)


def _adapter_matrices(model: ModelSpec, strategy: Strategy) -> list[tuple[int, int, int]]:
    method, r = strategy.method, strategy.lora_rank
    mats: list[tuple[int, int, int]] = []
    if method is Method.PREFIX:
        kv_dim = model.num_kv_heads * model.head_dim
        layers = sum(layer.count for layer in model.layers)
        return [(strategy.num_virtual_tokens, layers * 2 * kv_dim, 1)]
    if method is Method.PROMPT:
        return [(strategy.num_virtual_tokens, model.hidden_size, 1)]
    _check_targets(model, strategy)
    for layer in model.layers:
        for lin in targeted_linears(model, strategy, layer):
            n = lin.copies * layer.count
            if method is Method.IA3:
                size = lin.in_features if _short(lin.name) in IA3_FEEDFORWARD else lin.out_features
                mats.append((1, size, n))
                continue
            if lin.role is LinearRole.EXPERT:
                if method is Method.DORA:  # peft 0.21: ValueError from get_peft_model
                    raise UnsupportedError(
                        f"DoRA cannot wrap {model.name}'s fused experts (peft's "
                        "lora.ParamWrapper does not work with use_dora): use --method lora, or "
                        "--lora-targets naming the attention linears")
                # lora.ParamWrapper: A (r·E, in), B (out, r·E) per stacked expert parameter.
                wide = lora_rank_of(lin, strategy) * lin.copies
                mats += [(wide, lin.in_features, layer.count),
                         (lin.out_features, wide, layer.count)]
                continue
            mats += [(r, lin.in_features, n), (lin.out_features, r, n)]
            if method is Method.DORA:
                mats.append((1, lin.out_features, n))
    for lin in outer_targets(model, strategy):
        mats += [(r, lin.in_features, 1), (lin.out_features, r, 1)]
        if method is Method.DORA:
            mats.append((1, lin.out_features, 1))
    if not mats:
        raise UnsupportedError(f"no linear of {model.name} matches --lora-targets "
                               f"{','.join(strategy.lora_targets)}")
    return mats


def _check_targets(model: ModelSpec, strategy: Strategy) -> None:
    """Every name in ``--lora-targets`` must name a module of ``model``: PEFT 0.21 ignores a
    name that matches nothing as long as another one matches (checked on a tiny Llama), so a
    typo would train fewer adapters than asked for, silently. Names with ``*`` are left to
    PEFT's own matching."""
    if strategy.all_linear:
        return
    names = _linear_names(model)
    unknown = [t for t in peft_lora_targets(model, strategy) if t not in names
               and t not in HEAD_NAMES and t not in EMBED_NAMES and "*" not in t]
    if unknown:
        known = sorted({_short(n) for n in names})
        raise UnsupportedError(f"no module of {model.name} matches --lora-targets "
                               f"{','.join(unknown)} (PEFT skips such a name silently when "
                               f"another matches); its linears: {', '.join(known[:12])}, "
                               "or lm_head / embed_tokens")


def _named_matrices(model: ModelSpec, strategy: Strategy, *, tied_once: bool = False
                    ) -> tuple[tuple[int, int, int], ...]:
    """The V·h weights of ``--trainable-modules`` (embedding and/or head; a head's bias is a
    vector, counted with the small tensors). ``tied_once``: a tied head named beside the
    embedding is the embedding's Parameter (freeze trains it in place), so one matrix."""
    named = [n for n in strategy.trainable_modules if n in EMBED_NAMES or n in HEAD_NAMES]
    if (tied_once and model.tie_word_embeddings and any(n in EMBED_NAMES for n in named)
            and any(n in HEAD_NAMES for n in named)):
        named = [n for n in named if n in EMBED_NAMES]
    return tuple((model.vocab_size, model.hidden_size, 1) for _ in named)


def _named_embedding(model: ModelSpec, strategy: Strategy) -> int:
    """V·h when ``--trainable-modules`` names the token embedding (an ``nn.Embedding`` that
    trains: what the HF Trainer's 8-bit override keeps 32-bit), else 0."""
    named = any(n in EMBED_NAMES for n in strategy.trainable_modules)
    return model.vocab_size * model.hidden_size if named else 0


def _modules_to_save(model: ModelSpec, strategy: Strategy) -> int:
    """Parameters of PEFT ``modules_to_save`` copies (embedding and/or head trained in full)."""
    params = 0
    for name in strategy.trainable_modules:
        if name in EMBED_NAMES:
            params += model.vocab_size * model.hidden_size
        elif name in HEAD_NAMES and strategy.task.value != "causal-lm":
            raise UnsupportedError(f"--trainable-modules {name}: a {strategy.task.value} "
                                   "model has no vocabulary head (its head is a new score "
                                   "layer)")
        elif name in HEAD_NAMES:
            bias = model.vocab_size if model.head_bias else 0
            params += model.vocab_size * model.hidden_size + bias
        else:
            raise UnsupportedError(f"--trainable-modules {name!r} is not estimated; use "
                                   "embed_tokens and/or lm_head")
    return params
