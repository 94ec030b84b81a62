"""Activations a transformer block saves for backward, tensor by tensor, in bytes.

Read off the autograd graph of transformers 5 / PEFT 0.21 modules: RMSNorm saves its fp32
input, rsqrt and (if its weight trains) the normalized tensor; a linear saves its input only if
its weight trains; SDPA/flash saves q, k, v, output and an fp32 logsumexp; eager attention the
fp32 softmax (B·heads·S·S_kv) and its cast; a gated MLP saves gate, act and up outputs; PEFT
LoRA saves a cast copy of the input per target and the rank-r intermediate. bitsandbytes
matmuls keep their inputs as ``Strategy.stack`` says (``core/job/versions.py``): MatMul8bitLt
keeps A (and CAt before 0.45), MatMul4Bit before 0.43.2 its compute-dtype input. No loss/logits
here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tuneplan.core.job.methods import (
    IA3_FEEDFORWARD,
    Method,
    Quant,
    effective_quant,
    outer_targets,
    targeted_linears,
)
from tuneplan.core.job.recipes import PrecisionPlan
from tuneplan.core.job.strategy import Attention, Checkpointing, Strategy
from tuneplan.core.job.tuners import WEIGHT_TUNERS, held
from tuneplan.core.job.versions import (
    bnb_4bit_saves_input,
    bnb_8bit_keeps_cat,
    hf_eager_clamps_scores,
)
from tuneplan.core.memory import mla
from tuneplan.core.memory.experts import experts_adapted, param_wrapped, param_wrapper_saved
from tuneplan.core.memory.parts import Piece, part
from tuneplan.core.models import LayerSpec, Linear, LinearRole, MlpKind, ModelSpec, NormKind

_O_NAMES = frozenset({"o_proj", "dense", "out_proj", "wo", "c_proj"})
_DOWN_NAMES = frozenset({"down_proj", "fc2", "dense_4h_to_h", "w2", "c_proj", "down"})


class Shape(NamedTuple):   # a tuple: made once per estimate, cheaply (immutable alike)
    """Token geometry of one micro-batch: batch, query positions, key positions."""

    batch: int
    seq_q: int
    seq_kv: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_q


@dataclass(frozen=True, slots=True, kw_only=True)
class Widths:
    """Byte widths of activations: compute, residual stream, norm output, adapter, autocast."""

    compute: int
    residual: int
    norm_out: int
    adapter: int
    autocast: bool
    norm_trains: bool
    mlp: int = 2               # MLP intermediates: bnb Linear4bit/8bit return the input dtype
    dropout_mask: int = 1
    base: int = 2              # frozen base weights (PEFT's merged expert weights)
    norm_weight: int = 2       # norm (and embedding) weights, trained or frozen


def widths(strategy: Strategy, plan: PrecisionPlan, dropout_mask_bytes: int) -> Widths:
    """Activation widths: the residual stream has the embedding's dtype (autocast leaves it)."""
    full = strategy.method.trains_base
    # Unquantized frozen weights (embedding, norms): fp32 after PEFT's k-bit upcast.
    base = 4 if plan.kbit_upcast else plan.frozen_weight_bytes
    stored = plan.trainable_weight_bytes if full else base   # embedding and norm weights
    residual = stored if plan.autocast or plan.kbit_upcast or full else plan.compute_bytes
    norm_out = max(residual, stored)
    # bitsandbytes Linear4bit.forward casts its input to the compute dtype and its output back
    # to the input's dtype, so after PEFT's fp32 norm upcast the MLP runs in fp32.
    quantized = effective_quant(strategy) is not None
    return Widths(compute=plan.compute_bytes, residual=residual, norm_out=norm_out,
                  adapter=plan.adapter_bytes, autocast=plan.autocast,
                  # LN tuning trains copies of the norms: they save their output too
                  norm_trains=full or strategy.method is Method.LAYERNORM,
                  mlp=norm_out if quantized else plan.compute_bytes,
                  dropout_mask=dropout_mask_bytes, base=base, norm_weight=stored)


def encoder_dropout(model: ModelSpec, key: str) -> float:
    """A dropout probability of an encoder-only model (the BERT parser keeps
    ``hidden_dropout_prob``, ``attention_probs_dropout_prob`` and ``classifier_dropout`` in
    ``extra``; BertConfig's default is 0.1)."""
    value = model.extra.get(key, 0.1)
    return float(value) if isinstance(value, int | float) else 0.1


