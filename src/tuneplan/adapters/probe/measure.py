"""Run a probe's steps: tensor-level tracking on the CPU (real or fake), or the CUDA allocator.

The model comes from the harness (random weights from the config), or ``from_pretrained`` of a
local folder with weights. CPU: ``StorageTracker`` peaks by category plus per-step wall time.
CUDA: ``max_memory_allocated/reserved``, ``mem_get_info`` and timed steps after warm-up.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tuneplan.adapters.probe import build, harness
from tuneplan.adapters.probe.harness import MeasuredStep, StepSetup
from tuneplan.adapters.probe.tracker import StorageTracker
from tuneplan.core.job.methods import Method
from tuneplan.core.job.recipes import Recipe
from tuneplan.errors import ProbeError, UnsupportedError

OnStep = Callable[[int], None]  # called with the 1-based index of the step starting


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Wall time of each step (seconds) and how many leading ones were warm-up."""

    step_seconds: tuple[float, ...]
    warmup: int
    tokens_per_step: int

    @property
    def measured_seconds(self) -> float:
        timed = self.step_seconds[self.warmup:] or self.step_seconds
        return sum(timed) / len(timed)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.measured_seconds if self.measured_seconds else 0.0


def load_pretrained(setup: StepSetup, source: str | Path) -> nn.Module:
    """A model with real weights (folder, or a hub id the user asked to download) + method."""
    s = setup.strategy
    if s.method is Method.QLORA:
        raise UnsupportedError("the probe loads real weights for qlora only with --random-weights")
    model: Any = build.auto_class(s.task, setup.config).from_pretrained(
        str(source), dtype=setup.param_dtype, attn_implementation=str(s.attention))
    model.config.use_cache = False
    if setup.checkpointing:
        build.enable_checkpointing(model, input_grads=s.method in build.PEFT_METHODS)
    return build.apply_method(model, setup)


def _built(setup: StepSetup, weights: str | Path | None) -> tuple[nn.Module, Any]:
    if weights is None:
        # Same package: the harness's own builder (QLoRA, fake swap and all).
        return harness._build(setup, [])
    return load_pretrained(setup, weights), contextlib.nullcontext()


def measure_cpu(setup: StepSetup, *, weights: str | Path | None = None,
                on_step: OnStep | None = None) -> tuple[MeasuredStep, Timing]:
    """Tensor-level peak by category (real or ``setup.fake``) and per-step wall time."""
    started = time.perf_counter()
    if setup.strategy.recipe is Recipe.LITGPT:  # litgpt's own model and fit loop
        from tuneplan.adapters.probe.litgpt_step import measure_litgpt_step

        if weights is not None:
            raise UnsupportedError("--recipe litgpt builds litgpt's model from the config "
                                   "(random weights)")
        lit_starts: list[float] = []
        measured = measure_litgpt_step(setup, on_step=on_step, starts=lit_starts)
        return measured, _timing(setup, lit_starts, time.perf_counter())
    if setup.strategy.recipe is Recipe.TORCHTUNE:  # torchtune's own model and recipe step
        from tuneplan.adapters.probe.torchtune_step import measure_torchtune_step

        if weights is not None:
            raise UnsupportedError("--recipe torchtune builds torchtune's model from the "
                                   "config (random weights)")
        tune_starts: list[float] = []
        measured = measure_torchtune_step(setup, on_step=on_step, starts=tune_starts)
        return measured, _timing(setup, tune_starts, time.perf_counter())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model, fake_mode = _built(setup, weights)
        tracker = StorageTracker()
        patch = build.patched_packed_sequence_check() if setup.fake else contextlib.nullcontext()
        starts: list[float] = []
        with fake_mode, patch:
            vocab = int(build.make_config(setup.config, setup.strategy.task).vocab_size)
            inputs = build.make_inputs(setup, vocab)
            harness.register_model(tracker, model, inputs)

            def forward() -> torch.Tensor:
                starts.append(time.perf_counter())
                if on_step:
                    on_step(len(starts))
                loss: torch.Tensor = model(**inputs).loss
                return loss

            peaks = harness.run_steps(model, forward, setup, tracker)
        ended = time.perf_counter()
    measured = harness.measured_step(
        model, tracker.result(), peaks, seconds=ended - started,
        step_seconds=ended - (starts[0] if starts else ended))
    return measured, _timing(setup, starts, ended)


