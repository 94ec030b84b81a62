"""A CUDA probe beside the estimate: allocated/reserved/device peaks, context, tokens/s, MFU.

The GPU is named from ``torch.cuda.get_device_name``; its bundled spec (when found) gives the
generation, peak FLOP/s and the calibration already saved for it. Derives the hardware-only
constants a later estimate reuses (context bytes, reserve fraction, matmul efficiency).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneplan.adapters.calibration import calibration_for
from tuneplan.adapters.probe import setup as ps
from tuneplan.adapters.probe.harness import StepSetup
from tuneplan.adapters.probe.measure import CudaMeasured, Timing, measure_cuda
from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute.throughput import estimate_throughput
from tuneplan.core.job.strategy import Strategy
from tuneplan.core.memory import estimate_memory
from tuneplan.core.models import ModelSpec
from tuneplan.errors import TuneplanError

if TYPE_CHECKING:
    from tuneplan.adapters.probe.run import ProbeRequest, Report


def gpu_spec_for(device_name: str, total_bytes: int) -> GpuSpec | None:
    """The bundled spec of a CUDA device name ("NVIDIA H100 80GB HBM3"), None if unknown."""
    from tuneplan.adapters.bundled import load_gpu_spec, resolve_gpu_spec
    from tuneplan.core.catalog.gpu_names import normalise_gpu_name

    for raw in (device_name, device_name.removeprefix("NVIDIA ").removeprefix("GeForce ")):
        try:
            return load_gpu_spec(normalise_gpu_name(raw, total_bytes))
        except TuneplanError:
            pass
        try:
            return resolve_gpu_spec(raw)
        except TuneplanError:
            continue
    return None


def probe_cuda(req: ProbeRequest, spec: ModelSpec, config: dict[str, Any],
               weights: str | Path | None, say: Report) -> dict[str, Any]:
    steps = max(req.steps, 2)  # one warm-up step, at least one timed step
    strategy = req.strategy
    setup = StepSetup(config=config, strategy=strategy, steps=steps)
    say("building the model on cuda", 0, steps)
    m, timing = measure_cuda(setup, weights=weights,
                             on_step=lambda i: say(f"step {i}/{steps}", i - 1, steps))
    say("done", steps, steps)
    gpu = gpu_spec_for(m.device_name, m.device_total_bytes)
    cal = calibration_for(gpu, req.store_path)
    est = estimate_memory(spec, strategy, cal.memory,
                          generation=gpu.generation if gpu else None)
    speed = _speed(spec, strategy, gpu, cal, timing)
    measured_device = m.max_reserved_bytes + m.context_bytes
    rows = ps.compare(
        {"allocated peak": m.max_allocated_bytes, "reserved peak": m.max_reserved_bytes,
         "cuda context": m.context_bytes, "device total": measured_device},
        {"allocated peak": est.allocated_peak_bytes, "reserved peak": est.reserved_peak_bytes,
         "cuda context": int(est.breakdown.value("overheads/cuda_context")),
         "device total": est.device_total_bytes})
    record = {**_figures(m, timing), **speed["record"]}
    return {
        "model": spec.name, "strategy": strategy.as_dict(), "device": "cuda",
        "device_name": m.device_name, "gpu": gpu.name if gpu else None,
        "steps": steps, "warmup_steps": timing.warmup, "measured": record,
        "estimated": {"allocated_peak_bytes": est.allocated_peak_bytes,
                      "reserved_peak_bytes": est.reserved_peak_bytes,
                      "device_total_bytes": est.device_total_bytes,
                      "peak_phase": est.peak_phase, **speed["estimated"]},
        "comparison": [*rows, *speed["rows"]], "fallbacks": [],
        "calibration": cal.record.label() if cal.record else None,
        "notes": list(cal.notes), "record": record,
    }


def _figures(m: CudaMeasured, timing: Timing) -> dict[str, Any]:
    return {"max_allocated_bytes": m.max_allocated_bytes,
            "max_reserved_bytes": m.max_reserved_bytes,
            "device_total_bytes": m.device_total_bytes, "device_used_bytes": m.device_used_bytes,
            "context_bytes": m.context_bytes, "trainable_params": m.trainable_params,
            "tokens_per_second": round(timing.tokens_per_second, 2),
            "step_seconds": round(timing.measured_seconds, 5),
            "all_step_seconds": [round(s, 5) for s in timing.step_seconds]}


def _speed(spec: ModelSpec, strategy: Strategy, gpu: GpuSpec | None, cal: Any,
           timing: Timing) -> dict[str, Any]:
    """Estimated vs measured tokens/s and MFU; the matmul efficiency they imply."""
    if gpu is None:
        return {"record": {}, "estimated": {}, "rows": []}
    tp = estimate_throughput(spec, strategy, gpu, assumptions=cal.throughput)
    ratio = timing.tokens_per_second / tp.tokens_per_second_per_gpu
    rows = ps.compare({"tokens/s": round(timing.tokens_per_second)},
                      {"tokens/s": round(tp.tokens_per_second_per_gpu)})
    return {
        # MFU scales with tokens/s at fixed FLOPs per token.
        "record": {"mfu": round(tp.mfu * ratio, 4),
                   "estimated_tokens_per_second": round(tp.tokens_per_second_per_gpu, 2),
                   **implied_efficiency(tp, timing.measured_seconds, gpu, cal)},
        "estimated": {"tokens_per_second": round(tp.tokens_per_second_per_gpu, 2),
                      "mfu": round(tp.mfu, 4), "step_seconds": round(tp.step_seconds, 5)},
        "rows": rows,
    }


def implied_efficiency(tp: Any, measured_step_s: float, gpu: GpuSpec,
                       cal: Any) -> dict[str, float]:
    """The matmul efficiency that makes the estimated step take the measured time, keeping
    the other step terms; only when matmuls are at least half the estimated step (a small,
    host-bound run says nothing about the GPU's matmul speed)."""
    # the compute-bound terms (linears, attention scores, compile's saving on them) all
    # scale with a calibrated efficiency
    from tuneplan.core.compute.step import COMPUTE_TERMS

    matmul = sum(float(t.value) for t in tp.step if t.path in COMPUTE_TERMS)
    rest = float(tp.step.total) - matmul
    if matmul < 0.5 * float(tp.step.total) or measured_step_s <= rest:
        return {}
    term = tp.step.get("micro-batch/matmul")
    efficiency = float(term.inputs["efficiency"]) if term is not None else 0.0
    return {"matmul_efficiency": round(efficiency * matmul / (measured_step_s - rest), 4)}
