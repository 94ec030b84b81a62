"""Measure the live tensor bytes of real (or fake) training steps, by category.

``measure_step(StepSetup)`` builds the transformers model from a config (random weights),
applies the PEFT method (or bitsandbytes 4-bit + LoRA), and runs the HF Trainer's step under
``StorageTracker``. Tensor bytes only: no allocator reserve, CUDA context or workspaces.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tuneplan.adapters.probe import build, qlora
from tuneplan.adapters.probe.tracker import StorageTracker, TrackerResult
from tuneplan.errors import ProbeError


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSetup:
    """One training step to measure (the interface agreed with core/memory; see README.md)."""

    config: Mapping[str, Any]
    method: str = "full"  # full | lora | dora | prefix | prompt | ia3 | qlora (bitsandbytes)
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] | str = "all-linear"
    num_virtual_tokens: int = 8
    trainable_modules: tuple[str, ...] = ()
    batch_size: int = 1
    seq_len: int = 128
    gradient_checkpointing: bool = False
    attention: str = "sdpa"  # sdpa | eager
    optimizer: str = "adamw"  # adamw | sgd (momentum .9) | adafactor | adamw8bit, lion (bnb)
    optimizer_impl: str = "fused"  # fused | foreach | single
    param_dtype: str = "float32"  # float32 | bfloat16 | float16
    autocast_dtype: str | None = None  # "bfloat16": torch.autocast("cpu") around forward+loss
    task: str = "causal-lm"  # causal-lm | seq-cls
    steps: int = 2
    fake: bool = False
    seed: int = 0
    quant_type: str = "nf4"  # qlora: nf4 | fp4
    double_quant: bool = True  # qlora: quantize the absmax constants too
    kbit_prepare: bool = True  # qlora: peft.prepare_model_for_kbit_training (upcasts to fp32)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredStep:
    """What the tracker saw: peak, its breakdown, each category's maximum, and when."""

    peak_bytes: int
    peak_by_category: Mapping[str, int]
    max_by_category: Mapping[str, int]
    peak_phase: str  # forward | backward | optimizer
    trainable_params: int
    total_params: int
    seconds: float  # wall time of build + measured steps
    notes: tuple[str, ...] = ()
    step_seconds: float = 0.0  # wall time of the measured steps alone
    peak_step: int = 0  # 1-based index of the step holding the peak
    per_step_peak_bytes: tuple[int, ...] = field(default=())
    peak_by_phase: Mapping[str, int] = field(default_factory=dict)  # forward/backward/optimizer


def _unique_params(model: nn.Module) -> list[nn.Parameter]:
    return list(model.parameters())  # parameters() already skips tied duplicates


def _autocast(setup: StepSetup) -> contextlib.AbstractContextManager[Any]:
    if setup.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=build.dtype_of(setup.autocast_dtype))


def _optimizer_state(opt: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def run_steps(
    model: nn.Module,
    forward: Callable[[], torch.Tensor],
    setup: StepSetup,
    tracker: StorageTracker,
) -> list[int]:
    """The Trainer's step, ``setup.steps`` times, under ``tracker``; each step's own peak.

    ``forward()`` returns the loss; only it may live into backward. Uses ``setup``'s
    optimizer, implementation, autocast and step count; the caller registers the model.
    A failing step raises ProbeError with the first line of the library's message.
    """
    params = [p for p in _unique_params(model) if p.requires_grad]
    opt = build.make_optimizer(params, setup)
    hooks = [
        p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
            lambda p: tracker.mark_gradient(p.grad)
        )
        for p in params
    ]
    model.train()
    tracker.take_window_peak()
    peaks = []
    try:
        with tracker:
            for _ in range(setup.steps):
                with tracker.phase("forward"), _autocast(setup):
                    loss = forward()
                with tracker.phase("backward"):
                    loss.backward()  # type: ignore[no-untyped-call]
                    del loss
                with tracker.phase("optimizer"):
                    opt.step()
                    tracker.finish_optimizer_step(_optimizer_state(opt))
                    opt.zero_grad(set_to_none=True)
                # A parameter whose storage was swapped during the step (bitsandbytes casts
                # biases with ``bias.data = ...``) is a parameter, whenever it was allocated.
                tracker.register_all(model.parameters(), "parameters")
                peaks.append(tracker.take_window_peak())
    except (RuntimeError, AssertionError, NotImplementedError, ValueError) as exc:
        kind = "simulated" if setup.fake else "real"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ProbeError(f"the {kind} {setup.method} step failed: {first}") from exc
    finally:
        for h in hooks:
            h.remove()
    return peaks


