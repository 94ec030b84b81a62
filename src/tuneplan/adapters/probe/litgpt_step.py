"""LitGPT's own training step under the live-bytes tracker (``--recipe litgpt``).

Builds litgpt's ``GPT`` (full fine-tuning) or ``litgpt.lora.GPT`` (LoRA) from a llama-style
config.json mapping and runs the step of litgpt 0.5.13 ``finetune/lora.py::fit`` /
``finetune/full.py::fit`` as written there, with what Lightning Fabric adds on one device:

- ``bf16-true``: the module built and kept in bf16 (``HalfPrecision.convert_module``), the
  forward under bf16 as the default dtype; ``bf16-mixed``: an fp32 module under
  ``torch.autocast`` (``MixedPrecision.forward_context``); ``32-true``: fp32, nothing else.
  Both 16-bit plugins cast the forward's outputs to the default dtype (fp32) in
  ``convert_output``: every logits chunk gets an fp32 copy.
- ``model.max_seq_length`` set to the batch's length after setup (the RoPE cache rebuilt in
  fp32, as ``fit`` does).
- ``logits = model(input_ids, lm_head_chunk_size=128)``; ``logits[-1] = logits[-1][..., :-1, :]``;
  ``loss = chunked_cross_entropy(logits, targets[..., 1:])``; backward; ``optimizer.step()``;
  ``optimizer.zero_grad()`` (set_to_none). ``logits`` and ``loss`` are loop variables: they stay
  alive through backward, the optimizer step and the next forward, until rebound.
- checkpointing: torch's ``apply_activation_checkpointing`` on every ``Block``, non-reentrant,
  what Fabric's ``FSDPStrategy(activation_checkpointing_policy={Block})`` in
  ``finetune/full.py`` applies.

QLoRA (``--quantize bnb.nf4``: Lightning's ``BitsandbytesPrecision`` replaces every
``nn.Linear``, ``lm_head`` included) needs bitsandbytes' CUDA kernels and is refused here.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from tuneplan.adapters.probe import build
from tuneplan.adapters.probe.harness import MeasuredStep, StepSetup, measured_step
from tuneplan.adapters.probe.tracker import StorageTracker
from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import Attention, Checkpointing, Loss, Precision, Strategy
from tuneplan.errors import ProbeError, UnsupportedError

#: litgpt finetune/lora.py and full.py: ``model(input_ids, lm_head_chunk_size=128)`` (LoRA);
#: full.py calls ``model(input_ids)`` and ``chunked_cross_entropy(logits[..., :-1, :], ...)``.
LM_HEAD_CHUNK = 128
_LLAMA_LIKE = ("llama", "mistral")
#: tuneplan's LoRA target names -> litgpt.lora.Config flags (fused qkv: one LoRAQKVLinear).
_TARGET_FLAGS = {"q_proj": "lora_query", "k_proj": "lora_key", "v_proj": "lora_value",
                 "o_proj": "lora_projection", "gate_proj": "lora_mlp", "up_proj": "lora_mlp",
                 "down_proj": "lora_mlp", "lm_head": "lora_head"}


def refuse_unrunnable(s: Strategy) -> None:
    """What this LitGPT step cannot run, with the flag."""
    reasons = [
        (s.method not in (Method.FULL, Method.LORA),
         f"--method {s.method} (the litgpt simulation runs full and lora; qlora needs "
         "bitsandbytes' CUDA kernels)"),
        (s.precision is Precision.FP16_MIXED, "--precision fp16-mixed"),
        (s.checkpointing is Checkpointing.OFFLOAD, "--offload-activations"),
        (s.world_size > 1 or s.grad_accum > 1, "more than one GPU or micro-batch"),
        (bool(s.trainable_modules), "--trainable-modules"),
        (s.loss is Loss.STANDARD, "--loss standard (litgpt's scripts always chunk the loss)"),
        (s.attention is Attention.EAGER, "--attention eager (litgpt runs SDPA)"),
    ]
    for bad, what in reasons:
        if bad:
            raise UnsupportedError(f"the litgpt simulation cannot run {what}")


def lora_flags(s: Strategy) -> dict[str, bool]:
    """litgpt.lora.Config's ``lora_*`` flags for the job's targets ("all-linear": every
    linear in the blocks, not the head, as PEFT's rule)."""
    if s.all_linear:
        return {"lora_query": True, "lora_key": True, "lora_value": True,
                "lora_projection": True, "lora_mlp": True, "lora_head": False}
    mlp = {"gate_proj", "up_proj", "down_proj"} & set(s.lora_targets)
    if 0 < len(mlp) < 3:
        raise UnsupportedError("litgpt's lora_mlp adapts gate, up and down together: name all "
                               "three or none")
    flags = dict.fromkeys(set(_TARGET_FLAGS.values()), False)
    for name in s.lora_targets:
        if name not in _TARGET_FLAGS:
            raise UnsupportedError(f"litgpt has no LoRA flag for target {name!r}")
        flags[_TARGET_FLAGS[name]] = True
    return flags


def litgpt_config(config: Mapping[str, Any], s: Strategy) -> Any:
    """litgpt's Config (lora.Config for LoRA) for a llama-style config.json mapping."""
    from litgpt import lora
    from litgpt.config import Config

    if config.get("model_type") not in _LLAMA_LIKE or config.get("tie_word_embeddings"):
        raise UnsupportedError("the litgpt simulation builds untied llama/mistral configs")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    kw: dict[str, Any] = dict(
        name="tuneplan-sim", block_size=max(int(config.get("max_position_embeddings", 0)),
                                            s.seq_len),
        vocab_size=int(config["vocab_size"]), padded_vocab_size=int(config["vocab_size"]),
        n_layer=int(config["num_hidden_layers"]), n_head=heads, n_embd=hidden,
        n_query_groups=int(config.get("num_key_value_heads", heads)),
        head_size=int(config.get("head_dim") or hidden // heads), rotary_percentage=1.0,
        parallel_residual=False, bias=False, norm_class_name="RMSNorm",
        norm_eps=float(config.get("rms_norm_eps", 1e-5)), mlp_class_name="LLaMAMLP",
        intermediate_size=int(config["intermediate_size"]),
        rope_base=int(config.get("rope_theta", 10000)))
    if s.method is Method.LORA:
        return lora.Config(**kw, lora_r=s.lora_rank, lora_alpha=s.lora_alpha,
                           lora_dropout=s.lora_dropout, **lora_flags(s))
    return Config(**kw)


def _param_dtype(s: Strategy) -> torch.dtype:
    return torch.bfloat16 if s.precision is Precision.BF16 else torch.float32


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(setup: StepSetup) -> nn.Module:
    """The litgpt model, built as ``fabric.init_module`` does (default dtype = the weights'),
    on the meta device when fake; LoRA: ``mark_only_lora_as_trainable``."""
    from litgpt import lora
    from litgpt.model import GPT

    s = setup.strategy
    cfg = litgpt_config(setup.config, s)
    torch.manual_seed(setup.seed)
    device = torch.device("meta") if setup.fake else torch.device("cpu")
    with device, _default_dtype(_param_dtype(s)):
        model: nn.Module = lora.GPT(cfg) if s.method is Method.LORA else GPT(cfg)
    if s.method is Method.LORA:
        lora.mark_only_lora_as_trainable(model)
    return model


def _checkpoint_blocks(model: nn.Module) -> None:
    from litgpt.model import Block
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))


