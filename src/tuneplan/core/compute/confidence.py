"""Whether a time figure is calibrated (a probe measured this GPU) or assumed (the speed
model's constants alone), and the range it is good to.

Pure. The range is the speed model's error, (predicted - measured) / measured, between its
10th and 90th percentile on the calibration set (``ThroughputAssumptions.assumed_error_range``
and ``calibrated_error_range`` say how each was measured). A predicted tokens/s ``v`` with
error ``e`` means a measured ``v / (1 + e)``; hours go the other way.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.core.catalog.hardware import GpuSpec
from tuneplan.core.compute.assumptions import ThroughputAssumptions
from tuneplan.core.job.strategy import Precision

CALIBRATED = "calibrated"
ASSUMED = "assumed"


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBasis:
    """``basis`` is ``calibrated`` or ``assumed``; ``error_range`` the model's (low, high)
    error as fractions; ``source`` where both come from."""

    basis: str
    source: str
    error_range: tuple[float, float]

    @property
    def calibrated(self) -> bool:
        return self.basis == CALIBRATED

    def speed_range(self, tokens_per_second: float) -> tuple[float, float]:
        """(low, high) tokens/s the measured speed is likely in."""
        low, high = self.error_range
        return tokens_per_second / (1 + high), tokens_per_second / (1 + low)

    def duration_range(self, seconds_or_hours: float) -> tuple[float, float]:
        """(low, high) of a duration (step time, hours): the inverse of the speed's range."""
        low, high = self.error_range
        return seconds_or_hours * (1 + low), seconds_or_hours * (1 + high)

    def text(self) -> str:
        """``assumed (model error -9..+18 %)``: what the CLI prints next to a time."""
        low, high = self.error_range
        return f"{self.basis} (model error {100 * low:+.0f}..{100 * high:+.0f} %)"

    def as_dict(self, *, tokens_per_second: float | None = None,
                step_seconds: float | None = None,
                hours: float | None = None) -> dict[str, object]:
        """JSON: basis, source, the error range in % and the given figures' ranges."""
        low, high = self.error_range
        out: dict[str, object] = {
            "basis": self.basis, "source": self.source,
            "error_range_pct": [round(100 * low, 1), round(100 * high, 1)]}
        if tokens_per_second is not None:
            out["tokens_per_second_range"] = list(self.speed_range(tokens_per_second))
        if step_seconds is not None:
            out["step_seconds_range"] = list(self.duration_range(step_seconds))
        if hours is not None:
            out["hours_range"] = list(self.duration_range(hours))
        return out


def time_basis(gpu: GpuSpec, precision: Precision, a: ThroughputAssumptions) -> TimeBasis:
    """Calibrated when the matmul efficiency on ``gpu`` comes from a probe (a per-GPU or
    per-architecture override of ``a``); assumed otherwise (fp32 included: its constant is
    the model's own)."""
    if precision is not Precision.FP32:
        own = a.gpu_override(gpu.name)
        arch = a.matmul_override(gpu.architecture) if own is None else None
        if own is not None or arch is not None:
            what = own[1] if own is not None else f"override for {arch[1] if arch else ''}"
            return TimeBasis(
                basis=CALIBRATED, error_range=a.calibrated_error_range,
                source=f"matmul efficiency {what}; range: calibrated_error_range")
    return TimeBasis(basis=ASSUMED, error_range=a.assumed_error_range,
                     source="no probe of this GPU: the matmul ceiling x the fitted step share "
                            "(ThroughputAssumptions); range: assumed_error_range")
