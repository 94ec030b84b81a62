"""The fit solver: on one GPU, the largest micro-batch and sequence length per method, and when
a job does not fit, the cheapest single changes that make it fit, each with its new peak.

Pure: uses ``core.memory`` through the planner's cached ``StrategySearch``; "fits" means the
whole-device peak (reserved + context + NCCL) is at most capacity x margin, as in the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuneplan.core.catalog.hardware import GpuSpec, MemoryFigure
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Checkpointing, Loss, Offload, Optimizer, Sharding, Strategy
from tuneplan.core.memory import MemoryEstimate
from tuneplan.core.planner.search import (
    AUTO_METHODS,
    Refused,
    StrategySearch,
    largest_fitting,
    memory_limit,
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Suggestion:
    """One change to the job, the strategy it gives, and its new per-GPU peak."""

    change: str
    strategy: Strategy
    peak_bytes: int
    fits: bool
    host_ram_bytes: int


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

    def as_dict(self) -> dict[str, object]:
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
            "strategy": self.base.as_dict(),
            "methods": [{"method": m.method.value, "peak_bytes": m.peak_bytes, "fits": m.fits,
                         "largest_batch_size": m.largest_batch,
                         "largest_seq_len": m.largest_seq_len, "refusal": m.refusal}
                        for m in self.methods],
            "suggestions": [{"change": s.change, "peak_bytes": s.peak_bytes, "fits": s.fits,
                             "host_ram_bytes": s.host_ram_bytes,
                             "strategy": s.strategy.as_dict()} for s in self.suggestions],
        }


def fit(search: StrategySearch, gpu: GpuSpec, *, max_gpus: int = 64) -> FitReport:
    """Per method limits on ``gpu`` for ``search.base``, and changes that make it fit: a
    peak fits when it is at most the GPU's usable (CUDA-visible) total x ``search.margin``."""
    capacity = gpu.usable_memory_bytes
    limit = memory_limit(capacity, search.margin)
    gen = gpu.generation
    base = search.base
    methods: list[Method] = [base.method] if base.method is not Method.AUTO else []
    methods += [m for m in AUTO_METHODS if m not in methods]
    fits = [_method_fit(search, replace(base, method=m), limit, gen) for m in methods]
    start = replace(base, method=methods[0])
    first = fits[0]
    suggestions = () if first.fits else tuple(_suggestions(search, start, limit, gen, max_gpus))
    return FitReport(gpu=gpu.name, capacity_bytes=capacity, limit_bytes=limit, base=start,
                     fits=first.fits, methods=tuple(fits), suggestions=suggestions,
                     nominal_bytes=gpu.memory_bytes, margin=search.margin,
                     usable=gpu.usable_memory)


def _peak(search: StrategySearch, s: Strategy, gen: str) -> MemoryEstimate | Refused:
    return search.memory(s, gen)


def _method_fit(search: StrategySearch, s: Strategy, limit: int, gen: str) -> MethodFit:
    est = _peak(search, s, gen)
    if isinstance(est, Refused):
        return MethodFit(method=s.method, peak_bytes=None, fits=False, largest_batch=0,
                         largest_seq_len=0, refusal=est.reason)

    def ok(candidate: Strategy) -> bool:
        found = _peak(search, candidate, gen)
        return not isinstance(found, Refused) and found.device_total_bytes <= limit

    batch = largest_fitting(lambda b: ok(replace(s, batch_size=b)), 1, MAX_BATCH)
    top = (search.model.max_position_embeddings or NO_LIMIT_SEQ) // SEQ_STEP
    steps = largest_fitting(lambda k: ok(replace(s, batch_size=1, seq_len=k * SEQ_STEP)),
                            1, max(1, top))
    return MethodFit(method=s.method, peak_bytes=est.device_total_bytes,
                     fits=est.device_total_bytes <= limit, largest_batch=max(0, batch),
                     largest_seq_len=max(0, steps) * SEQ_STEP)