def _timing(setup: StepSetup, starts: list[float], ended: float) -> Timing:
    bounds = [*starts, ended]
    seconds = tuple(b - a for a, b in itertools.pairwise(bounds))
    return Timing(step_seconds=seconds, warmup=1 if len(seconds) > 1 else 0,
                  tokens_per_step=setup.strategy.tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaMeasured:
    """What the CUDA caching allocator and the driver reported over the probe's steps."""

    device_name: str
    max_allocated_bytes: int
    max_reserved_bytes: int
    device_total_bytes: int   # mem_get_info total (what NVML reports as the device total)
    device_used_bytes: int    # total - free at the end: context + reserved (+ other processes)
    reserved_end_bytes: int
    trainable_params: int
    total_params: int

    @property
    def context_bytes(self) -> int:
        """Memory this device holds outside the caching allocator: CUDA context + kernels."""
        return max(0, self.device_used_bytes - self.reserved_end_bytes)


def cuda_job(setup: StepSetup, weights: str | Path | None = None
             ) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The job's model on ``cuda:0`` (random weights initialised there, not copied) and its
    batch."""
    dev = torch.device("cuda", 0)
    if weights is None:
        setup = replace(setup, device="cuda")
    model = _built(setup, weights)[0].to(dev)
    vocab = int(build.make_config(setup.config, setup.strategy.task).vocab_size)
    return model, {k: v.to(dev) for k, v in build.make_inputs(setup, vocab).items()}


def cuda_step(model: nn.Module, inputs: dict[str, torch.Tensor],
              setup: StepSetup) -> Callable[[], None]:
    """The HF Trainer's step on CUDA as a call: forward under the job's autocast, the output
    dropped before backward, the optimizer step, gradients set to None (the optimizer is made
    here, once)."""
    params = [p for p in harness._unique_params(model) if p.requires_grad]
    opt = build.make_optimizer(params, replace(setup, fake=False))
    dtype = setup.autocast_dtype
    model.train()

    def step() -> None:
        autocast = (torch.autocast("cuda", dtype=dtype) if dtype is not None
                    else contextlib.nullcontext())
        with autocast:
            loss = model(**inputs).loss
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure_cuda(setup: StepSetup, *, weights: str | Path | None = None,
                 on_step: OnStep | None = None) -> tuple[CudaMeasured, Timing]:
    """Real steps on ``cuda:0``; the first step is warm-up for timing (not for the peaks)."""
    if not torch.cuda.is_available():
        raise UnsupportedError("--device cuda: torch sees no CUDA device")
    if setup.strategy.method is Method.QLORA:
        raise UnsupportedError("the CUDA probe does not run qlora yet (use --simulate)")
    dev = torch.device("cuda", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model, inputs = cuda_job(setup, weights)
        torch.cuda.reset_peak_memory_stats(dev)
        step = cuda_step(model, inputs, setup)
        starts: list[float] = []
        try:
            for _ in range(setup.steps):
                torch.cuda.synchronize()
                starts.append(time.perf_counter())
                if on_step:
                    on_step(len(starts))
                step()
        except torch.cuda.OutOfMemoryError as exc:
            peak = torch.cuda.max_memory_allocated(dev)
            raise ProbeError(f"out of memory on {torch.cuda.get_device_name(dev)} in step "
                             f"{len(starts)} (allocated peak {peak:,} B): it does not fit") from exc
        torch.cuda.synchronize(dev)
        ended = time.perf_counter()
    free, total = torch.cuda.mem_get_info(dev)
    params = harness._unique_params(model)
    measured = CudaMeasured(
        device_name=torch.cuda.get_device_name(dev),
        max_allocated_bytes=torch.cuda.max_memory_allocated(dev),
        max_reserved_bytes=torch.cuda.max_memory_reserved(dev),
        device_total_bytes=int(total), device_used_bytes=int(total - free),
        reserved_end_bytes=torch.cuda.memory_reserved(dev),
        trainable_params=sum(p.numel() for p in params if p.requires_grad),
        total_params=sum(p.numel() for p in params))
    return measured, _timing(setup, starts, ended)