def norm_saved(model: ModelSpec, tokens: int, w: Widths) -> int:
    """One norm: RMSNorm saves the fp32 input, rsqrt, and the normalized tensor if it trains."""
    h = model.hidden_size
    if model.norm_kind is NormKind.RMSNORM:
        return tokens * h * 4 + tokens * 4 + (tokens * h * w.residual if w.norm_trains else 0)
    # native_layer_norm saves its input (fp32 under autocast), mean and rstd.
    return tokens * h * (4 if w.autocast else w.residual) + 2 * tokens * 4


#: Input groups on the attention side of a block (MLA's latent inputs included).
ATTN_GROUPS = frozenset({"attn_in", "o_in", *mla.LATENT_GROUPS.values()})


def _side(group: str) -> str:
    return "attn" if group in ATTN_GROUPS else "mlp"


def _saved_key(group: str) -> str:
    """Where a saved input of ``group`` is counted (the down projection's is freed first)."""
    if group in ATTN_GROUPS:
        return "linear_inputs_attn"
    return "linear_inputs_down" if group == "down_in" else "linear_inputs_mlp"


def linear_group(lin: Linear) -> str:
    """Which saved input a linear reads: attn_in, o_in, mlp_in, down_in, MLA's q_lat_in and
    kv_lat_in (``mla.LATENT_GROUPS``) or a shared expert's shared_down_in."""
    short = lin.name.rsplit(".", 1)[-1]
    if lin.role is LinearRole.ATTENTION:
        return "o_in" if short in _O_NAMES else mla.LATENT_GROUPS.get(short, "attn_in")
    if lin.role is LinearRole.ROUTER:
        return "mlp_in"
    if short in _DOWN_NAMES or lin.name == "output.dense":   # BERT's BertOutput.dense
        return "shared_down_in" if lin.role is LinearRole.SHARED_EXPERT else "down_in"
    return "mlp_in"


def _group_dims(model: ModelSpec, layer: LayerSpec, w: Widths) -> dict[str, tuple[int, int]]:
    """(elements per token, bytes per element) of each input group of ``layer``: read off the
    linears that read it (o_proj's input is heads·v_head_dim under MLA)."""
    widths_of = {"attn_in": w.norm_out, "mlp_in": w.norm_out, "o_in": w.compute,
                 "down_in": w.mlp, "shared_down_in": w.mlp,
                 **dict.fromkeys(mla.LATENT_GROUPS.values(), mla.latent_width(w))}
    dims = {"attn_in": (model.hidden_size, w.norm_out), "mlp_in": (model.hidden_size, w.norm_out),
            "o_in": (model.num_heads * model.head_dim, w.compute),
            "down_in": (model.intermediate_size, w.mlp)}
    for lin in layer.linears:
        group = linear_group(lin)
        if lin.role is not LinearRole.EXPERT and group not in ("attn_in", "mlp_in"):
            dims[group] = (lin.in_features, widths_of[group])
    return dims


@dataclass(frozen=True, slots=True)
class LayerInputs:
    """What one kind of block saves of its linears' inputs, split into bytes per token and
    token-independent bytes (PEFT's merged expert weights), and the input groups it saves as
    the very tensor the block computed. Depends on the model, strategy and widths only, so an
    estimate computes it once for every micro-batch (``layer_inputs``)."""

    per_token: dict[str, int]
    fixed: dict[str, int]
    shared: frozenset[str]
    experts_train: bool

    def at(self, tokens: int) -> dict[str, int]:
        return {k: tokens * v + self.fixed[k] for k, v in self.per_token.items()}


