"""The fit solver: on one GPU, the largest micro-batch and sequence length per method, and when
a job does not fit, the changes that make it fit, each with its new peak and speed: changes
that keep one GPU first (ranked by the speed they cost), then more GPUs, each labelled with the
nodes it takes.

Pure: uses ``core.memory`` through the planner's cached ``StrategySearch``; "fits" means the
whole-device peak (reserved + context + NCCL) is at most capacity x margin, as in the planner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from tuneplan.core.catalog.hardware import GpuSpec, MemoryFigure
from tuneplan.core.compute.confidence import TimeBasis, time_basis
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import (
    Attention,
    Checkpointing,
    Loss,
    Offload,
    Optimizer,
    Sharding,
    Strategy,
)
from tuneplan.core.memory import MemoryEstimate
from tuneplan.core.memory.refusals import SOFTCAP_MODEL_TYPES
from tuneplan.core.planner.caveats import (
    PrecisionChoice,
    card_notes,
    card_problem,
    precision_on,
    with_layout,
)
from tuneplan.core.planner.search import (
    AUTO_METHODS,
    Node,
    Refused,
    StrategySearch,
    largest_fitting,
    memory_limit,
    on_card_bytes,
    with_paging,
)
from tuneplan.units import GiB

MAX_BATCH = 256
SEQ_STEP = 256            # sequence lengths are searched in multiples of this
NO_LIMIT_SEQ = 131_072    # when a config states no position limit


@dataclass(frozen=True, slots=True, kw_only=True)
class MethodFit:
    """One method on the GPU: its peak at the job's settings and the largest that fit."""

    method: Method
    peak_bytes: int | None           # whole-device peak at the job's batch and seq len
    fits: bool
    largest_batch: int               # at the job's seq len; 0 when not even 1 fits
    largest_seq_len: int             # at micro-batch 1; 0 when not even SEQ_STEP fits
    refusal: str | None = None
    layout: str = ""                 # the tensor dtypes the estimate assumes (caveats)
    #: the step's own whole-device peak where loading (a QLoRA model quantised and prepared
    #: before the first step) peaks higher and ``peak_bytes`` is that loading peak; else None
    step_peak_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Suggestion:
    """One change to the job, the strategy it gives, and its new per-GPU peak."""

    change: str
    strategy: Strategy
    peak_bytes: int
    fits: bool
    host_ram_bytes: int
    scope: str = "one GPU"               # or "multi-GPU: one node of 8 T4", "multi-node: ..."
    gpus: int = 1                        # GPUs in total, all nodes together
    nodes: int = 1
    tokens_per_second: float | None = None   # estimated, all GPUs together
    speed_vs_job: float | None = None        # tokens/s over the job's own on one GPU
    saved_bytes: int | None = None           # the job's peak less this one (None: refused)

    def as_dict(self) -> dict[str, object]:
        return {"change": self.change, "scope": self.scope, "gpus": self.gpus,
                "nodes": self.nodes, "peak_bytes": self.peak_bytes, "fits": self.fits,
                "saved_bytes": self.saved_bytes, "host_ram_bytes": self.host_ram_bytes,
                "tokens_per_second": self.tokens_per_second,
                "speed_vs_job": self.speed_vs_job, "strategy": self.strategy.as_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class FitReport:
    gpu: str
    capacity_bytes: int              # the GPU's usable (CUDA-visible) total
    limit_bytes: int                 # capacity x margin: what a whole-device peak may reach
    base: Strategy
    fits: bool
    methods: tuple[MethodFit, ...]
    suggestions: tuple[Suggestion, ...]
    nominal_bytes: int = 0
    margin: float = 0.0
    usable: MemoryFigure | None = None   # basis, source and confidence of capacity_bytes
    precision: PrecisionChoice | None = None   # asked vs trained in on this GPU, and why
    notes: tuple[str, ...] = ()              # card facts (caveats.card_notes)
    node_gpus: int = 8                       # GPUs one node of this type holds (catalog)
    node_gpus_basis: str = "assumed (an 8-GPU board)"
    #: the suggestions' tokens/s: calibrated (a probe on this GPU) or assumed, and its range
    time_basis: TimeBasis | None = None

    def as_dict(self) -> dict[str, object]:
        basis = self.time_basis
        suggestions = [s.as_dict() | ({} if basis is None or s.tokens_per_second is None else
                                      {"tokens_per_second_range": list(
                                          basis.speed_range(s.tokens_per_second))})
                       for s in self.suggestions]
        return {
            "gpu": self.gpu, "capacity_bytes": self.capacity_bytes,
            "limit_bytes": self.limit_bytes, "nominal_bytes": self.nominal_bytes,
            "margin": self.margin,
            "usable_basis": None if self.usable is None else self.usable.basis,
            "usable_source": None if self.usable is None else self.usable.source,
            "usable_confidence": None if self.usable is None else self.usable.confidence,
            "compared": "whole-device peak (CUDA context, workspaces and allocator reserve "
                        "included) <= capacity_bytes x margin",
            "fits": self.fits,
            "precision": None if self.precision is None else self.precision.as_dict(),
            "notes": list(self.notes), "node_gpus": self.node_gpus,
            "node_gpus_basis": self.node_gpus_basis,
            "strategy": self.base.as_dict(),
            "methods": [{"method": m.method.value, "peak_bytes": m.peak_bytes, "fits": m.fits,
                         "largest_batch_size": m.largest_batch,
                         "largest_seq_len": m.largest_seq_len, "refusal": m.refusal,
                         "layout": m.layout, "step_peak_bytes": m.step_peak_bytes,
                         "binding": "step" if m.step_peak_bytes is None else "loading"}
                        for m in self.methods],
            "suggestions": suggestions,
            "time_basis": None if basis is None else basis.as_dict(),
        }


def fit(search: StrategySearch, gpu: GpuSpec, *, max_gpus: int = 64,
        node_gpus: int = 8, node_gpus_basis: str = "assumed (an 8-GPU board)") -> FitReport:
    """Per method limits on ``gpu`` for ``search.base`` in the precision the GPU trains in
    (``caveats.precision_on``), and changes that make it fit, one-GPU ones first; a peak fits
    when it is at most the GPU's usable (CUDA-visible) total x ``search.margin``. ``node_gpus``
    is the most GPUs of this type one node holds: more GPUs than that are labelled multi-node."""
    capacity = gpu.usable_memory_bytes
    limit = memory_limit(capacity, search.margin)
    gen = gpu.generation
    choice = precision_on(gpu, search.base.precision)
    base = replace(search.base, precision=choice.chosen)
    methods: list[Method] = [base.method] if base.method is not Method.AUTO else []
    methods += [m for m in AUTO_METHODS if m not in methods]
    fits = [_card_fit(_method_fit(search, replace(base, method=m), limit, gen),
                      replace(base, method=m), gpu, choice)
            for m in methods]
    start = replace(base, method=methods[0])
    first = fits[0]
    suggestions = () if first.fits else tuple(
        _suggestions(search, start, gpu, limit, max_gpus, max(1, node_gpus)))
    return FitReport(gpu=gpu.name, capacity_bytes=capacity, limit_bytes=limit, base=start,
                     fits=first.fits, methods=tuple(fits), suggestions=suggestions,
                     nominal_bytes=gpu.memory_bytes, margin=search.margin,
                     usable=gpu.usable_memory, precision=with_layout(choice, start),
                     notes=tuple(card_notes(start, gpu)), node_gpus=max(1, node_gpus),
                     node_gpus_basis=node_gpus_basis,
                     time_basis=time_basis(gpu, start.precision, search.throughput_assumptions))


def _card_fit(found: MethodFit, s: Strategy, gpu: GpuSpec, choice: PrecisionChoice
              ) -> MethodFit:
    """``found`` with its tensor layout, refused where the card cannot run it at all."""
    problem = card_problem(s, gpu)
    out = replace(found, layout=with_layout(choice, s).layout)
    return out if problem is None else replace(out, fits=False, largest_batch=0,
                                               largest_seq_len=0, refusal=problem)


def _peak(search: StrategySearch, s: Strategy, gen: str) -> MemoryEstimate | Refused:
    return search.memory(s, gen)


def _method_fit(search: StrategySearch, s: Strategy, limit: int, gen: str) -> MethodFit:
    est = _peak(search, s, gen)
    if isinstance(est, Refused):
        return MethodFit(method=s.method, peak_bytes=None, fits=False, largest_batch=0,
                         largest_seq_len=0, refusal=est.reason)

    def ok(candidate: Strategy) -> bool:
        found = _peak(search, candidate, gen)
        return not isinstance(found, Refused) and on_card_bytes(found, limit) <= limit

    batch = largest_fitting(lambda b: ok(replace(s, batch_size=b)), 1, MAX_BATCH)
    top = (search.model.max_position_embeddings or NO_LIMIT_SEQ) // SEQ_STEP
    steps = largest_fitting(lambda k: ok(replace(s, batch_size=1, seq_len=k * SEQ_STEP)),
                            1, max(1, top))
    peak = on_card_bytes(est, limit)
    step = on_card_bytes(replace(est, loading_peak_bytes=0), limit)
    return MethodFit(method=s.method, peak_bytes=peak, fits=peak <= limit,
                     largest_batch=max(0, batch), largest_seq_len=max(0, steps) * SEQ_STEP,
                     step_peak_bytes=step if step < peak else None)


#: The change that lets a soft-capping model (Gemma-2) run at all under transformers.
EAGER_CHANGE = "eager attention (--attention eager: SDPA cannot soft-cap Gemma-2's logits)"

#: A one-GPU change: its words and how it turns a strategy into the changed one.
Change = tuple[str, Callable[[Strategy], Strategy]]


def _one_gpu_changes(s: Strategy) -> list[Change]:
    """Changes that keep the job on one card, each one knob (combined below when no single
    one is enough). Shorter sequences and host offload are added by ``_suggestions``."""
    out: list[Change] = []
    if s.checkpointing is Checkpointing.NONE:
        out.append(("gradient checkpointing on",
                    lambda x: replace(x, checkpointing=Checkpointing.FULL)))
    if s.checkpointing is not Checkpointing.OFFLOAD:
        out.append(("offload activation checkpoints to host (--offload-activations)",
                    lambda x: replace(x, checkpointing=Checkpointing.OFFLOAD)))
    if not s.optimizer.is_8bit and s.offload is Offload.NONE:
        out.append(("8-bit optimizer (--optimizer adamw8bit)",
                    lambda x: replace(x, optimizer=Optimizer.ADAMW8BIT)))
    if not s.optimizer.is_paged and s.offload is Offload.NONE:
        out.append(("paged 8-bit optimizer (--optimizer paged-adamw8bit: the state that does "
                    "not fit beside the rest waits in host RAM, paged back for each update)",
                    lambda x: replace(x, optimizer=Optimizer.PAGED_ADAMW8BIT)))
    if s.loss is not Loss.CHUNKED:
        out.append(("chunked cross-entropy (--loss chunked)",
                    lambda x: replace(x, loss=Loss.CHUNKED)))
    if s.method is not Method.QLORA:
        out.append(("QLoRA: 4-bit base weights with LoRA adapters (--method qlora)",
                    lambda x: replace(x, method=Method.QLORA)))
    if s.batch_size > 1:
        out.append(("micro-batch 1 (raise --grad-accum to keep the batch)",
                    lambda x: replace(x, batch_size=1, grad_accum=x.grad_accum * x.batch_size)))
    return out


def _suggestions(search: StrategySearch, s: Strategy, gpu: GpuSpec, limit: int,
                 max_gpus: int, node_gpus: int) -> list[Suggestion]:
    """One-GPU changes first (single knobs, then the cheapest combination when no single one
    fits, shorter sequences, host offload), then more GPUs, labelled with their node count."""
    if search.model.model_type in SOFTCAP_MODEL_TYPES and s.attention is Attention.SDPA:
        # Refused on SDPA (soft-capping): every change starts from eager attention.
        eager = replace(s, attention=Attention.EAGER)
        first = _Context(search=search, gpu=gpu, limit=limit, base=eager).suggest(
            EAGER_CHANGE, eager)
        if first is not None and first.fits:
            return [first]
        return [replace(x, change=f"{EAGER_CHANGE.split(' (')[0]} + {x.change}")
                for x in _suggestions(search, eager, gpu, limit, max_gpus, node_gpus)]
    ctx = _Context(search=search, gpu=gpu, limit=limit, base=s)
    singles = [x for change, apply in _one_gpu_changes(s)
               if (x := ctx.suggest(change, apply(s))) is not None]
    if not any(x.fits for x in singles):
        combined = _combination(ctx, s)
        if combined is not None:
            singles.append(combined)
    seq = _largest_seq(search, s, limit, gpu.generation)
    if seq:
        found = ctx.suggest(f"shorter sequences (--seq-len {seq})", replace(s, seq_len=seq))
        singles += [found] if found else []
    offload = ctx.suggest("ZeRO-3 with optimizer and parameters offloaded to host RAM "
                          "(--sharding zero3 --offload optimizer+params)",
                          replace(s, sharding=Sharding.ZERO3, offload=Offload.OPTIMIZER_PARAMS,
                                  optimizer=_no8bit(s)))
    singles += [offload] if offload else []
    more: list[Suggestion] = []
    for total in _powers(2, max_gpus):
        found = ctx.suggest_spread("ZeRO-3", total, node_gpus,
                                   replace(s, sharding=Sharding.ZERO3, optimizer=_no8bit(s)))
        if found:
            more.append(found)
            if found.fits:
                break
    for total in _powers(2, max_gpus):
        found = ctx.suggest_spread(
            "ZeRO-3 with optimizer and parameters offloaded to host RAM", total, node_gpus,
            replace(s, sharding=Sharding.ZERO3, offload=Offload.OPTIMIZER_PARAMS,
                    optimizer=_no8bit(s)), flags="--offload optimizer+params")
        if found:
            more.append(found)
            if found.fits:
                break
    fitting = [x for x in singles if x.fits]
    fitting.sort(key=_one_gpu_rank)
    fitting += sorted((x for x in more if x.fits), key=lambda x: (x.nodes, x.gpus))
    if fitting:
        return fitting
    closest: dict[str, Suggestion] = {}  # nothing fits: the nearest miss of each kind
    for x in [*singles, *more]:
        kind = x.change.split(" (")[0].split(" over ")[0] + ("" if x.gpus == 1 else " (more)")
        if kind not in closest or x.peak_bytes < closest[kind].peak_bytes:
            closest[kind] = x
    return sorted(closest.values(), key=lambda x: (x.gpus > 1, x.peak_bytes))


def _one_gpu_rank(x: Suggestion) -> tuple[float, int]:
    """Least speed lost first (unknown speed last), then the lower peak."""
    return (-(x.speed_vs_job if x.speed_vs_job is not None else -1.0), x.peak_bytes)


def _combination(ctx: _Context, s: Strategy) -> Suggestion | None:
    """One-GPU changes applied together until the job fits: at each step, the fastest change
    that makes it fit, else the one that saves the most memory (the faster on a tie); then
    every change it can do without is dropped. None when even all of them miss."""
    left = _one_gpu_changes(s)
    chosen: list[Change] = []
    strategy = s
    while left:
        tried = [(c, x) for c in left if (x := ctx.suggest(c[0], c[1](strategy))) is not None]
        if not tried:
            return None
        fitting = [(c, x) for c, x in tried if x.fits]
        pick, _ = (min(fitting, key=lambda cx: _one_gpu_rank(cx[1])) if fitting else min(
            tried, key=lambda cx: (cx[1].peak_bytes, _one_gpu_rank(cx[1]))))
        chosen.append(pick)
        left = [c for c in left if c is not pick]
        strategy = pick[1](strategy)
        if fitting:
            break
    else:
        return None

    def build(changes: list[Change]) -> Strategy:
        out = s
        for _, apply in changes:
            out = apply(out)
        return out

    for item in list(chosen):
        fewer = [c for c in chosen if c is not item]
        if fewer and ctx.fits(build(fewer)):
            chosen = fewer
    if len(chosen) < 2:
        return None  # a single change: already listed
    return ctx.suggest("together: " + " + ".join(_short_change(c) for c, _ in chosen),
                       build(chosen))


def _short_change(change: str) -> str:
    """``QLoRA: 4-bit base ... (--method qlora)`` -> ``QLoRA (--method qlora)``."""
    head, _, flags = change.partition(" (")
    flag = flags.split(",")[0].split(";")[0].rstrip(")")
    return head.split(":")[0] + (f" ({flag})" if flag.startswith("--") else "")


@dataclass(slots=True)
class _Context:
    """What every suggestion is measured against: the GPU, the limit, the job's strategy and
    its speed on one GPU."""

    search: StrategySearch
    gpu: GpuSpec
    limit: int
    base: Strategy
    _base_speed: float | None = None
    _base_peak: int | None = None

    def __post_init__(self) -> None:
        self._base_speed = self.speed(self.base)
        est = _peak(self.search, self.base, self.gpu.generation)
        self._base_peak = None if isinstance(est, Refused) else on_card_bytes(est, self.limit)

    def speed(self, s: Strategy, paged_out: int = 0) -> float | None:
        """Tokens/s of ``s`` on this GPU, a paged optimizer's paging of ``paged_out`` bytes
        per GPU included (``search.with_paging``, as the planner prices it)."""
        node = Node(gpu=self.gpu, gpus_per_node=s.gpus, nodes=s.nodes,
                    capacity_bytes=self.gpu.usable_memory_bytes)
        found = self.search.speed(s, node)
        if isinstance(found, Refused):
            return None
        return with_paging(found, paged_out, self.search.throughput_assumptions
                           ).tokens_per_second

    def fits(self, s: Strategy) -> bool:
        est = _peak(self.search, s, self.gpu.generation)
        return (not isinstance(est, Refused) and on_card_bytes(est, self.limit) <= self.limit
                and card_problem(s, self.gpu) is None)

    def suggest(self, change: str, s: Strategy, scope: str = "one GPU") -> Suggestion | None:
        est = _peak(self.search, s, self.gpu.generation)
        if isinstance(est, Refused) or card_problem(s, self.gpu) is not None:
            return None
        peak = on_card_bytes(est, self.limit)   # a paged optimizer's spill is in host RAM
        speed = self.speed(s, est.device_total_bytes - peak)
        ratio = (speed / self._base_speed if speed is not None and self._base_speed
                 else None)
        return Suggestion(
            change=change, strategy=s, peak_bytes=peak, fits=peak <= self.limit,
            host_ram_bytes=est.host_ram_bytes + (est.device_total_bytes - peak) * s.gpus,
            scope=scope, gpus=s.world_size, nodes=s.nodes, tokens_per_second=speed,
            speed_vs_job=ratio,
            saved_bytes=(None if self._base_peak is None else self._base_peak - peak))

    def suggest_spread(self, what: str, total: int, node_gpus: int, s: Strategy,
                       flags: str = "") -> Suggestion | None:
        per_node = min(total, node_gpus)
        nodes = -(-total // per_node)
        spread = replace(s, gpus=per_node, nodes=nodes)
        name = self.gpu.name
        scope = (f"multi-GPU: one node of {per_node} {name}" if nodes == 1 else
                 f"multi-node: {nodes} nodes x {per_node} {name}")
        args = f"--gpus {per_node}" + (f" --nodes {nodes}" if nodes > 1 else "")
        return self.suggest(f"{what} over {per_node * nodes} GPUs ({args} --sharding zero3"
                            + (f" {flags}" if flags else "") + ")", spread, scope=scope)


def _no8bit(s: Strategy) -> Optimizer:
    return Optimizer.ADAMW if s.optimizer.is_8bit else s.optimizer


def _powers(start: int, limit: int) -> list[int]:
    out, n = [], start
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def _largest_seq(search: StrategySearch, s: Strategy, limit: int, gen: str) -> int:
    def ok(k: int) -> bool:
        found = _peak(search, replace(s, seq_len=k * SEQ_STEP), gen)
        return not isinstance(found, Refused) and on_card_bytes(found, limit) <= limit

    top = max(1, (s.seq_len - 1) // SEQ_STEP)
    return max(0, largest_fitting(ok, 1, top)) * SEQ_STEP


def describe_suggestions(report: FitReport, limit: int = 4) -> str:
    """The suggestions in one line: ``change [scope] (peak X GiB[, host RAM Y GiB])``."""
    parts = []
    for s in report.suggestions[:limit]:
        text = s.change + ("" if s.gpus == 1 else f" [{s.scope}]")
        text += f" (peak {s.peak_bytes / GiB:.1f} GiB"
        if s.strategy.offload is not Offload.NONE:
            text += f", host RAM {s.host_ram_bytes / GiB:,.0f} GiB"
        parts.append(text + (")" if s.fits else ", still too big)"))
    return "; ".join(parts)
