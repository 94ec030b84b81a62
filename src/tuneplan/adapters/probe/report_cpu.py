"""A CPU probe (real tensors) or a simulation (fake tensors) beside the analytic estimate.

Compares tensor bytes only: the estimate's GPU overheads (workspace, reserve, context) are left
out. Parts fake tensors cannot run fall back to the analytic term and are named.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneplan.adapters.probe import setup as ps
from tuneplan.adapters.probe.harness import StepSetup
from tuneplan.adapters.probe.measure import measure_cpu
from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import ModelSpec

if TYPE_CHECKING:
    from tuneplan.adapters.probe.run import ProbeRequest, Report


def probe_cpu(req: ProbeRequest, spec: ModelSpec, config: dict[str, Any],
              weights: str | Path | None, device: str, say: Report) -> dict[str, Any]:
    """Measure on the CPU (``device`` "cpu") or simulate ("simulated"); the JSON document."""
    fake = device == "simulated"
    steps = min(req.steps, 2) if fake else req.steps  # step 2 already holds optimizer state
    strategy = req.strategy
    setup = StepSetup(config=config, strategy=strategy, steps=steps, fake=fake)
    fallbacks: tuple[ps.Fallback, ...] = ()
    if fake:
        setup, fallbacks = ps.simulation_fallbacks(setup)
    # The CPU dropout kernel keeps a float mask (4 B), CUDA a bool one (MemoryAssumptions).
    est = estimate_memory(spec, strategy, MemoryAssumptions(dropout_mask_bytes=4))
    say("building the model" + (" (fake tensors)" if fake else ""), 0, steps)
    measured, timing = measure_cpu(setup, weights=weights,
                                   on_step=lambda i: say(f"step {i}/{steps}", i - 1, steps))
    say("done", steps, steps)
    got, peak, sources = _with_fallbacks(measured, est, fallbacks)
    rows = ps.compare(got, ps.estimated_groups(est))
    for row in rows:
        row["measured_source"] = sources[row["name"]]
    estimate = ps.tensor_estimate(est)
    return {
        "model": spec.name, "strategy": strategy.as_dict(), "device": device,
        "device_name": "cpu (fake tensors)" if fake else "cpu", "gpu": None,
        "steps": steps, "warmup_steps": timing.warmup,
        "measured": _measured_doc(peak, measured, timing, fake),
        "estimated": {"tensor_peak_bytes": estimate, "peak_phase": est.peak_phase,
                      "trainable_params": est.trainable_params,
                      "allocated_peak_bytes": est.allocated_peak_bytes,
                      "note": "tensor peak = allocated peak less the cuBLAS workspace (GPU-only)"},
        "comparison": [*rows, _total_row(peak, estimate), *_reserved_row(measured, est)],
        "fallbacks": [{"part": f.part, "reason": f.reason, "analytic_term": f.term}
                      for f in fallbacks],
        "record": _record(peak, measured, timing, fake),
    }


def _measured_doc(peak: int, measured: Any, timing: Any, fake: bool) -> dict[str, Any]:
    return {"tensor_peak_bytes": peak, "peak_phase": measured.peak_phase,
            "peak_step": measured.peak_step, "peak_by_category": dict(measured.peak_by_category),
            "trainable_params": measured.trainable_params, "total_params": measured.total_params,
            "step_seconds": list(timing.step_seconds),
            # fake tensors run no arithmetic: their speed says nothing
            "tokens_per_second": None if fake else round(timing.tokens_per_second, 2),
            "simulation_seconds": round(measured.seconds, 2) if fake else None}


def _with_fallbacks(measured: Any, est: Any, fallbacks: tuple[ps.Fallback, ...],
                    ) -> tuple[dict[str, int], int, dict[str, str]]:
    """Measured groups and peak with each unsimulated part replaced by (or, for a GPU-kernel
    temporary, added as) its analytic term; which groups are analytic."""
    got, peak = ps.measured_groups(measured), measured.peak_bytes
    sources = dict.fromkeys(got, "measured")
    for fb in fallbacks:
        analytic = _term_bytes(est, fb.term)
        if fb.group is None:
            got["activations"] += analytic
            peak += analytic
        else:
            peak += analytic - got[fb.group]
            got[fb.group] = analytic
            sources[fb.group] = "analytic"
    return got, peak, sources


def _term_bytes(est: Any, prefix: str) -> int:
    return sum(int(t.value) for t in est.breakdown if t.path.startswith(prefix))


def _total_row(measured: int, estimated: int) -> dict[str, Any]:
    row = ps.compare({"tensor peak (total)": measured}, {"tensor peak (total)": estimated})[0]
    return {**row, "measured_source": "measured"}


def _reserved_row(m: Any, est: Any) -> list[dict[str, Any]]:
    """The caching allocator's reserved peak, replayed over the run's storages, beside the
    estimate's reserved peak less the cuBLAS workspace (both tensors only)."""
    if not m.allocator_reserved_bytes:
        return []
    name = "reserved peak (allocator replay)"
    estimated = est.reserved_peak_bytes - ps.workspace_bytes(est)
    row = ps.compare({name: m.allocator_reserved_bytes}, {name: estimated})[0]
    return [{**row, "measured_source": "replay"}]


def _record(peak: int, m: Any, timing: Any, fake: bool) -> dict[str, Any]:
    return {"tensor_peak_bytes": peak, "peak_by_category": dict(m.peak_by_category),
            "peak_phase": m.peak_phase, "allocator_reserved_bytes": m.allocator_reserved_bytes,
            "tokens_per_second": None if fake else round(timing.tokens_per_second, 2),
            "step_seconds": None if fake else round(timing.measured_seconds, 4),
            "simulation_seconds": round(m.seconds, 2) if fake else None}