def _single_changes(s: Strategy) -> list[tuple[str, Strategy]]:
    out: list[tuple[str, Strategy]] = []
    if s.checkpointing is Checkpointing.NONE:
        out.append(("gradient checkpointing on", replace(s, checkpointing=Checkpointing.FULL)))
    if s.checkpointing is not Checkpointing.OFFLOAD:
        out.append(("offload activation checkpoints to host (--offload-activations)",
                    replace(s, checkpointing=Checkpointing.OFFLOAD)))
    if not s.optimizer.is_8bit and s.offload is Offload.NONE:
        out.append(("8-bit optimizer (--optimizer adamw8bit)",
                    replace(s, optimizer=Optimizer.ADAMW8BIT)))
    if s.loss is not Loss.CHUNKED:
        out.append(("chunked cross-entropy (--loss chunked)", replace(s, loss=Loss.CHUNKED)))
    if s.method is not Method.QLORA:
        out.append(("QLoRA: 4-bit base weights with LoRA adapters (--method qlora)",
                    replace(s, method=Method.QLORA)))
    if s.batch_size > 1:
        out.append(("micro-batch 1 (raise --grad-accum to keep the batch)",
                    replace(s, batch_size=1, grad_accum=s.grad_accum * s.batch_size)))
    return out


def _suggestions(search: StrategySearch, s: Strategy, limit: int, gen: str,
                 max_gpus: int) -> list[Suggestion]:
    out: list[Suggestion] = []
    for change, candidate in _single_changes(s):
        _add(out, search, change, candidate, limit, gen)
    seq = _largest_seq(search, s, limit, gen)
    if seq:
        _add(out, search, f"shorter sequences (--seq-len {seq})", replace(s, seq_len=seq),
             limit, gen)
    for gpus in _powers(2, max_gpus):
        sharded = replace(s, gpus=gpus, sharding=Sharding.ZERO3, optimizer=_no8bit(s))
        if _add(out, search, f"ZeRO-3 over {gpus} GPUs (--gpus {gpus} --sharding zero3)",
                sharded, limit, gen):
            break
    for gpus in _powers(1, max_gpus):
        offload = replace(s, gpus=gpus, sharding=Sharding.ZERO3,
                          offload=Offload.OPTIMIZER_PARAMS, optimizer=_no8bit(s))
        if _add(out, search, f"ZeRO-3 with optimizer and parameters offloaded to host RAM on "
                f"{gpus} GPU{'s' if gpus > 1 else ''}", offload, limit, gen):
            break
    fitting = [x for x in out if x.fits]
    if fitting:
        return fitting
    closest: dict[str, Suggestion] = {}  # nothing fits: the nearest miss of each kind
    for x in out:
        kind = x.change.split(" (")[0].split(" over ")[0].split(" on ")[0]
        if kind not in closest or x.peak_bytes < closest[kind].peak_bytes:
            closest[kind] = x
    return sorted(closest.values(), key=lambda x: x.peak_bytes)


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
        return not isinstance(found, Refused) and found.device_total_bytes <= limit

    top = max(1, (s.seq_len - 1) // SEQ_STEP)
    return max(0, largest_fitting(ok, 1, top)) * SEQ_STEP


def _add(out: list[Suggestion], search: StrategySearch, change: str, s: Strategy, limit: int,
         gen: str) -> bool:
    est = _peak(search, s, gen)
    if isinstance(est, Refused):
        return False
    fits = est.device_total_bytes <= limit
    out.append(Suggestion(change=change, strategy=s, peak_bytes=est.device_total_bytes,
                          fits=fits, host_ram_bytes=est.host_ram_bytes))
    return fits


def describe_suggestions(report: FitReport, limit: int = 4) -> str:
    """The suggestions in one line: ``change (peak X GiB[, host RAM Y GiB])``."""
    parts = []
    for s in report.suggestions[:limit]:
        text = f"{s.change} (peak {s.peak_bytes / GiB:.1f} GiB"
        if s.strategy.offload is not Offload.NONE:
            text += f", host RAM {s.host_ram_bytes / GiB:,.0f} GiB"
        parts.append(text + (")" if s.fits else ", still too big)"))
    return "; ".join(parts)