def layer_inputs(model: ModelSpec, layer: LayerSpec, strategy: Strategy, w: Widths) -> LayerInputs:
    """Saved linear inputs (and adapter intermediates) of ``layer``, per token + fixed."""
    method = strategy.method
    tuner = method in WEIGHT_TUNERS
    targets = set(id(lin) for lin in targeted_linears(model, strategy, layer)) if (
        method.is_lora or method is Method.IA3 or tuner) else set()
    dims = _group_dims(model, layer, w)
    shared: set[str] = set()
    # Bytes per token (every size below is tokens · something, summed) and fixed bytes.
    out = {"linear_inputs_attn": 0, "linear_inputs_mlp": 0, "linear_inputs_down": 0,
           "adapters_attn": 0, "adapters_mlp": 0}
    fixed = dict.fromkeys(out, 0)
    bnb4 = bnb_4bit_saves_input(strategy)
    bnb8 = effective_quant(strategy) is Quant.INT8
    cat = bnb_8bit_keeps_cat(strategy)
    for lin in layer.linears:
        if id(lin) in targets and param_wrapped(lin):
            # an fp32 router saves its own fp32 input copy (mla.group_router_saved)
            own = lin.role is LinearRole.ROUTER and mla.fp32_router_input_saved(model, w)
            fixed["adapters_mlp"] += param_wrapper_saved(lin, w, strategy,
                                                         set() if own else shared)
            if lin.role is LinearRole.ROUTER and model.model_type in mla.FP32_ROUTER_TYPES:
                # its merged weight W + s·B·A is fp32 (the router weight is kept fp32)
                fixed["adapters_mlp"] += lin.weight_params * max(4 - w.base, 0)
            continue
        if lin.role is LinearRole.EXPERT:
            continue
        group = linear_group(lin)
        side = _side(group)
        d_in = dims[group][1]
        if method.trains_base:
            if w.autocast and d_in != w.compute:
                out[f"linear_inputs_{side}"] += lin.in_features * w.compute
            else:
                shared.add(group)
        elif bnb4:
            # bitsandbytes < 0.43.2 MatMul4Bit keeps A = x.to(compute dtype) (Linear4bit.forward
            # casts): each linear's own cast copy, or the block's tensor when no cast happens.
            if d_in != w.compute:
                out[_saved_key(group)] += lin.in_features * w.compute
            else:
                shared.add(group)
        elif bnb8:
            # bitsandbytes MatMul8bitLt keeps A, the layer input itself (0.39.1 to 0.50.1), and
            # before 0.45 also CAt, the int8 transposed quantized input (1 B per element).
            shared.add(group)
            if cat:
                out[_saved_key(group)] += lin.in_features
        if id(lin) not in targets:
            continue
        if tuner:
            _tuner_saved(lin, d_in, w, strategy, side, group, out, fixed, shared)
            continue
        if method is Method.IA3:
            out[f"adapters_{side}"] += _ia3_saved(lin, 1, d_in, w, shared, group)
        else:
            out[f"adapters_{side}"] += _lora_saved(lin, 1, d_in, w, strategy, shared, group)
    for group in shared:
        if group == "o_in" and not mla.output_is_copied(model, strategy):
            continue  # SDPA/flash output is laid out so o_proj's input is a view of it
        dim, width = dims[group]
        out[_saved_key(group)] += dim * width
    return LayerInputs(per_token=out, fixed=fixed, shared=frozenset(shared),
                       experts_train=method.trains_base or experts_adapted(model, layer,
                                                                           strategy))


def _tuner_saved(lin: Linear, d_in: int, w: Widths, strategy: Strategy, side: str,
                 group: str, out: dict[str, int], fixed: dict[str, int],
                 shared: set[str]) -> None:
    """What a ``tuners.WEIGHT_TUNERS`` module on ``lin`` saves (``tuners.held``): per-token
    and fixed bytes, and its input: the block's tensor itself, or PEFT's cast of it to the
    adapter dtype (one per target)."""
    h = held(strategy.method, lin, strategy.lora_rank, w.adapter, w.base)
    out[f"adapters_{side}"] += h.per_token
    fixed[f"adapters_{side}"] += h.fixed * lin.copies
    if h.input and h.casts_input and d_in != w.adapter:
        out[f"adapters_{side}"] += lin.in_features * w.adapter
    elif h.input:
        shared.add(group)


