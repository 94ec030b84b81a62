"""An FSDP job simulated on N gloo ranks beside the analytic estimate, rank by rank.

``tuneplan probe --simulate --sharding fsdp --gpus N`` runs ``fsdp_step.simulate`` (the
simulation ``tests/core/memory/test_simulation_fsdp.py`` checks the estimate against): N
processes, one per simulated GPU, each training its shard on real CPU tensors over gloo, the
model wrapped as accelerate wraps it. Each rank's tensor peak is set beside the estimate's
(the estimate is per GPU; every rank holds the same shapes). What it does not cover is
refused with the flag named; everything else is the one-process harness's to refuse.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from tuneplan.adapters.probe import setup as ps
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import Precision, Sharding, Strategy
from tuneplan.core.memory import MemoryAssumptions, estimate_memory
from tuneplan.core.models import ModelSpec
from tuneplan.errors import ProbeError, UnsupportedError

if TYPE_CHECKING:
    from tuneplan.adapters.probe.run import ProbeRequest, Report

#: Simulated ranks at most: the FSDP simulation tests run 2 and 4.
MAX_RANKS = 4
#: Wall-clock guard on the simulated ranks (a tiny model takes well under a minute); past
#: it every rank is stopped and the probe fails. Not a model figure.
DEADLINE_S = 900.0
_FSDP = (Sharding.FSDP, Sharding.FSDP_GRAD_OP, Sharding.HYBRID)


def covers(s: Strategy) -> bool:
    """An FSDP job on several GPUs: simulated here, or refused here."""
    return s.sharding in _FSDP and s.world_size > 1


def refuse_unsimulated(s: Strategy, simulate: bool) -> None:
    """Raise UnsupportedError naming the first flag the FSDP simulation does not cover."""
    from tuneplan.adapters.probe.fsdp_step import _single
    from tuneplan.adapters.probe.harness import refuse_unrunnable

    reasons = [
        (not simulate, f"--sharding {s.sharding} on {s.world_size} GPUs without --simulate "
                       "(FSDP is simulated as gloo ranks on the CPU, not measured)"),
        (s.sharding is not Sharding.FSDP,
         f"--sharding {s.sharding} (the FSDP simulation runs full-shard fsdp)"),
        (s.nodes > 1, "--nodes > 1 (the simulated ranks share one machine)"),
        (s.world_size > MAX_RANKS, f"--gpus {s.gpus} (at most {MAX_RANKS} simulated ranks)"),
        (s.recipe not in (Recipe.HF, Recipe.PLAIN),
         f"--recipe {s.recipe} (the FSDP simulation wraps the HF model as accelerate does)"),
        (s.method not in (Method.FULL, Method.LORA),
         f"--method {s.method} (the FSDP simulation runs full and lora)"),
        (s.precision is not Precision.FP32,
         f"--precision {s.precision} (the FSDP simulation runs fp32: FSDP mixed precision "
         "is not simulated)"),
    ]
    for bad, what in reasons:
        if bad:
            raise UnsupportedError(f"the probe cannot run {what}")
    refuse_unrunnable(_single(s))  # the rest of the job: as the one-process harness


def assumptions() -> MemoryAssumptions:
    """The estimate of the simulated step: fused AdamW (the harness's default), the FSDP
    generation tuneplan's launch config writes, accumulation under accelerate's no_sync (the
    simulation's), the CPU dropout kernel's float mask."""
    return MemoryAssumptions(adamw_impl="fused", fsdp_sync_each_batch=False,
                             dropout_mask_bytes=4)


def probe_fsdp(req: ProbeRequest, spec: ModelSpec, config: dict[str, Any],
               say: Report) -> dict[str, Any]:
    """Simulate ``req``'s FSDP job on its GPUs' count of gloo ranks; the JSON document."""
    from tuneplan.adapters.probe.fsdp_step import FsdpCase, simulate

    s = req.strategy
    world = s.world_size
    a = assumptions()
    est = estimate_memory(spec, s, a)
    estimate = ps.tensor_estimate(est)
    _refuse_too_large(estimate, world)
    steps = min(req.steps, 2)  # step 2 already holds optimizer state
    case = FsdpCase(name="probe", config=config, strategy=s, version=a.fsdp_version,
                    steps=steps)
    say(f"simulating {world} FSDP{a.fsdp_version} ranks (gloo, CPU tensors)", 0, 1)
    started = time.perf_counter()
    ranks = simulate([case], world, deadline_s=DEADLINE_S)["probe"]
    seconds = round(time.perf_counter() - started, 2)
    say("done", 1, 1)
    failed = next((r for r in ranks if r.error), None)
    if failed is not None:
        raise UnsupportedError(f"FSDP refused the wrapping on rank {failed.rank}: "
                               f"{failed.error}")
    top = max(ranks, key=lambda r: r.peak_bytes)
    rows = [{**row, "measured_source": "simulated"} for row in ps.compare(
        {f"rank {r.rank} tensor peak": r.peak_bytes for r in ranks},
        {f"rank {r.rank} tensor peak": estimate for r in ranks})]
    total = ps.compare({"tensor peak (total)": top.peak_bytes},
                       {"tensor peak (total)": estimate})[0]
    measured = {"tensor_peak_bytes": top.peak_bytes, "peak_phase": top.peak_phase,
                "peak_rank": top.rank, "peak_by_category": dict(top.by_category),
                "per_rank_peak_bytes": [r.peak_bytes for r in ranks],
                "tokens_per_second": None, "step_seconds": None,
                "simulation_seconds": seconds}
    return {
        "model": spec.name, "strategy": s.as_dict(), "device": "simulated",
        "device_name": f"{world} gloo ranks (CPU tensors, FSDP{a.fsdp_version})", "gpu": None,
        "steps": steps, "warmup_steps": 0, "measured": measured,
        "estimated": {"tensor_peak_bytes": estimate, "peak_phase": est.peak_phase,
                      "trainable_params": est.trainable_params,
                      "allocated_peak_bytes": est.allocated_peak_bytes,
                      "assumptions": {"fsdp_version": a.fsdp_version,
                                      "fsdp_sync_each_batch": a.fsdp_sync_each_batch,
                                      "adamw_impl": a.adamw_impl},
                      "note": "per GPU; tensor peak = allocated peak less the cuBLAS "
                              "workspace (GPU-only)"},
        "comparison": [*rows, {**total, "measured_source": "simulated"}],
        "fallbacks": [],
        "record": {key: measured[key] for key in (
            "tensor_peak_bytes", "peak_by_category", "peak_phase", "tokens_per_second",
            "step_seconds", "simulation_seconds")},
    }


def _refuse_too_large(per_rank: int, world: int) -> None:
    """The ranks hold real tensors in this machine's RAM: refuse a job whose estimated
    tensors, over all ranks, need more than half the memory available now."""
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return  # not knowable here: the deadline still bounds the run
    need = per_rank * world
    if need > available // 2:
        raise ProbeError(f"the FSDP simulation runs real CPU tensors: {world} ranks need about "
                         f"{need / 1e9:.1f} GB, more than half the {available / 1e9:.1f} GB "
                         "of RAM available: probe a smaller model (e.g. a config folder)")
