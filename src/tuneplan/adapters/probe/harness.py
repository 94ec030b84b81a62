"""Measure the live tensor bytes of real (or fake) training steps, by category.

``measure_step(StepSetup)`` builds the transformers model from a config (random weights),
applies the job's PEFT method (or bitsandbytes 4-bit + LoRA), and runs the HF Trainer's step
under ``StorageTracker``. Tensor bytes only: no allocator reserve, CUDA context or workspaces.

The job is the memory model's ``Strategy``; ``StepSetup`` adds only the harness's own knobs.
What the harness cannot run is refused (``refuse_unrunnable``) with the flag that asks for it.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import nn

from tuneplan.adapters.probe import build, qlora
from tuneplan.adapters.probe.tracker import StorageTracker, TrackerResult
from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.strategy import (
    Attention,
    Checkpointing,
    Loss,
    Offload,
    Optimizer,
    Precision,
    Sharding,
    Strategy,
)
from tuneplan.core.job.tuners import TUNER_METHODS
from tuneplan.core.job.versions import adamw_impl
from tuneplan.errors import InvalidValueError, ProbeError, UnsupportedError

OptimizerImpl = Literal["fused", "foreach", "single"]
RUNNABLE_METHODS = frozenset({Method.FULL, Method.LORA, Method.DORA, Method.QLORA,
                              Method.PREFIX, Method.PROMPT, Method.IA3}) | TUNER_METHODS
RUNNABLE_OPTIMIZERS = frozenset({Optimizer.ADAMW, Optimizer.SGD, Optimizer.ADAFACTOR,
                                 Optimizer.ADAMW8BIT, Optimizer.LION})


def refuse_unrunnable(s: Strategy, *, fake: bool = False) -> None:
    """Raise UnsupportedError naming the first flag of ``s`` the harness cannot honour: it runs
    the HF Trainer's step in one process (hf or plain recipe), one micro-batch, unpacked rows."""
    reasons = [
        (s.method not in RUNNABLE_METHODS,
         f"--method {s.method} (probe runs full, lora, dora, qlora, prefix, prompt, ia3 "
         "and the peft tuners of core/job/tuners.py)"),
        (s.recipe not in (Recipe.HF, Recipe.PLAIN, Recipe.LITGPT, Recipe.TORCHTUNE),
         f"--recipe {s.recipe} (probe runs the HF Trainer step (hf, plain), litgpt's fit "
         "loop (litgpt) or torchtune's single-device recipe step (torchtune))"),
        (s.method is Method.QLORA and s.quant not in (Quant.NF4, Quant.FP4),
         f"--quant {s.quant} (probe quantizes with bitsandbytes 4-bit: nf4 or fp4)"),
        (s.precision is Precision.FP16_MIXED, "--precision fp16-mixed (use bf16-mixed)"),
        (s.optimizer not in RUNNABLE_OPTIMIZERS,
         f"--optimizer {s.optimizer} (paged optimizers need CUDA unified memory)"),
        (s.optimizer_in_backward, "--optimizer-in-backward"),
        (s.world_size > 1, "--gpus/--nodes: more than one GPU (the probe is one process"
         + (f"; --sharding {s.sharding}: DeepSpeed ZeRO is not simulated" if s.sharding in (
             Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3) else "")
         + "; --simulate runs --sharding fsdp on up to 4 ranks)"),
        (s.sharding is not Sharding.DDP,
         f"--sharding {s.sharding} on one GPU (the probe is one process without DeepSpeed or "
         "FSDP)"),
        (s.offload is not Offload.NONE, f"--offload {s.offload}"),
        (s.grad_accum > 1, "--grad-accum > 1 (measure one micro-batch)"),
        (s.checkpointing is Checkpointing.OFFLOAD and s.recipe is not Recipe.TORCHTUNE,
         "--offload-activations (torchtune's OffloadActivations is simulated: --recipe "
         "torchtune)"),
        (s.packing and s.recipe is not Recipe.TORCHTUNE,
         "--packing (the probe's rows are one sequence each; --recipe torchtune packs)"),
        (s.attention is Attention.FLASH,
         "--attention flash (use sdpa: no s×s scores either, and it runs on the CPU)"),
        (s.compile and s.recipe is not Recipe.TORCHTUNE,
         "--compile (the torchtune recipe's compiled layers are simulated: --recipe "
         "torchtune)"),
        (s.loss is Loss.CHUNKED and s.recipe not in (Recipe.LITGPT, Recipe.TORCHTUNE),
         "--loss chunked"),
        (s.num_labels != 2, "--num-labels other than 2"),
        (bool(s.stack.given()),
         f"--stack {s.stack.given()} (it runs the libraries installed here, not a stated "
         "stack)"),
    ]
    for bad, what in reasons:
        if bad:
            raise UnsupportedError(f"the probe cannot run {what}")
    if s.recipe is Recipe.LITGPT:
        from tuneplan.adapters.probe.litgpt_step import refuse_unrunnable as refuse_litgpt

        refuse_litgpt(s)
    if s.recipe is Recipe.TORCHTUNE:
        from tuneplan.adapters.probe.torchtune_step import refuse_unrunnable as refuse_tune

        refuse_tune(s, fake=fake)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSetup:
    """One training step to measure: the job (``strategy``) on a model (``config``), plus the
    harness's own knobs, none of them a job setting.

    ``optimizer_impl`` None is the implementation the job runs: for AdamW the one the memory
    estimate assumes (``core.job.versions.adamw_impl``: the HF Trainer's default for the stack,
    torch's foreach default in a plain loop, fused in torchtune), foreach for Adafactor;
    bitsandbytes optimizers ignore it. Refuses, at construction, a ``strategy``
    the harness cannot run (``refuse_unrunnable``).
    """

    config: Mapping[str, Any]
    strategy: Strategy
    steps: int = 2
    fake: bool = False
    seed: int = 0
    optimizer_impl: OptimizerImpl | None = None
    # Where the model is built: "cpu", or "cuda" for the CUDA probe (random init on the GPU
    # instead of the host and a copy; the peaks are reset after the build either way).
    device: str = "cpu"

    def __post_init__(self) -> None:
        refuse_unrunnable(self.strategy, fake=self.fake)
        if self.steps < 1:
            raise InvalidValueError("steps must be at least 1")
        if self.optimizer_impl is not None and self.optimizer_impl not in get_args(OptimizerImpl):
            raise InvalidValueError(
                f"optimizer_impl {self.optimizer_impl!r} is not fused, foreach or single")

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype weights are built in: fp32 or bf16 as ``--precision`` says; under
        bf16-mixed fp32 when the base trains and a bf16 base for adapter methods (the HF
        convention the estimate's ``precision_plan`` follows; PEFT keeps adapters fp32)."""
        s = self.strategy
        if s.precision is Precision.BF16:
            return torch.bfloat16
        if s.precision is Precision.BF16_MIXED and not s.method.trains_base:
            return torch.bfloat16
        return torch.float32

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """bf16 ``torch.autocast`` around forward + loss under bf16-mixed, else None."""
        return torch.bfloat16 if self.strategy.precision is Precision.BF16_MIXED else None

    @property
    def checkpointing(self) -> bool:
        return self.strategy.checkpointing is Checkpointing.FULL

    @property
    def kbit_prepare(self) -> bool:
        """QLoRA: the HF recipe runs ``peft.prepare_model_for_kbit_training`` (fp32 upcasts);
        ``--recipe plain`` does not."""
        return self.strategy.recipe is Recipe.HF

    @property
    def impl(self) -> OptimizerImpl:
        if self.optimizer_impl is not None:
            return self.optimizer_impl
        if self.strategy.optimizer is Optimizer.ADAFACTOR:
            return "foreach"
        impl = adamw_impl(self.strategy, None)
        # "hf" (transformers' own AdamW) only on a stated old stack, which the harness refuses
        return "foreach" if impl == "foreach" else "single" if impl == "single" else "fused"


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
    #: live bytes as the last step's backward began (the loss computed, only what backward
    #: needs still held); 0 where the step does not record it (torchtune's does)
    backward_start_bytes: int = 0
    #: the CUDA caching allocator's reserved peak for the same storages, replayed
    #: (``allocator.py``); tensors only, no cuBLAS workspace
    allocator_reserved_bytes: int = 0


def _unique_params(model: nn.Module) -> list[nn.Parameter]:
    return list(model.parameters())  # parameters() already skips tied duplicates


def _autocast(setup: StepSetup) -> contextlib.AbstractContextManager[Any]:
    if setup.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=setup.autocast_dtype)


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
    opt, hooks = build.tracked_optimizer(params, setup, tracker)
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
        raise ProbeError(f"the {kind} {setup.strategy.method} step failed: {first}") from exc
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
    if setup.strategy.method is Method.QLORA:
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
    vocab = int(build.make_config(setup.config, setup.strategy.task).vocab_size)
    inputs = build.make_inputs(setup, vocab)
    register_model(tracker, model, inputs)
    # The output object is dropped inside forward: only the loss lives into backward,
    # as with ``model(...).loss.backward()``.
    return run_steps(model, lambda: model(**inputs).loss, setup, tracker)


def measure_step(setup: StepSetup) -> MeasuredStep:
    """Build the model for ``setup`` and measure ``setup.steps`` training steps (litgpt's own
    fit loop under ``--recipe litgpt``, ``litgpt_step``; torchtune's recipe step under
    ``--recipe torchtune``, ``torchtune_step``)."""
    if setup.strategy.recipe is Recipe.LITGPT:
        from tuneplan.adapters.probe.litgpt_step import measure_litgpt_step

        return measure_litgpt_step(setup)
    if setup.strategy.recipe is Recipe.TORCHTUNE:
        from tuneplan.adapters.probe.torchtune_step import measure_torchtune_step

        return measure_torchtune_step(setup)
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
                  seconds: float, step_seconds: float, notes: tuple[str, ...] = (),
                  backward_start_bytes: int = 0) -> MeasuredStep:
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
        backward_start_bytes=backward_start_bytes,
        allocator_reserved_bytes=result.allocator_reserved_bytes,
    )
