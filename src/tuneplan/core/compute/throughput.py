"""Training speed: FLOPs per token per method, achievable FLOP/s, memory-bound phases, and
communication -> tokens/s, step time, MFU and hours, each as an explainable Breakdown.

Pure: takes a ``ModelShape`` (a cached view of a ModelSpec) or the ModelSpec itself, the job's
``Strategy``, a ``GpuSpec`` and ``ThroughputAssumptions``; the Job's ``avg_tokens`` and the
node's ``NodeLinks`` come as keyword arguments. Which linears carry adapters, and how many
parameters train, is the memory model's rule (``core.job.methods.targeted_linears`` and
``count_trainable``, PEFT 0.21). Does not estimate memory (``core.memory``) or cost.
FLOPs convention: a matmul of an m x k by k x n product costs 2mkn; backward costs twice the
forward (activation grads + weight grads); attention scores cost 4 x s x d_attn per token per
layer forward, times a causal factor (0.5 for flash/SDPA, 1 for eager).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute import seq2seq, unsloth
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.communication import NodeLinks
from tuneplan.core.compute.confidence import TimeBasis, time_basis
from tuneplan.core.compute.step import (
    COMPUTE_TERMS,
    FITTED_SLOWDOWN,
    MicroBatch,
    recomputes,
    step_time,
)
from tuneplan.core.job.methods import (
    ESTIMATED_METHODS,
    ESTIMATED_QUANTS,
    Method,
    context_problem,
    effective_quant,
    fused_qkv_note,
    lora_rank_of,
    outer_targets,
    targeted_linears,
)
from tuneplan.core.job.strategy import Attention, Checkpointing, Precision, Strategy, Task
from tuneplan.core.job.tuners import TUNER_METHODS
from tuneplan.core.models import LinearRole, ModelSpec
from tuneplan.core.models.latent import score_dim
from tuneplan.core.models.provenance import structure_note
from tuneplan.errors import UnsupportedError
from tuneplan.explain import Breakdown, Term
from tuneplan.units import HOUR_S


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearShape:
    """One linear of the blocks: ``active`` uses per token (blocks x experts routed to),
    ``stored`` copies held in memory (blocks x all experts)."""

    name: str
    in_features: int
    out_features: int
    active: int
    stored: int
    role: LinearRole = LinearRole.ATTENTION


@dataclass(frozen=True, slots=True, kw_only=True)
class AdaptedLinear:
    """A linear that carries an adapter (``targeted_linears``) at PEFT's ``rank`` for it:
    ``active`` copies a token passes through, ``stored`` copies trained, ``modules`` adapter
    modules the host launches (a fused expert parameter is one ``ParamWrapper`` per block)."""

    name: str
    in_features: int
    out_features: int
    rank: int
    active: int
    stored: int
    modules: int
    role: LinearRole = LinearRole.ATTENTION


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ModelShape:
    """What the speed model needs of an architecture: a view of ``spec`` computed once (build
    it with ``model_shape_from_spec``). Adapter targets and trainable counts are not part of
    the view: they come from ``spec`` through ``core.job.methods`` (cached per strategy)."""

    spec: ModelSpec
    total_params: int
    num_layers: int
    hidden_size: int
    attention_dim: int
    vocab_size: int
    linears: tuple[LinearShape, ...]
    causal: bool = True
    _cache: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def block_matmul_params(self) -> int:
        """Weights in the blocks' matmuls that one token passes through."""
        return sum(lin.in_features * lin.out_features * lin.active for lin in self.linears)

    @property
    def matmul_params(self) -> int:
        """N of 6N: block matmuls per token plus the output head (tied or not)."""
        return self.block_matmul_params + self.vocab_size * self.hidden_size

    @property
    def stored_block_params(self) -> int:
        return sum(lin.in_features * lin.out_features * lin.stored for lin in self.linears)


def model_shape_from_spec(spec: ModelSpec) -> ModelShape:
    """ModelShape of a ModelSpec: routed experts are active ``experts_per_token`` times;
    bidirectional (not causal) when every block is an encoder block."""
    linears: list[LinearShape] = []
    total = spec.embedding_params + spec.final_norm_params + spec.head_params
    for group in spec.layers:
        total += group.params * group.count
        for lin in group.linears:
            linears.append(LinearShape(
                name=lin.name, in_features=lin.in_features, out_features=lin.out_features,
                active=group.count * _active_copies(lin.role, lin.copies, group.experts_per_token),
                stored=group.count * lin.copies, role=lin.role))
    return ModelShape(
        spec=spec, total_params=total, num_layers=spec.num_layers,
        hidden_size=spec.hidden_size, attention_dim=score_dim(spec),
        vocab_size=spec.vocab_size, linears=tuple(linears),
        causal=not spec.layers or any(group.kind != "encoder" for group in spec.layers))


