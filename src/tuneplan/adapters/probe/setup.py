"""What a probe step can simulate, and the measured step set beside the estimate.

The job itself is the memory model's ``Strategy``, held by ``StepSetup`` as is (what the harness
cannot run is refused there). ``simulation_fallbacks`` names what fake tensors cannot run and
which analytic term stands in; ``compare`` sets measured categories beside the estimate's term
groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from tuneplan.adapters.probe.build import is_moe
from tuneplan.adapters.probe.harness import MeasuredStep, StepSetup
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Optimizer
from tuneplan.core.memory import MemoryEstimate
from tuneplan.errors import UnsupportedError

# Harness category -> the estimate's term group it is compared with.
GROUPS = ("weights", "gradients", "optimizer", "activations")
_CATEGORY_GROUP = {"parameters": "weights", "quant_state": "weights", "buffers": "weights",
                   "gradients": "gradients", "optimizer": "optimizer", "inputs": "activations",
                   "activations": "activations", "temporaries": "activations",
                   "other": "activations"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Fallback:
    """A part fake tensors cannot run: what stands in, and the estimate's term group used."""

    part: str
    reason: str
    group: str | None  # the measured group replaced by the analytic one; None: added on top
    term: str          # estimate term path prefix used instead


def simulation_fallbacks(setup: StepSetup) -> tuple[StepSetup, tuple[Fallback, ...]]:
    """The setup fake tensors can run, and the parts that fall back to the analytic terms."""
    found: list[Fallback] = []
    method = setup.strategy.method
    if setup.strategy.optimizer is Optimizer.ADAFACTOR:
        found.append(Fallback(part="adafactor optimizer", group="optimizer", term="optimizer/",
                              reason="torch Adafactor reads tensor values (.item())"))
        setup = replace(setup, strategy=replace(setup.strategy, optimizer=Optimizer.SGD),
                        optimizer_impl="fused")
    if method is Method.QLORA:
        found.append(Fallback(
            part="bitsandbytes 4-bit matmul", group=None, term="activations/dequant_buffer",
            reason="gemm_4bit's dequantized weight lives inside the CUDA kernel"))
    moe = is_moe(setup.config)
    if moe and setup.param_dtype is not torch.bfloat16:
        raise UnsupportedError("MoE in fp32 cannot be simulated (grouped_mm is bf16-only); "
                               "use the analytic estimate (tuneplan memory)")
    if moe and method is Method.QLORA and setup.kbit_prepare:
        raise UnsupportedError("MoE QLoRA with kbit preparation cannot be simulated (fp32 "
                               "experts); use --recipe plain or tuneplan memory")
    return setup, tuple(found)


def _group_of_term(path: str) -> str:
    head = path.split("/", 1)[0]
    if path == "weights/autocast_copies" or head == "logits":
        return "activations"  # created in forward: the tracker books them as activations
    return head


def estimated_groups(est: MemoryEstimate) -> dict[str, int]:
    """Tensor-level terms of the estimate's peak, summed per group (GPU overheads left out)."""
    out = dict.fromkeys(GROUPS, 0)
    for t in est.breakdown:
        group = _group_of_term(t.path)
        if group in out:
            out[group] += int(t.value)
    return out


def measured_groups(m: MeasuredStep) -> dict[str, int]:
    out = dict.fromkeys(GROUPS, 0)
    for category, value in m.peak_by_category.items():
        out[_CATEGORY_GROUP.get(category, "activations")] += int(value)
    return out


def workspace_bytes(est: MemoryEstimate) -> int:
    """The estimate's cuBLAS workspaces: GPU-only, never in a CPU run."""
    return int(est.breakdown.value("overheads/cublas_workspace"))


def tensor_estimate(est: MemoryEstimate) -> int:
    """The estimate's allocated peak without the GPU-only workspace (what a CPU run sees)."""
    return est.allocated_peak_bytes - workspace_bytes(est)


def compare(measured: Mapping[str, int], estimated: Mapping[str, int]) -> list[dict[str, Any]]:
    """Rows ``{name, measured_bytes, estimated_bytes, error_pct}`` (error vs measured)."""
    rows = []
    for name in measured:
        m, e = int(measured[name]), int(estimated.get(name, 0))
        rows.append({"name": name, "measured_bytes": m, "estimated_bytes": e,
                     "error_pct": None if m == 0 else round(100.0 * (e - m) / m, 2)})
    return rows