def tuner_transients(model: ModelSpec, strategy: Strategy, w: Widths,
                     tokens: int) -> tuple[int, int]:
    """(forward, backward) bytes a ``tuners.WEIGHT_TUNERS`` module holds only while it runs
    (its materialised update's temporaries, FFTs): the largest over the targeted linears,
    one module running at a time. (0, 0) for other methods (DoRA: ``dora_transients``)."""
    if strategy.method not in WEIGHT_TUNERS:
        return 0, 0
    fwd = bwd = 0
    for layer in model.layers:
        for lin in targeted_linears(model, strategy, layer):
            h = held(strategy.method, lin, strategy.lora_rank, w.adapter, w.base)
            fwd = max(fwd, h.forward + tokens * h.forward_per_token)
            bwd = max(bwd, h.backward + tokens * h.backward_per_token)
    return fwd, bwd


def dora_transients(model: ModelSpec, strategy: Strategy, w: Widths) -> dict[str, int]:
    """DoRA's weight-norm temporaries (``dora_norm_bytes``), the largest over the targeted
    linears at each place of a block's forward: ``attention`` (q/k/v/o), ``gate/up`` (MLP
    linears fed the hidden state) and ``down`` (fed the MLP product); all 0 for other
    methods. The same in a checkpointed block's recompute."""
    out = {"attention": 0, "gate/up": 0, "down": 0}
    if strategy.method is not Method.DORA:
        return out
    quantized = effective_quant(strategy) is not None
    for layer in model.layers:
        for lin in targeted_linears(model, strategy, layer):
            where = "attention" if lin.role in (
                LinearRole.ATTENTION, LinearRole.CROSS_ATTENTION) else (
                "down" if lin.in_features != model.hidden_size else "gate/up")
            out[where] = max(out[where], dora_norm_bytes(lin, strategy.lora_rank, w, quantized))
    return out


def dora_norm_bytes(lin: Linear, rank: int, w: Widths, quantized: bool) -> int:
    """What peft 0.21.2 ``DoraLinearLayer.forward`` holds while it takes the column norm of
    ``W + scaling·BA`` (every forward, detached from the graph). ``get_lora_weight`` builds BA
    as ``lora_B(lora_A(eye(in)))``: the identity (under autocast its compute-dtype copy) and
    A's output stay saved by the graph of that weight, alive until the forward returns; BA is
    cast to the input's dtype (the adapter's: LoRA casts x to A's dtype; the compute-dtype
    product is then freed), the base weight too, then ``scaling * lora_weight`` and the sum
    (``get_weight_norm``): in² + in·r in the identity's dtype, in·out once per distinct
    dtype cast, + 2·in·out in the adapter dtype. Under a quantized base the dequantised
    weight is the dequant buffer; its cast to the adapter dtype is counted here."""
    n, m, a = lin.in_features, lin.out_features, w.adapter
    inner = w.compute if w.autocast else a    # the identity's and A's output dtype
    held = n * n * inner + n * rank * inner + n * m * a   # eye, A(eye), BA in x's dtype
    if quantized or w.base != a:
        held += n * m * a            # weight.to(x.dtype)
    return held + 2 * n * m * a      # scaling * lora_weight, weight + that


def forward_live(model: ModelSpec, strategy: Strategy, w: Widths, shape: Shape,
                 inputs: tuple[LayerInputs, ...] | None = None) -> dict[str, int]:
    """Bytes a block's forward holds in variables without saving them, while its MLP runs:
    the post-attention residual sum (unless its norm saved that very tensor), the norm's
    output (the MLP's ``x``, unless a linear saved it) and, at the down projection, the
    dense MLP's product (unless down_proj saved it). Keyed like ``forward_transient``, and
    like it T times a per-token size (the estimate makes it once at T = 1 and scales it).
    ``inputs``: ``layer_inputs`` of each of ``model.layers``, if already made."""
    t, h = shape.tokens, model.hidden_size
    # post-LN (encoder-only): the residual the MLP adds back is its input, the norm output
    residual = 0 if model.is_encoder_only or input_shared_with_norm(model, w, shape) else (
        t * h * w.residual)
    out = {"mlp_in": 0, "down_in": 0}
    for index, layer in enumerate(model.layers):
        shared = (inputs[index] if inputs is not None
                  else layer_inputs(model, layer, strategy, w)).shared
        norm_out = 0 if "mlp_in" in shared else t * h * w.norm_out
        product = 0 if layer.num_experts or "down_in" in shared else (
            t * model.intermediate_size * w.mlp)
        out["mlp_in"] = max(out["mlp_in"], residual + norm_out)
        out["down_in"] = max(out["down_in"], residual + norm_out + product)
    return out