def _forward_context(s: Strategy) -> contextlib.AbstractContextManager[Any]:
    if s.precision is Precision.BF16_MIXED:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if s.precision is Precision.BF16:
        return _default_dtype(torch.bfloat16)
    return contextlib.nullcontext()


def _convert_output(s: Strategy, out: Any) -> Any:
    """Fabric's 16-bit plugins: floating outputs to the default dtype (fp32)."""
    if s.precision is Precision.FP32:
        return out
    if isinstance(out, list):
        return [t.to(torch.get_default_dtype()) for t in out]
    return out.to(torch.get_default_dtype())


def measure_litgpt_step(setup: StepSetup, *, on_step: Callable[[int], None] | None = None,
                        starts: list[float] | None = None) -> MeasuredStep:
    """``setup.steps`` steps of litgpt's fit loop (module docstring) under the tracker;
    ``on_step(i)`` is called as step i starts, whose start time is appended to ``starts``."""
    from litgpt.utils import chunked_cross_entropy

    s = setup.strategy
    refuse_unrunnable(s)
    started = time.perf_counter()
    notes = ["litgpt fit loop: logits and loss kept as loop variables"]
    model = build_model(setup)
    fake_mode: Any = contextlib.nullcontext()
    if setup.fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        build.fakeify_(model, fake_mode)
        notes.append("fake tensors on cpu (FakeTensorMode)")
    tracker = StorageTracker()
    chunked = s.method is Method.LORA
    with fake_mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.max_seq_length = s.seq_len  # type: ignore[assignment]  # fit(): the RoPE cache rebuilt at the data's length
        if s.checkpointing is Checkpointing.FULL:
            _checkpoint_blocks(model)
        gen = None if setup.fake else torch.Generator().manual_seed(setup.seed)
        vocab = int(setup.config["vocab_size"])
        ids = torch.randint(1, vocab, (s.batch_size, s.seq_len), generator=gen)
        targets = ids.clone()
        tracker.register_all(model.buffers(), "buffers")
        tracker.register_all(model.parameters(), "parameters")
        tracker.register_all([ids, targets], "inputs")
        params = [p for p in model.parameters() if p.requires_grad]
        opt, hooks = build.tracked_optimizer(params, setup, tracker)
        model.train()
        tracker.take_window_peak()
        peaks: list[int] = []
        step_start = time.perf_counter()
        logits: Any = None
        loss: Any = None
        try:
            with tracker:
                for i in range(setup.steps):
                    if starts is not None:
                        starts.append(time.perf_counter())
                    if on_step is not None:
                        on_step(i + 1)
                    with tracker.phase("forward"):
                        with _forward_context(s):
                            out = model(ids, lm_head_chunk_size=LM_HEAD_CHUNK) if chunked \
                                else model(ids)
                        logits = _convert_output(s, out)
                        del out
                        if chunked:
                            logits[-1] = logits[-1][..., :-1, :]
                            loss = chunked_cross_entropy(logits, targets[..., 1:])
                        else:
                            loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
                    with tracker.phase("backward"):
                        loss.backward()
                    with tracker.phase("optimizer"):
                        opt.step()
                        tracker.finish_optimizer_step(
                            v for st in opt.state.values() for v in st.values()
                            if isinstance(v, torch.Tensor))
                        opt.zero_grad(set_to_none=True)
                    peaks.append(tracker.take_window_peak())
        except (RuntimeError, AssertionError, NotImplementedError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ProbeError(f"the litgpt {s.method} step failed: {first}") from exc
        finally:
            for h in hooks:
                h.remove()
        step_seconds = time.perf_counter() - step_start
        del logits, loss
    result = tracker.result()
    return measured_step(model, result, peaks, seconds=time.perf_counter() - started,
                         step_seconds=step_seconds, notes=tuple(notes))