def _active_copies(role: LinearRole, copies: int, experts_per_token: int) -> int:
    routed = role is LinearRole.EXPERT and experts_per_token > 0
    return experts_per_token if routed else copies


def as_shape(model: ModelShape | ModelSpec) -> ModelShape:
    """``model`` as a ModelShape (a ModelSpec is viewed afresh; pass a ModelShape to reuse
    its caches across calls)."""
    return model if isinstance(model, ModelShape) else model_shape_from_spec(model)


def adapted_linears(model: ModelShape, strategy: Strategy) -> tuple[AdaptedLinear, ...]:
    """The linears low-rank adapters wrap under ``strategy``: ``targeted_linears`` of every
    block group (PEFT 0.21, MoE routers and fused experts included where PEFT wraps them),
    each at ``lora_rank_of`` (2r on fused gate_up experts). Empty for other methods."""
    if not strategy.method.is_low_rank:
        return ()
    key = ("adapted", strategy.lora_targets, strategy.lora_rank, strategy.method,
           strategy.task, strategy.trainable_modules)
    found = model._cache.get(key)
    if found is None:
        spec, out = model.spec, []
        # LoRA on the output head or the embedding (``outer_targets``): the head's is a
        # matmul every token passes through; the embedding's A is a row lookup (no FLOPs)
        # and its r x H product with B is left out of the FLOPs.
        for lin in outer_targets(spec, strategy):
            head = lin.role is LinearRole.OUTPUT_HEAD
            out.append(AdaptedLinear(
                name=lin.name, in_features=lin.in_features, out_features=lin.out_features,
                rank=strategy.lora_rank, active=1 if head else 0, stored=1, modules=1,
                role=lin.role))
        for group in spec.layers:
            for lin in targeted_linears(spec, strategy, group):
                expert = lin.role is LinearRole.EXPERT
                out.append(AdaptedLinear(
                    name=lin.name, in_features=lin.in_features, out_features=lin.out_features,
                    rank=lora_rank_of(lin, strategy),
                    active=group.count * _active_copies(lin.role, lin.copies,
                                                        group.experts_per_token),
                    stored=group.count * lin.copies,
                    modules=group.count * (1 if expert else lin.copies), role=lin.role))
        found = model._cache[key] = tuple(out)
    assert isinstance(found, tuple)
    return found


def adapter_params(model: ModelShape, strategy: Strategy) -> tuple[int, int]:
    """(per token, stored) low-rank adapter weights: rank x (in + out) summed over the adapted
    linears, counted by ``active`` copies (the FLOPs) and by ``stored`` copies (what trains)."""
    adapted = adapted_linears(model, strategy)
    return (sum(a.rank * (a.in_features + a.out_features) * a.active for a in adapted),
            sum(a.rank * (a.in_features + a.out_features) * a.stored for a in adapted))


def tokens_per_sequence(strategy: Strategy, avg_tokens: int | None,
                        a: ThroughputAssumptions) -> tuple[int, int]:
    """(real tokens, computed tokens) per sequence: padding when unpacked with avg_tokens;
    prompt tuning and P-tuning prepend ``num_virtual_tokens`` positions to every sequence."""
    extra = strategy.num_virtual_tokens if strategy.method.adds_virtual_tokens else 0
    if avg_tokens is None or strategy.packing:
        return strategy.seq_len, strategy.seq_len + extra
    real = min(avg_tokens, strategy.seq_len)
    return real, min(strategy.seq_len, round(real * a.padding_factor)) + extra


def _unmodelled(s: Strategy, model: ModelShape) -> list[str]:
    """What the speed model takes as it is and does not time, said where it applies, so a
    flag that leaves tokens/s unchanged is seen to be read."""
    out = []
    if s.method in TUNER_METHODS and s.method.is_low_rank:
        out.append(f"--method {s.method.value}: its adapter FLOPs are timed as LoRA's over "
                   "the same targets at --lora-rank (the tuner's own kernels, e.g. a "
                   "materialised update or FFTs, are not timed); its trainable count is "
                   "peft's (core/job/tuners.py)")
    elif s.method in TUNER_METHODS:
        out.append(f"--method {s.method.value}: timed as the frozen model (plus any virtual "
                   "tokens); its own small modules are not timed")
    elif s.method not in ESTIMATED_METHODS and s.method.is_low_rank:
        out.append(f"--method {s.method.value}: timed as LoRA over the same targets and rank "
                   "(its own kernels are not modelled; memory does not estimate it)")
    elif s.method not in ESTIMATED_METHODS:
        out.append(f"--method {s.method.value}: timed as the frozen model with one hidden-size "
                   "vector per block training (memory does not estimate it)")
    if s.recipe.value == "unsloth":
        out.append(unsloth.note(model, s))
    elif s.recipe.value != "hf":
        out.append(f"--recipe {s.recipe.value}: timed with the same kernels as hf but its "
                   "loss (micro-batch/loss: its default and fused cross-entropy); its other "
                   "kernels (norms, rotary, activations) are not modelled")
    if s.checkpointing is Checkpointing.OFFLOAD and not unsloth.fast_path(model, s):
        out.append("--offload-activations: the host copies of the checkpoints are assumed to "
                   "overlap with compute (no PCIe time added)")
    return out


