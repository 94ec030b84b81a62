"""Training speed: FLOPs per token per method, achievable FLOP/s, memory-bound phases, and
communication -> tokens/s, step time, MFU and hours, each as an explainable Breakdown.

Pure: takes a ``ModelShape`` (from a ModelSpec), a ``ComputeJob`` (plain job settings), a
``GpuSpec`` and ``ThroughputAssumptions``. Does not estimate memory (``core.memory``) or cost.
FLOPs convention: a matmul of an m x k by k x n product costs 2mkn; backward costs twice the
forward (activation grads + weight grads); attention scores cost 4 x s x d_attn per token per
layer forward, times a causal factor (0.5 for flash/SDPA, 1 for eager).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.compute.step import step_time
from tuneplan.core.models import LinearRole, ModelSpec
from tuneplan.errors import UnsupportedError
from tuneplan.explain import Breakdown, Term
from tuneplan.units import HOUR_S

if TYPE_CHECKING:
    from tuneplan.core.job.strategy import Strategy

LOW_RANK_METHODS = frozenset({"lora", "dora", "qlora", "lora8bit", "adalora", "loha", "lokr",
                              "vera", "lora-fa", "oft", "boft"})
FROZEN_BASE_METHODS = LOW_RANK_METHODS | {"prefix", "prompt", "p-tuning", "ia3", "adapter",
                                          "llama-adapter", "layernorm"}
METHODS = FROZEN_BASE_METHODS | {"full", "freeze"}


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearShape:
    """One linear of the blocks: ``active`` uses per token (blocks x experts routed to),
    ``stored`` copies held in memory (blocks x all experts)."""

    name: str
    in_features: int
    out_features: int
    active: int
    stored: int
    role: str = "attention"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """What the speed model needs of an architecture."""

    name: str
    total_params: int
    num_layers: int
    hidden_size: int
    attention_dim: int
    vocab_size: int
    linears: tuple[LinearShape, ...]
    causal: bool = True

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

    def adapted_linears(self, targets: tuple[str, ...]) -> list[LinearShape]:
        """The linears LoRA-like adapters wrap: those named in ``targets``, or with
        ``all-linear`` every one but MoE routers and experts."""
        every = "all-linear" in targets
        return [lin for lin in self.linears
                if (every and lin.role not in ("router", "expert")) or lin.name in targets]


def model_shape_from_spec(spec: ModelSpec) -> ModelShape:
    """ModelShape of a ModelSpec: routed experts are active ``experts_per_token`` times."""
    linears: list[LinearShape] = []
    total = spec.embedding_params + spec.final_norm_params + spec.head_params
    for group in spec.layers:
        total += group.params * group.count
        for lin in group.linears:
            routed = lin.role == LinearRole.EXPERT and group.experts_per_token > 0
            per_block = group.experts_per_token if routed else lin.copies
            linears.append(LinearShape(
                name=lin.name, in_features=lin.in_features, out_features=lin.out_features,
                active=group.count * per_block, stored=group.count * lin.copies,
                role=str(lin.role)))
    return ModelShape(
        name=spec.name, total_params=total, num_layers=spec.num_layers,
        hidden_size=spec.hidden_size, attention_dim=spec.num_heads * spec.head_dim,
        vocab_size=spec.vocab_size, linears=tuple(linears))


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeJob:
    """The job settings the speed model reads (CLI job flags, plain values)."""

    method: str = "lora"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("all-linear",)
    trainable_layers: int | None = None
    trainable_modules: tuple[str, ...] = ()
    virtual_tokens: int = 20
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    batch_size: int = 1
    grad_accum: int = 1
    seq_len: int = 2048
    avg_tokens: int | None = None
    packing: bool = False
    gradient_checkpointing: bool = True
    offload_activations: bool = False
    attention: str = "sdpa"
    compile: bool = False
    gpus: int = 1
    nodes: int = 1
    sharding: str = "ddp"
    offload: str = "none"
    recipe: str = "hf"
    task: str = "causal-lm"
    intra_node_link: str = "auto"
    inter_node_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UnsupportedError(f"no speed model for method {self.method!r}; "
                                   f"use one of {', '.join(sorted(METHODS))}")
        for label, value in (("batch-size", self.batch_size), ("grad-accum", self.grad_accum),
                             ("seq-len", self.seq_len), ("gpus", self.gpus),
                             ("nodes", self.nodes), ("lora-rank", self.lora_rank)):
            if value < 1:
                raise UnsupportedError(f"--{label} must be at least 1, got {value}")

    @property
    def ranks(self) -> int:
        return self.gpus * self.nodes

    @property
    def recompute(self) -> bool:
        """Checkpointing (or offloading checkpoints, which also recomputes) adds a forward."""
        return self.gradient_checkpointing or self.offload_activations

    def tokens_per_sequence(self, a: ThroughputAssumptions) -> tuple[int, int]:
        """(real tokens, computed tokens) per sequence: padding when unpacked with avg_tokens;
        prompt tuning and P-tuning prepend ``virtual_tokens`` positions to every sequence."""
        extra = self.virtual_tokens if self.method in ("prompt", "p-tuning") else 0
        if self.avg_tokens is None or self.packing:
            return self.seq_len, self.seq_len + extra
        real = min(self.avg_tokens, self.seq_len)
        return real, min(self.seq_len, round(real * a.padding_factor)) + extra


def adapter_params_per_token(model: ModelShape, job: ComputeJob) -> int:
    """r x (in + out) summed over the adapted linears a token passes (0 for non-LoRA)."""
    if job.method not in LOW_RANK_METHODS:
        return 0
    return sum(job.lora_rank * (lin.in_features + lin.out_features) * lin.active
               for lin in model.adapted_linears(job.lora_targets))


def flops_per_token(model: ModelShape, job: ComputeJob, a: ThroughputAssumptions,
                    context: int) -> Breakdown:
    """FLOPs per token of one training step, unit ``FLOP``; ``recompute/*`` are the terms
    that model FLOPs (MFU) leave out. ``context`` is the attended sequence length."""
    head = model.vocab_size * model.hidden_size
    n = model.matmul_params if job.task == "causal-lm" else model.block_matmul_params
    causal = a.causal_attention_factor if model.causal else 1.0
    factor = a.eager_attention_factor if job.attention == "eager" else causal
    attn = 4 * model.num_layers * context * model.attention_dim * factor
    backprop, weight = _backward_params(model, job)
    adapters = adapter_params_per_token(model, job)
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
                          formula="6 x r x (in + out) summed over adapted linears",
                          inputs={"rank": job.lora_rank, "targets": ",".join(job.lora_targets)},
                          source="low-rank A and B: forward 2, backward 4 (activation + weight)"))
    if "lm_head" in job.trainable_modules and job.method != "full":
        terms.append(Term(path="backward/head-weight-grads", value=2 * head, unit="FLOP",
                          formula="2 x V x h", inputs={"V": model.vocab_size},
                          source="--trainable-modules lm_head trains the head in full"))
    if job.recompute:
        terms.append(Term(path="recompute/forward", value=2 * n + attn + 2 * adapters,
                          unit="FLOP", formula="one more forward (2N + attention + adapters)",
                          inputs={}, source="activation checkpointing recomputes each block"))
    return Breakdown("FLOP", tuple(terms))


def _backward_params(model: ModelShape, job: ComputeJob) -> tuple[int, int]:
    """(params backprop passes through, params that get weight gradients)."""
    n = model.matmul_params if job.task == "causal-lm" else model.block_matmul_params
    head = model.vocab_size * model.hidden_size if job.task == "causal-lm" else 0
    if job.method == "full":
        return n, n
    if job.method == "freeze":
        layers = min(job.trainable_layers or 1, model.num_layers)
        share = model.block_matmul_params * layers // model.num_layers + head
        return share, share
    return n, 0


def model_flops(breakdown: Breakdown) -> float:
    """FLOPs per token that count as useful work (MFU): all terms but recompute."""
    return float(breakdown.total - breakdown.subtotal("recompute"))


def peak_flops_per_s(gpu: GpuSpec, precision: str) -> tuple[float, list[str]]:
    """Dense peak for the precision and notes (no BF16 -> FP16 with loss scaling)."""
    notes: list[str] = []
    if precision == "fp32":
        peak = gpu.fp32_flops_per_s
    elif precision.startswith("fp8") and gpu.supports_fp8 and gpu.fp8_flops_per_s:
        peak = gpu.fp8_flops_per_s
    else:
        if precision.startswith("bf16") and gpu.supports_bf16 is False:
            notes.append(f"{gpu.name} has no BF16 tensor cores: runs FP16 with loss scaling "
                         "at the FP16 peak")
        peak = gpu.bf16_flops_per_s
    if not peak:
        raise UnsupportedError(f"{gpu.name} publishes no {precision} FLOP/s figure; "
                               "pick another --gpu or --precision")
    return peak, notes


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
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        """The JSON document of ``tuneplan throughput``."""
        return {
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "step_seconds": self.step_seconds, "mfu": self.mfu,
            "comm_seconds_per_step": self.comm_seconds_per_step,
            "comm_bytes_per_step_per_gpu": self.comm_bytes_per_step_per_gpu,
            "tokens_per_step": self.tokens_per_step, "hours": self.hours,
            "peak_flops_per_s": self.peak_flops_per_s,
            "flops_per_token": self.flops_per_token.as_dict(), "step": self.step.as_dict(),
            "communication": self.communication.as_dict(), "notes": list(self.notes),
            "assumptions": self.assumptions.describe(),
        }


def estimate_throughput(model: ModelShape, job: ComputeJob, gpu: GpuSpec, *,
                        assumptions: ThroughputAssumptions | None = None,
                        tokens: int | None = None, epochs: float = 1) -> Throughput:
    """Tokens/s, step time, MFU and communication of ``job`` on GPUs of type ``gpu``.

    hours = tokens x epochs / tokens_per_second / 3600 when ``tokens`` is given.
    Raises UnsupportedError for a method or precision the model cannot speak to.
    """
    a = assumptions or ThroughputAssumptions()
    real, computed = job.tokens_per_sequence(a)
    context = job.seq_len if job.packing else computed
    if job.method == "prefix":  # every layer attends to the prefix's keys and values too
        context += job.virtual_tokens
    flops = flops_per_token(model, job, a, context)
    peak, notes = peak_flops_per_s(gpu, job.precision)
    step, comm, comm_s, more = step_time(
        model=model, job=job, gpu=gpu, assumptions=a, peak=peak, flops_per_token=flops.total,
        computed_tokens=computed * job.batch_size)
    step_s = float(step.total)
    tokens_per_step = real * job.batch_size * job.grad_accum * job.ranks
    tps = tokens_per_step / step_s
    computed_per_gpu = computed * job.batch_size * job.grad_accum
    mfu = model_flops(flops) * computed_per_gpu / (step_s * peak)
    hours = None if tokens is None else tokens * epochs / tps / HOUR_S
    return Throughput(
        tokens_per_second=tps, tokens_per_second_per_gpu=tps / job.ranks, step_seconds=step_s,
        mfu=mfu, comm_seconds_per_step=comm_s, comm_bytes_per_step_per_gpu=float(comm.total),
        tokens_per_step=tokens_per_step, hours=hours, flops_per_token=flops, step=step,
        communication=comm, peak_flops_per_s=peak, assumptions=a,
        notes=tuple(notes + more))


def compute_job_from_strategy(strategy: Strategy, *, avg_tokens: int | None = None,
                              intra_node_link: str = "auto",
                              inter_node_bytes_per_s: float | None = None) -> ComputeJob:
    """The speed model's view of the memory model's ``Strategy`` (same job flags)."""
    return ComputeJob(
        method=str(strategy.method), lora_rank=strategy.lora_rank,
        lora_targets=tuple(strategy.lora_targets),
        trainable_layers=strategy.trainable_layers or None,
        trainable_modules=tuple(strategy.trainable_modules),
        virtual_tokens=strategy.num_virtual_tokens, precision=str(strategy.precision),
        optimizer=str(strategy.optimizer), batch_size=strategy.batch_size,
        grad_accum=strategy.grad_accum, seq_len=strategy.seq_len, avg_tokens=avg_tokens,
        packing=strategy.packing, gradient_checkpointing=str(strategy.checkpointing) == "full",
        offload_activations=str(strategy.checkpointing) == "offload",
        attention=str(strategy.attention), compile=strategy.compile, gpus=strategy.gpus,
        nodes=strategy.nodes, sharding=str(strategy.sharding), offload=str(strategy.offload),
        recipe=str(strategy.recipe), task=str(strategy.task), intra_node_link=intra_node_link,
        inter_node_bytes_per_s=inter_node_bytes_per_s)