def _lora_saved(lin: Linear, t: int, d_in: int, w: Widths, strategy: Strategy,
                shared: set[str], group: str) -> int:
    """PEFT lora.Linear: x.to(A.dtype) -> dropout -> A (saves input) -> B (saves A's output)."""
    a, c, n = w.adapter, w.compute, lin.in_features
    saved = 0
    if strategy.lora_dropout > 0:
        saved += t * n * w.dropout_mask  # mask: bool from CUDA native_dropout, fp32 on the CPU
        saved += t * n * (c if w.autocast else a)
    elif w.autocast and a != c:
        saved += t * n * c  # autocast's bf16 copy of the fp32-cast input, per target
    elif d_in != a:
        saved += t * n * a  # PEFT's cast of the input to the adapter dtype, per target
    else:
        shared.add(group)
    inner = c if w.autocast else a
    saved += t * strategy.lora_rank * inner
    if strategy.method is Method.DORA:
        # (m/|W|-1)·base_result and m/|W|·lora_result keep both T×out tensors.
        saved += t * lin.out_features * (c + inner)
    return saved


def outer_lora_saved(lin: Linear, tokens: int, d_in: int, w: Widths,
                     strategy: Strategy) -> tuple[int, bool]:
    """(bytes, input shared) PEFT saves for a LoRA on the output head (``outer_targets``):
    as for a block linear (``_lora_saved``); "shared" means lora_A saved the head's input
    tensor itself (no cast), which then stays alive until the head's backward."""
    shared: set[str] = set()
    return _lora_saved(lin, tokens, d_in, w, strategy, shared, "head_in"), bool(shared)


def _ia3_saved(lin: Linear, t: int, d_in: int, w: Widths, shared: set[str], group: str) -> int:
    """PEFT ia3.Linear: feed-forward targets scale (and save) the input, others the output."""
    if lin.name.rsplit(".", 1)[-1] in IA3_FEEDFORWARD:
        if d_in == w.adapter:
            shared.add(group)
            return 0
        return t * lin.in_features * w.adapter
    return t * lin.out_features * w.compute


def eager_cast_bytes(model: ModelSpec, strategy: Strategy, w: Widths, shape: Shape) -> int:
    """Eager attention's compute-dtype copy of the fp32 softmax (freed once its matmul ran)."""
    if strategy.attention is not Attention.EAGER or w.compute == 4:
        return 0
    return shape.batch * model.num_heads * shape.seq_q * shape.seq_kv * w.compute


def clamped_scores_bytes(model: ModelSpec, strategy: Strategy, w: Widths, shape: Shape) -> int:
    """transformers before 4.31, LLaMA eager (``versions.hf_eager_clamps_scores``): the masked
    scores ``torch.max`` saves, B·heads·S·S_kv in the scores' dtype (the compute dtype)
    promoted with the mask's (``inputs_embeds.dtype``, the embedding's): equal widths keep it,
    else fp32 (fp16 + fp32, and bf16 + fp16, promote to fp32)."""
    if not hf_eager_clamps_scores(model, strategy):
        return 0
    width = w.compute if w.compute == w.norm_weight else 4
    return shape.batch * model.num_heads * shape.seq_q * shape.seq_kv * width


def encoder_scores_saved(model: ModelSpec, w: Widths, shape: Shape) -> int:
    """BERT's eager scores (transformers 5.24 bert ``eager_attention_forward``): softmax
    without ``dtype=`` saves its output in the compute dtype (fp32 under CUDA autocast, which
    runs softmax in fp32), dropout saves its mask, and ``attn @ v`` saves the dropout output
    (under autocast its compute-dtype cast; with p = 0 the softmax output itself)."""
    scores = shape.batch * model.num_heads * shape.seq_q * shape.seq_kv
    soft = 4 if w.autocast else w.compute
    dropped = encoder_dropout(model, "attention_probs_dropout_prob") > 0
    saved = scores * soft + (scores * w.dropout_mask if dropped else 0)
    if w.autocast:
        return saved + scores * w.compute
    return saved + (scores * soft if dropped else 0)


