"""The memory model's ``Strategy`` (job flags) as the harness's ``StepSetup``, and back again.

``step_setup`` maps what the probe can run (HF Trainer step, one process) and refuses the rest
with a reason; ``simulation_fallbacks`` names what fake tensors cannot run and which analytic
term stands in. ``compare`` sets measured categories beside the estimate's term groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tuneplan.adapters.probe.build import is_moe
from tuneplan.adapters.probe.harness import MeasuredStep, StepSetup
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import (
    Attention,
    Checkpointing,
    Loss,
    Optimizer,
    Precision,
    Strategy,
)
from tuneplan.core.memory import MemoryEstimate
from tuneplan.errors import UnsupportedError

_METHODS = {Method.FULL, Method.LORA, Method.DORA, Method.PREFIX, Method.PROMPT, Method.IA3,
            Method.QLORA}
_OPTIMIZERS = {Optimizer.ADAMW: "adamw", Optimizer.SGD: "sgd", Optimizer.ADAFACTOR: "adafactor",
               Optimizer.ADAMW8BIT: "adamw8bit", Optimizer.LION: "lion"}
# Harness category -> the estimate's term group it is compared with.
GROUPS = ("weights", "gradients", "optimizer", "activations")
_CATEGORY_GROUP = {"parameters": "weights", "quant_state": "weights", "buffers": "weights",
                   "gradients": "gradients", "optimizer": "optimizer", "inputs": "activations",
                   "activations": "activations", "temporaries": "activations",
                   "other": "activations"}


def _refuse_unrunnable(s: Strategy) -> None:
    reasons = [
        (s.method not in _METHODS, f"method {s.method} (probe runs full, lora, dora, qlora, "
                                   "prefix, prompt, ia3)"),
        (s.recipe not in (Recipe.HF, Recipe.PLAIN), f"recipe {s.recipe} (probe runs the HF "
                                                    "Trainer step: hf or plain)"),
        (s.optimizer not in _OPTIMIZERS, f"optimizer {s.optimizer} (paged optimizers need "
                                         "CUDA unified memory)"),
        (s.world_size > 1, "more than one GPU (the probe is one process)"),
        (s.grad_accum > 1, "--grad-accum > 1 (measure one micro-batch)"),
        (s.checkpointing is Checkpointing.OFFLOAD, "--offload-activations"),
        (s.optimizer_in_backward, "--optimizer-in-backward"),
        (s.compile, "--compile"),
        (s.loss is Loss.CHUNKED, "--loss chunked"),
        (s.num_labels != 2, "--num-labels other than 2"),
        (s.precision is Precision.FP16_MIXED, "fp16-mixed (use bf16-mixed)"),
    ]
    for bad, what in reasons:
        if bad:
            raise UnsupportedError(f"the probe cannot run {what}")


def step_setup(config: Mapping[str, Any], s: Strategy, *, steps: int,
               fake: bool = False) -> StepSetup:
    """The harness step for ``s`` on ``config``; UnsupportedError names what it cannot run."""
    _refuse_unrunnable(s)
    full = s.method.trains_base
    param = {Precision.FP32: "float32", Precision.BF16: "bfloat16"}.get(
        s.precision, "float32" if full else "bfloat16")
    targets: tuple[str, ...] | str = tuple(s.lora_targets)
    if s.all_linear:
        targets = "all-linear"
    return StepSetup(
        config=config, method=str(s.method), lora_rank=s.lora_rank, lora_alpha=s.lora_alpha,
        lora_dropout=s.lora_dropout, lora_targets=targets,
        num_virtual_tokens=s.num_virtual_tokens, trainable_modules=tuple(s.trainable_modules),
        batch_size=s.batch_size, seq_len=s.seq_len,
        gradient_checkpointing=s.checkpointing is Checkpointing.FULL,
        # flash-attn is CUDA-only; SDPA keeps the same tensors (no s×s scores).
        attention="eager" if s.attention is Attention.EAGER else "sdpa",
        optimizer=_OPTIMIZERS[s.optimizer],
        optimizer_impl="foreach" if s.optimizer is Optimizer.ADAFACTOR else "fused",
        param_dtype=param, autocast_dtype="bfloat16" if s.precision.is_mixed else None,
        task=str(s.task), steps=steps, fake=fake, quant_type=str(s.quant),
        double_quant=s.double_quant, kbit_prepare=s.recipe is Recipe.HF)


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
    if setup.optimizer == "adafactor":
        found.append(Fallback(part="adafactor optimizer", group="optimizer", term="optimizer/",
                              reason="torch Adafactor reads tensor values (.item())"))
        setup = replace(setup, optimizer="sgd", optimizer_impl="fused")
    if setup.method == "qlora":
        found.append(Fallback(
            part="bitsandbytes 4-bit matmul", group=None, term="activations/dequant_buffer",
            reason="gemm_4bit's dequantized weight lives inside the CUDA kernel"))
    moe = is_moe(setup.config)
    if moe and setup.param_dtype != "bfloat16":
        raise UnsupportedError("MoE in fp32 cannot be simulated (grouped_mm is bf16-only); "
                               "use the analytic estimate (tuneplan memory)")
    if moe and setup.method == "qlora" and setup.kbit_prepare:
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


def tensor_estimate(est: MemoryEstimate) -> int:
    """The estimate's allocated peak without the GPU-only workspace (what a CPU run sees)."""
    return est.allocated_peak_bytes - int(est.breakdown.value("overheads/cublas_workspace"))


def compare(measured: Mapping[str, int], estimated: Mapping[str, int]) -> list[dict[str, Any]]:
    """Rows ``{name, measured_bytes, estimated_bytes, error_pct}`` (error vs measured)."""
    rows = []
    for name in measured:
        m, e = int(measured[name]), int(estimated.get(name, 0))
        rows.append({"name": name, "measured_bytes": m, "estimated_bytes": e,
                     "error_pct": None if m == 0 else round(100.0 * (e - m) / m, 2)})
    return rows