def register_model(
    tracker: StorageTracker, model: nn.Module, inputs: dict[str, torch.Tensor]
) -> None:
    tracker.register_all(model.buffers(), "buffers")
    tracker.register_all(model.parameters(), "parameters")
    tracker.register_all(qlora.quant_state_tensors(model), "quant_state")
    tracker.register_all(inputs.values(), "inputs")


def _build(setup: StepSetup, notes: list[str]) -> tuple[nn.Module, Any]:
    """The model (fake tensors when ``setup.fake``) and the fake mode to run it in, if any."""
    build.check_supported(setup)
    if setup.method == "qlora":
        model = qlora.build_qlora(setup)
    else:
        model = build.apply_method(build.build_base(setup), setup)
    if not setup.fake:
        return model, contextlib.nullcontext()
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    build.fakeify_(model, fake_mode)
    with fake_mode:
        qlora.materialize_stand_ins(model)
    notes.append("fake tensors on cpu (FakeTensorMode); packed-sequence detection patched off")
    return model, fake_mode


def _step(model: nn.Module, setup: StepSetup, tracker: StorageTracker) -> list[int]:
    inputs = build.make_inputs(setup, int(build.make_config(setup.config, setup.task).vocab_size))
    register_model(tracker, model, inputs)
    # The output object is dropped inside forward: only the loss lives into backward,
    # as with ``model(...).loss.backward()``.
    return run_steps(model, lambda: model(**inputs).loss, setup, tracker)


def measure_step(setup: StepSetup) -> MeasuredStep:
    """Build the model for ``setup`` and measure ``setup.steps`` training steps."""
    started = time.perf_counter()
    notes: list[str] = []
    with warnings.catch_warnings():
        # transformers 5 / peft deprecation chatter (gradient_checkpointing_* renames).
        warnings.simplefilter("ignore", FutureWarning)
        return _measure(setup, started, notes)


def _measure(setup: StepSetup, started: float, notes: list[str]) -> MeasuredStep:
    model, fake_mode = _build(setup, notes)
    tracker = StorageTracker()
    patch = build.patched_packed_sequence_check() if setup.fake else contextlib.nullcontext()
    step_start = time.perf_counter()
    with fake_mode, patch:
        peaks = _step(model, setup, tracker)
    step_seconds = time.perf_counter() - step_start
    result = tracker.result()
    if result.max_by_category.get("other", 0):
        notes.append("'other': tensors that existed before tracking and were not params/buffers")
    notes.append("output object dropped before backward (loss = model(...).loss)")
    return measured_step(model, result, peaks, seconds=time.perf_counter() - started,
                         step_seconds=step_seconds, notes=tuple(notes))


def measured_step(model: nn.Module, result: TrackerResult, peaks: list[int], *,
                  seconds: float, step_seconds: float, notes: tuple[str, ...] = ()
                  ) -> MeasuredStep:
    """What the tracker saw (``result``) over steps whose own peaks are ``peaks``."""
    return MeasuredStep(
        peak_bytes=result.peak_bytes,
        peak_by_category=result.peak_by_category,
        max_by_category=result.max_by_category,
        peak_phase=result.peak_phase,
        trainable_params=sum(p.numel() for p in _unique_params(model) if p.requires_grad),
        total_params=qlora.logical_numel(model),  # a 4-bit weight counts out×in, not bytes
        seconds=seconds,
        notes=notes,
        step_seconds=step_seconds,
        peak_step=next((i + 1 for i, p in enumerate(peaks) if p >= result.peak_bytes), 0),
        per_step_peak_bytes=tuple(peaks),
        peak_by_phase={k: v for k, v in result.peak_by_phase.items() if k != "setup"},
    )