def encoder_attention_forward(model: ModelSpec, strategy: Strategy, w: Widths,
                              shape: Shape) -> int:
    """BERT eager under autocast: bytes alive through a block's forward beyond what it
    saved. ``eager_attention_forward`` returns the attention weights (the fp32 dropout
    output; ``attn @ v`` saves its compute-dtype cast, not it) and ``BertLayer.forward``
    binds them to ``_`` (``self_attention_output, _ = self.attention(...)``), a local that
    lives until the block returns: B·heads·S·S·4 through the block's MLP. 0 for other models
    and without autocast (there the dropout output is saved anyway)."""
    if not (model.is_encoder_only and w.autocast and strategy.attention is Attention.EAGER
            and encoder_dropout(model, "attention_probs_dropout_prob") > 0):
        return 0
    return shape.batch * model.num_heads * shape.seq_q * shape.seq_kv * 4


def encoder_forward_held(model: ModelSpec, w: Widths, shape: Shape,
                         shared: frozenset[str]) -> int:
    """Encoder-only (post-LN) blocks at the end of a block's forward: the second norm's
    output T·H being made, and, where q/k/v do not save their input itself (autocast casts
    it), the block's input (``BertEncoder``'s loop variable) and the embedding output
    (``BertModel.forward`` holds it through the encoder), T·H each. 0 for other models."""
    if not model.is_encoder_only:
        return 0
    size = block_input_bytes(model, w, shape)
    return size if "attn_in" in shared else 3 * size


def attention_saved(model: ModelSpec, strategy: Strategy, w: Widths, shape: Shape) -> int:
    """SDPA/flash: q, k, v, out + fp32 logsumexp; eager: q, repeated k/v, fp32 softmax + cast.
    Multi-head latent attention: ``mla.attention_saved``."""
    dims = mla.mla_dims(model)
    if dims is not None:
        return mla.attention_saved(dims, strategy, w, shape)
    c, b = w.compute, shape.batch
    qd = model.num_heads * model.head_dim
    kvd = model.num_kv_heads * model.head_dim
    t_q, t_kv = b * shape.seq_q, b * shape.seq_kv
    if strategy.attention is Attention.EAGER and model.is_encoder_only:
        return t_q * qd * c + 2 * t_kv * kvd * c + encoder_scores_saved(model, w, shape)
    if strategy.attention is Attention.EAGER:
        scores = b * model.num_heads * shape.seq_q * shape.seq_kv
        cast = scores * c if c != 4 else 0
        # The output's contiguous copy is o_proj's input: counted with the linear inputs.
        return t_q * qd * c + 2 * t_kv * qd * c + scores * 4 + cast + clamped_scores_bytes(
            model, strategy, w, shape)
    if shape.seq_kv != shape.seq_q:
        # Prefix tuning: an explicit additive mask disables SDPA's native GQA, so k/v are
        # repeated to every head, and the fp32 mask B·S·S_kv is saved per block.
        mask = b * shape.seq_q * shape.seq_kv * 4
        return t_q * qd * c + 2 * t_kv * qd * c + t_q * qd * c + b * model.num_heads * \
            shape.seq_q * 4 + mask
    return t_q * qd * c + 2 * t_kv * kvd * c + t_q * qd * c + b * model.num_heads * shape.seq_q * 4


def mlp_saved(model: ModelSpec, layer: LayerSpec, w: Widths, shape: Shape,
              experts_train: bool) -> int:
    """Gated MLP: gate out, act out, up out; plain MLP: fc1 out. MoE: per routed token copy."""
    t, c = shape.tokens, w.mlp
    if layer.num_experts:
        k = layer.experts_per_token
        inter = model.moe_intermediate_size or model.intermediate_size
        router = t * layer.num_experts * 4 + t * k * 4
        # grouped_mm: gathered inputs and the down product are saved only if experts train.
        per_pair = (2 * inter + inter + model.hidden_size) * c
        if experts_train:
            per_pair += (model.hidden_size + inter) * c
        return router + t * k * per_pair
    inter = model.intermediate_size
    if model.mlp_kind.value == "gated":
        return 3 * t * inter * c
    return t * inter * c