def check_speed_strategy(strategy: Strategy) -> None:
    """Refuse what the speed model cannot speak to (UnsupportedError)."""
    if strategy.method is Method.AUTO:
        raise UnsupportedError("no speed model for method 'auto': the planner picks a method; "
                               "name one of " + ", ".join(m.value for m in Method
                                                          if m is not Method.AUTO))
    if strategy.lora_rank < 1:
        raise UnsupportedError(f"--lora-rank must be at least 1, got {strategy.lora_rank}")
    quant = effective_quant(strategy)
    if quant is not None and quant not in ESTIMATED_QUANTS:
        raise UnsupportedError(f"--quant {quant.value} is not modelled (no speed or memory "
                               "estimate); use nf4, fp4, int8 or gptq-int4")


def flops_per_token(model: ModelShape | ModelSpec, strategy: Strategy, a: ThroughputAssumptions,
                    context: int) -> Breakdown:
    """FLOPs per token of one training step, unit ``FLOP``; ``recompute/*`` are the terms
    that model FLOPs (MFU) leave out. ``context`` is the attended sequence length."""
    model = as_shape(model)
    s = strategy
    head = model.vocab_size * model.hidden_size
    n = model.matmul_params if s.task is Task.CAUSAL_LM else model.block_matmul_params
    causal = a.causal_attention_factor if model.causal else 1.0
    factor = a.eager_attention_factor if s.attention is Attention.EAGER else causal
    attn = 4 * model.num_layers * context * model.attention_dim * factor
    if model.spec.is_encoder_decoder:   # encoder self + decoder self + cross attention
        factor = seq2seq.attention_layers(model.spec, causal, s.attention is Attention.EAGER,
                                          a.eager_attention_factor) / model.num_layers
        attn = 4 * model.num_layers * context * model.attention_dim * factor
    backprop, weight = _backward_params(model, s)
    adapters, adapters_stored = adapter_params(model, s)
    terms = [
        Term(path="forward/matmuls", value=2 * n, unit="FLOP", formula="2 x N",
             inputs={"N": n}, source="N = block matmul weights used per token + output head"),
        Term(path="forward/attention", value=attn, unit="FLOP",
             formula="4 x L x s x d_attn x causal_factor",
             inputs={"L": model.num_layers, "s": context, "d_attn": model.attention_dim,
                     "causal_factor": factor}, source="QK^T and AV score products"),
        Term(path="backward/activation-grads", value=2 * backprop, unit="FLOP",
             formula="2 x N_backprop", inputs={"N_backprop": backprop},
             source="grad of each input through every layer above the lowest trainable one"),
        Term(path="backward/weight-grads", value=2 * weight, unit="FLOP",
             formula="2 x N_trainable", inputs={"N_trainable": weight},
             source="frozen weights need no weight gradient (LoRA/QLoRA: 0)"),
        Term(path="backward/attention", value=2 * attn * backprop / n if n else 0, unit="FLOP",
             formula="2 x forward attention x N_backprop/N", inputs={},
             source="attention has no weights: its backward is twice its forward"),
    ]
    if adapters:
        terms.append(Term(path="adapters", value=6 * adapters, unit="FLOP",
                          formula="6 x rank x (in + out) x active copies, summed over adapted "
                                  "linears",
                          inputs={"rank": s.lora_rank, "targets": ",".join(s.lora_targets),
                                  "adapter_params_per_token": adapters,
                                  "adapter_params": adapters_stored},
                          source="low-rank A and B: forward 2, backward 4 (activation + weight); "
                                 "targets as PEFT 0.21 wraps them (core.job.methods), routed "
                                 "experts by the tokens routed to them, 2r on fused gate_up"))
    if "lm_head" in s.trainable_modules and s.method is not Method.FULL:
        terms.append(Term(path="backward/head-weight-grads", value=2 * head, unit="FLOP",
                          formula="2 x V x h", inputs={"V": model.vocab_size},
                          source="--trainable-modules lm_head trains the head in full"))
    if recomputes(s):
        terms.append(Term(path="recompute/forward", value=2 * n + attn + 2 * adapters,
                          unit="FLOP", formula="one more forward (2N + attention + adapters)",
                          inputs={}, source="activation checkpointing recomputes each block"))
    return Breakdown("FLOP", tuple(terms))


