"""Run and present a memory estimate for the CLI: resolve model and GPU, build the JSON
document of docs/CLI.md, and render terms in words for ``tuneplan explain``. No maths here.
"""

from __future__ import annotations

from typing import Any

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.memory import MemoryAssumptions, MemoryEstimate, estimate_memory
from tuneplan.core.models import ModelSpec
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


def memory_document(est: MemoryEstimate, model: ModelSpec, gpu: GpuSpec | None
                    ) -> dict[str, Any]:
    """The JSON document of docs/CLI.md for ``tuneplan memory --json``."""
    fits = None
    if gpu is not None:
        fits = {gpu.name: est.fits(gpu.usable_memory_bytes)}
    return {
        "model": {"name": model.name, "model_type": model.model_type,
                  "num_layers": model.num_layers, "hidden_size": model.hidden_size,
                  "vocab_size": model.vocab_size},
        "strategy": est.strategy.as_dict(),
        "per_gpu": {
            "allocated_peak_bytes": est.allocated_peak_bytes,
            "reserved_peak_bytes": est.reserved_peak_bytes,
            "device_total_bytes": est.device_total_bytes,
            "peak_phase": est.peak_phase,
            "phases_allocated_bytes": dict(est.phases),
            "terms": [{"name": t.path, "bytes": int(t.value), "formula": t.formula,
                       "inputs": dict(t.inputs), "source": t.source} for t in est.breakdown],
        },
        "host_ram_bytes": est.host_ram_bytes,
        "host_terms": [{"name": t.path, "bytes": int(t.value), "formula": t.formula}
                       for t in est.host],
        "trainable_params": est.trainable_params,
        "total_params": est.total_params,
        "fits": fits,
        "headroom_bytes": None if gpu is None else {
            gpu.name: est.headroom(gpu.usable_memory_bytes)},
        "assumptions": est.assumptions.as_dict(),
        "notes": list(est.notes),
    }


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
        room = est.headroom(gpu.usable_memory_bytes)
        verdict = "fits" if room >= 0 else "does NOT fit"
        lines.append(f"{gpu.name} ({format_bytes(gpu.usable_memory_bytes)} usable): {verdict}, "
                     f"headroom {format_bytes(room)}")
    lines.append("assumptions: " + ", ".join(
        f"{k}={v}" for k, v in est.assumptions.as_dict().items() if not isinstance(v, dict)))
    lines += [f"note: {note}" for note in est.notes]
    return lines