def moe_tail_saved(model: ModelSpec, layer: LayerSpec, w: Widths, shape: Shape,
                   experts_train: bool) -> int:
    """Part of a MoE MLP's saved tensors freed first in backward: the experts' down outputs
    (kept for the routing-weight product) and, if experts train, their down inputs."""
    if not layer.num_experts:
        return 0
    inter = model.moe_intermediate_size or model.intermediate_size
    per_pair = model.hidden_size + (inter if experts_train else 0)
    return shape.tokens * layer.experts_per_token * per_pair * w.compute


def block_saved(model: ModelSpec, layer: LayerSpec, strategy: Strategy, w: Widths,
                shape: Shape, inputs: LayerInputs | None = None) -> dict[str, int]:
    """Everything one block keeps from forward to backward, by component (bytes);
    ``inputs`` is the block's ``layer_inputs`` if already made."""
    t = shape.tokens
    if inputs is None:
        inputs = layer_inputs(model, layer, strategy, w)
    experts_train = inputs.experts_train
    mlp = mlp_saved(model, layer, w, shape, experts_train)
    tail = moe_tail_saved(model, layer, w, shape, experts_train)
    if layer.num_experts and model.model_type in mla.FP32_ROUTER_TYPES:
        router_trains = strategy.method.trains_base or (strategy.method.is_lora and any(
            lin.role is LinearRole.ROUTER and param_wrapped(lin)
            for lin in targeted_linears(model, strategy, layer)))
        mlp += mla.group_router_saved(model, layer, w, shape, router_trains)
    # BERT's two hidden dropouts (after attention.output.dense and output.dense): T·H masks
    mask = t * model.hidden_size * w.dropout_mask if model.is_encoder_only and (
        encoder_dropout(model, "hidden_dropout_prob") > 0) else 0
    mlp += mask
    parts = {"norms": 2 * norm_saved(model, t, w),
             "attention": attention_saved(model, strategy, w, shape) + mask,
             "mlp": mlp - tail + mla.shared_expert_saved(layer, w, shape), "mlp_tail": tail}
    parts.update(inputs.at(t))
    return parts


def first_norm_without_grad(model: ModelSpec, strategy: Strategy, w: Widths,
                            shape: Shape) -> int:
    """Bytes the first block's norm does *not* save when nothing before it needs a gradient.

    A frozen embedding with no checkpointing (so no ``enable_input_require_grads``) feeds the
    first norm a tensor without grad: autograd records nothing there.
    """
    m = strategy.method
    if m.trains_base or m.adds_virtual_tokens or m is Method.LAYERNORM or (
            strategy.checkpointing is not Checkpointing.NONE):
        return 0
    if any(lin.role is LinearRole.EMBEDDING for lin in outer_targets(model, strategy)):
        return 0  # a LoRA on the embedding: its output requires grad
    return norm_saved(model, shape.tokens, w)