def _backward_params(model: ModelShape, strategy: Strategy) -> tuple[int, int]:
    """(params backprop passes through, params that get weight gradients)."""
    causal_lm = strategy.task is Task.CAUSAL_LM
    n = model.matmul_params if causal_lm else model.block_matmul_params
    head = model.vocab_size * model.hidden_size if causal_lm else 0
    if strategy.method is Method.FULL:
        return n, n
    if strategy.method is Method.FREEZE:
        layers = min(strategy.trainable_layers or 1, model.num_layers)
        share = model.block_matmul_params * layers // model.num_layers + head
        return share, share
    if strategy.method is Method.LISA:
        # the embedding always trains, so backprop runs through every block; weight
        # gradients only for the K active blocks and the head
        layers = min(strategy.lisa_layers, model.num_layers)
        return n, model.block_matmul_params * layers // model.num_layers + head
    return n, 0


def model_flops(breakdown: Breakdown) -> float:
    """FLOPs per token that count as useful work (MFU): all terms but recompute."""
    return float(breakdown.total - breakdown.subtotal("recompute"))


def peak_flops_per_s(gpu: GpuSpec, precision: Precision) -> tuple[float, list[str]]:
    """Dense peak for the precision and notes (no BF16 -> FP16 with loss scaling)."""
    notes: list[str] = []
    if precision is Precision.FP32:
        peak = gpu.fp32_flops_per_s
    else:
        bf16 = precision in (Precision.BF16, Precision.BF16_MIXED)
        if bf16 and gpu.supports_bf16 is False:
            notes.append(f"{gpu.name} has no BF16 tensor cores: runs FP16 with loss scaling "
                         "at the FP16 peak")
        peak = gpu.bf16_flops_per_s
    if not peak:
        raise UnsupportedError(f"{gpu.name} publishes no {precision} FLOP/s figure; "
                               "pick another --gpu or --precision")
    return peak, notes


