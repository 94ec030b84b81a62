"""Run and present a memory estimate for the CLI: resolve model and GPU, build the JSON
document of docs/CLI.md, and render terms in words for ``tuneplan explain``. No maths here.
"""

from __future__ import annotations

from typing import Any

from tuneplan.core.catalog.hardware import GpuSpec, usable_phrase
from tuneplan.core.memory import MemoryAssumptions, MemoryEstimate, estimate_memory
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.search import DEFAULT_MEMORY_MARGIN, memory_limit
from tuneplan.service.jobs import JobRequest
from tuneplan.units import format_bytes


def run_memory(request: JobRequest, model: ModelSpec | None = None,
               assumptions: MemoryAssumptions | None = None
               ) -> tuple[MemoryEstimate, ModelSpec, GpuSpec | None]:
    """(estimate, model spec, gpu spec or None) for a request (or a model already resolved).

    ``assumptions`` replaces the GPU's calibrated (or default) constants when given (the
    accuracy benchmark's refits)."""
    from tuneplan.adapters.calibration import calibration_for
    from tuneplan.adapters.hub import resolve_model

    job = request.job()
    model = model or resolve_model(request.model)
    gpu = None
    if job.gpu:
        from tuneplan.adapters.bundled import resolve_gpu_spec

        gpu = resolve_gpu_spec(job.gpu)
    generation = gpu.generation if gpu else None
    # A saved CUDA probe on this GPU replaces the hardware-only constants.
    if assumptions is None:
        assumptions = calibration_for(gpu).memory
    return estimate_memory(model, job.strategy, assumptions, generation=generation), model, gpu


def memory_limit_bytes(gpu: GpuSpec) -> int:
    """What a whole-device peak may reach on ``gpu``: its usable (CUDA-visible) total x the
    planner's margin (``DEFAULT_MEMORY_MARGIN``), as ``tuneplan plan`` and ``fit`` compare."""
    return memory_limit(gpu.usable_memory_bytes, DEFAULT_MEMORY_MARGIN)


def gpu_memory_part(gpu: GpuSpec) -> dict[str, Any]:
    """The GPU's memory figures and the comparison made (``memory`` / ``fit`` JSON)."""
    return {"name": gpu.name, **gpu.memory_record(), "margin": DEFAULT_MEMORY_MARGIN,
            "limit_bytes": memory_limit_bytes(gpu),
            "compared": "whole-device peak (CUDA context, workspaces and allocator reserve "
                        "included) <= usable_bytes x margin"}


def memory_document(est: MemoryEstimate, model: ModelSpec, gpu: GpuSpec | None
                    ) -> dict[str, Any]:
    """The JSON document of docs/CLI.md for ``tuneplan memory --json``: ``fits`` and
    ``headroom_bytes`` compare the whole-device peak (the loading peak where it is larger)
    with ``gpu.limit_bytes``."""
    fits = None
    if gpu is not None:
        fits = {gpu.name: est.fits(memory_limit_bytes(gpu))}
    return {
        "model": {"name": model.name, "model_type": model.model_type,
                  "num_layers": model.num_layers, "hidden_size": model.hidden_size,
                  "vocab_size": model.vocab_size,
                  "structure": model.extra.get("structure", "analytic"),
                  "structure_confidence": model.extra.get("confidence", "high")},
        "strategy": est.strategy.as_dict(),
        "per_gpu": {
            "allocated_peak_bytes": est.allocated_peak_bytes,
            "reserved_peak_bytes": est.reserved_peak_bytes,
            "device_total_bytes": est.device_total_bytes,
            "peak_phase": est.peak_phase,
            "phases_allocated_bytes": dict(est.phases),
            "terms": [{"name": t.path, "bytes": int(t.value), "formula": t.formula,
                       "inputs": dict(t.inputs), "source": t.source} for t in est.breakdown],
            "loading": None if est.loading is None else {
                "peak_bytes": est.loading_peak_bytes, "binds": est.loading_binds,
                "terms": [{"name": t.path, "bytes": int(t.value), "formula": t.formula,
                           "inputs": dict(t.inputs), "source": t.source}
                          for t in est.loading]},
        },
        "host_ram_bytes": est.host_ram_bytes,
        "host_terms": [{"name": t.path, "bytes": int(t.value), "formula": t.formula}
                       for t in est.host],
        "trainable_params": est.trainable_params,
        "total_params": est.total_params,
        "fits": fits,
        "headroom_bytes": None if gpu is None else {
            gpu.name: est.headroom(memory_limit_bytes(gpu))},
        "gpu": None if gpu is None else gpu_memory_part(gpu),
        "assumptions": est.assumptions.as_dict(),
        "stack": stack_part(est),
        "notes": list(est.notes),
    }


def stack_part(est: MemoryEstimate) -> dict[str, Any]:
    """The library versions the estimate assumed (``versions``; ``assumed`` says which are the
    pip defaults of ``DEFAULT_STACK_DATE`` and which were stated) and, per version-dependent
    term touching this job, the behaviour assumed."""
    stack = est.strategy.stack
    return {"versions": stack.as_dict(), "stated": stack.given(),
            "assumed": stack.describe(), "behaviours": list(est.behaviours)}


def explain_lines(est: MemoryEstimate, gpu: GpuSpec | None) -> list[str]:
    """Every term in words: value, formula, inputs and source."""
    lines = [f"{est.model}: peak per GPU during {est.peak_phase}",
             f"  allocated {format_bytes(est.allocated_peak_bytes)}, reserved "
             f"{format_bytes(est.reserved_peak_bytes)}, whole device "
             f"{format_bytes(est.device_total_bytes)}"]
    for t in est.breakdown:
        if not t.value:
            continue
        lines.append(f"- {t.path}: {format_bytes(int(t.value))} = {t.formula}")
        if t.inputs:
            lines.append("    inputs: " + ", ".join(f"{k}={v}" for k, v in t.inputs.items()))
        if t.source:
            lines.append(f"    source: {t.source}")
    lines.append(f"host RAM per node: {format_bytes(est.host_ram_bytes)}")
    for t in est.host:
        lines.append(f"- {t.path}: {format_bytes(int(t.value))} = {t.formula}")
    if gpu is not None:
        lines += fit_lines(est, gpu)
    lines.append("assumptions: " + ", ".join(
        f"{k}={v}" for k, v in est.assumptions.as_dict().items() if not isinstance(v, dict)))
    lines.append("assumed: " + ", ".join(est.strategy.stack.describe()))
    lines += [f"behaviour: {b}" for b in est.behaviours]
    lines += [f"note: {note}" for note in est.notes]
    return lines


def fit_lines(est: MemoryEstimate, gpu: GpuSpec) -> list[str]:
    """The comparison on ``gpu`` in words: usable of nominal, the limit, the verdict."""
    limit = memory_limit_bytes(gpu)
    room = est.headroom(limit)
    verdict = "fits" if room >= 0 else "does NOT fit"
    return [f"{gpu.name}: {usable_phrase(gpu)}",
            f"  whole-device peak {format_bytes(est.device_total_bytes)} (CUDA context and "
            f"allocator reserve included) vs {format_bytes(limit)} = usable x "
            f"{DEFAULT_MEMORY_MARGIN:.0%}: {verdict}, headroom {format_bytes(room)}"]