def backward_transients(model: ModelSpec, strategy: Strategy, w: Widths,
                        shape: Shape) -> tuple[Piece, Piece]:
    """Gradients alive inside one block's backward beyond what it saved: (MLP, attention).

    MLP: 3·T·I·bytes (gated) + T·H·bytes. Eager attention: the fp32 softmax gradient and its
    input gradient 2·B·heads·S·S_kv·4 plus the T·H gradients flowing; SDPA/flash: q, k, v
    gradients.
    """
    t, c = shape.tokens, w.compute
    gated = model.mlp_kind is MlpKind.GATED
    pairs, inter = t, model.intermediate_size
    if model.num_experts:
        pairs, inter = t * model.num_experts_per_token, (
            model.moe_intermediate_size or model.intermediate_size)
    # At the gate·up product's backward: the down input's gradient and both factors'.
    # A tuner's backward temporaries (tuners.held) peak inside one target's backward: at a
    # gate/up target, beside both products' gradients and the input gradient; elsewhere
    # beside the gradient flowing in and out. Whichever is larger is the block's transient.
    _, tuner = tuner_transients(model, strategy, w, t)
    own = (3 if gated else 2) * pairs * inter * c + t * model.hidden_size * c
    at_target = tuner + 2 * pairs * inter * c + t * model.hidden_size * c
    mlp = part("activations/backward_transient", max(own, at_target) if tuner else own,
               "MLP backward gradients (3 gated / 2 plain)·T·I·bytes + T·H·bytes"
               + (", or a tuner target's backward temporaries + 2·T·I·bytes + T·H·bytes, "
                  "the larger" if tuner else ""), tokens=t)
    if strategy.attention is Attention.EAGER and model.is_encoder_only and not w.autocast and \
            encoder_dropout(model, "attention_probs_dropout_prob") > 0:
        # BERT without autocast: ``attn @ v``'s backward makes the dropout output's gradient
        # while everything is saved; dropout's backward then frees the dropout output as it
        # makes the softmax output's gradient, so one score-sized gradient is the excess.
        size = shape.batch * model.num_heads * shape.seq_q * shape.seq_kv * w.compute + \
            2 * t * model.hidden_size * c
        formula = "eager dropout-output gradient B·heads·S·S_kv·bytes + 2·T·H·bytes"
    elif strategy.attention is Attention.EAGER:
        # softmax backward: its fp32 output gradient and fp32 input gradient (measured).
        # (BERT without autocast softmaxes in the compute dtype, its gradients too)
        width = w.compute if model.is_encoder_only and not w.autocast else 4
        size = 2 * shape.batch * model.num_heads * shape.seq_q * shape.seq_kv * width + \
            2 * t * model.hidden_size * c
        formula = "eager softmax gradients 2·B·heads·S·S_kv·4 + 2·T·H·bytes"
    else:
        size = t * sum(mla.qkv_dims(model)) * c + t * model.hidden_size * c
        formula = "flash/SDPA q, k, v gradients + T·H·bytes"
    if tuner and tuner + 2 * t * model.hidden_size * c > size:
        size, formula = tuner + 2 * t * model.hidden_size * c, (
            "a tuner target's backward temporaries + 2·T·H·bytes")
    return mlp, part("activations/backward_transient", size, formula, tokens=t)


def forward_transient(model: ModelSpec, strategy: Strategy, w: Widths,
                      shape: Shape) -> dict[str, int]:
    """Bytes alive only while a block's MLP runs forward (or is recomputed), beyond what the
    block has saved by then, at its gate/up ("mlp_in") and at its down projection ("down").

    PEFT lora.Linear keeps ``x.to(A.dtype)`` until it returns (already saved unless autocast
    re-casts it) and, while adding the update, the base output and the scaled update (T·out
    each); without an adapter a linear just produces its T·out output. Every size is T times
    a per-token size (the estimate computes it once at T = 1 and scales it).
    """
    t, c, a = shape.tokens, w.compute, w.adapter
    inner = c if w.autocast else a
    out = {"mlp_in": t * model.intermediate_size * c, "down_in": t * model.hidden_size * c}
    if not strategy.method.is_lora:
        return out
    widths_in = {"attn_in": w.norm_out, "mlp_in": w.norm_out, "o_in": c, "down_in": w.mlp}
    for layer in model.layers:
        for lin in targeted_linears(model, strategy, layer):
            group = linear_group(lin)
            if group not in out:
                continue
            d_in = widths_in[group]
            copy = t * lin.in_features * a if (w.autocast and d_in != a) else 0
            out[group] = max(out[group], copy + t * lin.out_features * (c + inner))
    return out


def input_shared_with_norm(model: ModelSpec, w: Widths, shape: Shape) -> int:
    """Bytes of a block's input that its first norm saves as the very same tensor (fp32
    residual under RMSNorm, or LayerNorm without autocast), so checkpoints do not add them."""
    if model.is_encoder_only:   # post-LN: the first norm saves the attention sum instead
        return 0
    shared = (model.norm_kind is NormKind.RMSNORM and w.residual == 4) or (
        model.norm_kind is not NormKind.RMSNORM and not w.autocast)
    return block_input_bytes(model, w, shape) if shared else 0


def input_shared_with_linears(model: ModelSpec, w: Widths, shape: Shape,
                              shared: frozenset[str]) -> int:
    """Encoder-only (post-LN) blocks: bytes of the block input its q/k/v linears save as the
    very tensor checkpointing keeps (their input is shared, ``LayerInputs.shared``)."""
    if not model.is_encoder_only or "attn_in" not in shared:
        return 0
    return block_input_bytes(model, w, shape)


def block_input_bytes(model: ModelSpec, w: Widths, shape: Shape) -> int:
    """What checkpointing keeps per block: its input hidden states."""
    return shape.tokens * model.hidden_size * w.residual