#: Which limit each step term belongs to (terms not listed are bandwidth-bound: memory).
_BOUND_OF = {**dict.fromkeys(COMPUTE_TERMS, "compute"),
             "step/galore-projection": "compute", "step/galore-svd-amortised": "compute",
             "step/communication-exposed": "communication",
             "micro-batch/host-overhead-exposed": "host",
             "micro-batch/param-offload-exposed": "host", "step/optimizer-offloaded": "host",
             unsloth.OFFLOAD_TERM: "host"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """Speed of one job on one GPU type: every figure named with its unit."""

    tokens_per_second: float
    tokens_per_second_per_gpu: float
    step_seconds: float
    mfu: float
    comm_seconds_per_step: float
    comm_bytes_per_step_per_gpu: float
    tokens_per_step: int
    hours: float | None
    flops_per_token: Breakdown
    step: Breakdown
    communication: Breakdown
    peak_flops_per_s: float
    assumptions: ThroughputAssumptions
    #: calibrated (a probe on this GPU) or assumed, with the range of the model's error
    time_basis: TimeBasis
    notes: tuple[str, ...] = field(default=())

    @property
    def bound(self) -> str:
        """What limits the step: ``compute`` (matmuls), ``memory`` (bandwidth-bound phases:
        dequantization, DoRA norms, the optimizer), ``communication`` (exposed collectives),
        or ``host`` (kernel launches, host copies, CPU Adam): the largest share of the step."""
        return max(self.bound_seconds().items(), key=lambda kv: kv[1])[0]

    def bound_seconds(self) -> dict[str, float]:
        """Seconds of the step per kind of limit (see ``bound``); the fitted multi-node
        slowdown (``FITTED_SLOWDOWN``) is spread over the others in proportion."""
        out = {"compute": 0.0, "memory": 0.0, "communication": 0.0, "host": 0.0}
        fitted = 0.0
        for term in self.step:
            if term.path == FITTED_SLOWDOWN:  # a share of the whole step, not one limit
                fitted += float(term.value)
                continue
            out[_BOUND_OF.get(term.path, "memory")] += float(term.value)
        rest = sum(out.values())
        if fitted and rest > 0:
            out = {k: v * (1 + fitted / rest) for k, v in out.items()}
        return out

    def as_dict(self) -> dict[str, object]:
        """The JSON document of ``tuneplan throughput``."""
        return {
            "bound": self.bound, "bound_seconds": self.bound_seconds(),
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "step_seconds": self.step_seconds, "mfu": self.mfu,
            "comm_seconds_per_step": self.comm_seconds_per_step,
            "comm_bytes_per_step_per_gpu": self.comm_bytes_per_step_per_gpu,
            "tokens_per_step": self.tokens_per_step, "hours": self.hours,
            "peak_flops_per_s": self.peak_flops_per_s,
            "flops_per_token": self.flops_per_token.as_dict(), "step": self.step.as_dict(),
            "communication": self.communication.as_dict(), "notes": list(self.notes),
            "time_basis": self.time_basis.as_dict(
                tokens_per_second=self.tokens_per_second, step_seconds=self.step_seconds,
                hours=self.hours),
            "assumptions": self.assumptions.describe(),
        }


def estimate_throughput(model: ModelShape | ModelSpec, strategy: Strategy, gpu: GpuSpec, *,
                        avg_tokens: int | None = None, links: NodeLinks | None = None,
                        assumptions: ThroughputAssumptions | None = None,
                        tokens: int | None = None, epochs: float = 1) -> Throughput:
    """Tokens/s, step time, MFU and communication of ``strategy`` on GPUs of type ``gpu``.

    ``avg_tokens`` is the Job's real tokens per unpacked sequence (None: every sequence fills
    ``seq_len``); ``links`` the node's links (None: ``NodeLinks()``, chosen from the GPU).
    hours = tokens x epochs / tokens_per_second / 3600 when ``tokens`` is given.
    Raises UnsupportedError for a method, precision or target the model cannot speak to.
    """
    check_speed_strategy(strategy)
    shape = as_shape(model)
    if shape.spec.extra.get("state_space"):
        raise UnsupportedError(f"{shape.spec.model_type} has state-space (Mamba-style) mixer "
                               "blocks: their scan FLOPs and time are not modelled")
    context_limit = context_problem(shape.spec, strategy)
    if context_limit:
        raise UnsupportedError(context_limit)
    s = strategy
    a = assumptions or ThroughputAssumptions()
    real, computed = tokens_per_sequence(s, avg_tokens, a)
    context = s.seq_len if s.packing else computed
    if s.method is Method.PREFIX:  # every layer attends to the prefix's keys and values too
        context += s.num_virtual_tokens
    flops = flops_per_token(shape, s, a, context)
    peak, notes = peak_flops_per_s(gpu, s.precision)
    fused = fused_qkv_note(shape.spec, s)
    notes += [fused] if fused else []
    structure = structure_note(shape.spec)
    notes += [structure] if structure else []
    notes += _unmodelled(s, shape)
    attention = float(flops.value("forward/attention") + flops.value("backward/attention"))
    if recomputes(s):
        attention += float(flops.value("forward/attention"))
    computed_mb = computed * s.batch_size
    # one forward: the forward terms and the adapters' forward third (2 of their 6 FLOPs)
    forward = float(flops.subtotal("forward")) + float(flops.subtotal("adapters")) / 3
    micro = MicroBatch(flops=float(flops.total) * computed_mb,
                       attention_flops=attention * computed_mb, sequences=s.batch_size,
                       context=context, tokens=computed_mb, forward_flops=forward * computed_mb)
    step, comm, comm_s, more = step_time(
        model=shape, strategy=s, links=links or NodeLinks(), gpu=gpu, assumptions=a, peak=peak,
        micro_batch=micro)
    step_s = float(step.total)
    tokens_per_step = real * s.batch_size * s.grad_accum * s.world_size
    tps = tokens_per_step / step_s
    computed_per_gpu = computed * s.batch_size * s.grad_accum
    mfu = model_flops(flops) * computed_per_gpu / (step_s * peak)
    hours = None if tokens is None else tokens * epochs / tps / HOUR_S
    return Throughput(
        tokens_per_second=tps, tokens_per_second_per_gpu=tps / s.world_size,
        step_seconds=step_s, mfu=mfu, comm_seconds_per_step=comm_s,
        comm_bytes_per_step_per_gpu=float(comm.total), tokens_per_step=tokens_per_step,
        hours=hours, flops_per_token=flops, step=step, communication=comm,
        peak_flops_per_s=peak, assumptions=a, time_basis=time_basis(gpu, s.precision, a),
        notes=tuple(notes + more))
