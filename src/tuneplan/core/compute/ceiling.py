"""The matmul ceiling of one GPU: the dense rate its matmuls sustain, from a measurement where
one is published, else from a measured sibling moved by the power rule.

Pure. ``ThroughputAssumptions.measured_matmul_tflops`` holds the measurements (with sources);
``sustained_clock_power_exponent`` the rule; ``THROUGHPUT_WHY`` says where each comes from.
The dense rate is the one for the accumulate type mixed-precision training uses: GeForce cards'
FP32-accumulate rate (half their FP16-accumulate rate), as gpu_specs.csv stores it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute.assumptions import ThroughputAssumptions


@dataclass(frozen=True, slots=True, kw_only=True)
class MatmulCeiling:
    """``flops_per_s`` a dense matmul sustains on the GPU: ``fraction`` of ``peak``, how it was
    reached (``measured``, ``sibling``, ``default``, ``calibrated``) and from what."""

    flops_per_s: float
    fraction: float
    peak: float
    basis: str
    source: str


def _die(architecture: str) -> str:
    return architecture.split("(")[-1].rstrip(")").strip() if "(" in architecture else ""


def _word(architecture: str) -> str:
    words = architecture.split()
    return words[0] if words else ""


def matmul_ceiling(gpu: GpuSpec, peak: float, a: ThroughputAssumptions) -> MatmulCeiling:
    """The matmul ceiling of ``gpu`` at its mixed-precision dense rate ``peak`` (FLOP/s).

    Its own measurement when ``a.measured_matmul_tflops`` lists it; else the measured
    fraction of a sibling (same die first, then same architecture word; among those the
    nearest in board power per peak FLOP) times
    ((TDP / peak here) / (TDP / peak there)) ** ``sustained_clock_power_exponent``, capped at
    1; else ``matmul_fraction_default``. FP32 runs on CUDA cores and keeps its own constant.
    """
    own = a.measured_matmul(gpu.name)
    if own is not None:
        flops = own[3] * 1e12
        return MatmulCeiling(flops_per_s=flops, fraction=flops / peak, peak=peak,
                             basis="measured", source=own[6])
    word, die = _word(gpu.architecture), _die(gpu.architecture)
    best = None
    if gpu.tdp_w and gpu.bf16_flops_per_s:
        mine = gpu.tdp_w / (gpu.bf16_flops_per_s / 1e12)
        for row in a.measured_matmul_tflops:
            if row[1] != word:
                continue
            # same die first, then the nearest power per peak FLOP
            key = (0 if die and row[2] == die else 1, abs(math.log(mine * row[4] / row[5])))
            if best is None or key < best[0]:
                best = (key, row)
    if best is not None and gpu.tdp_w and gpu.bf16_flops_per_s:
        name, _, _, tflops, their_peak, their_watts, source = best[1]
        theirs = tflops / their_peak
        ratio = (gpu.tdp_w / (gpu.bf16_flops_per_s / 1e12)) / (their_watts / their_peak)
        fraction = min(1.0, theirs * ratio ** a.sustained_clock_power_exponent)
        return MatmulCeiling(
            flops_per_s=peak * fraction, fraction=fraction, peak=peak, basis="sibling",
            source=(f"{name} measured {theirs:.3f} of its peak ({source}); times (W per peak "
                    f"TFLOP/s here / there = {ratio:.3f})^{a.sustained_clock_power_exponent:.3g}"
                    ", capped at 1"))
    fraction = a.matmul_fraction_default
    return MatmulCeiling(flops_per_s=peak * fraction, fraction=fraction, peak=peak,
                         basis="default", source="no measurement of this GPU or a sibling: "
                                                 "matmul_fraction_default")
