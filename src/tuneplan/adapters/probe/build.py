"""Build the model, PEFT wrapper, inputs and optimizer of a measured step (real or fake).

Real: random weights on the CPU from a config dict. Fake: the same model built on the meta
device (PEFT included), then every meta parameter/buffer swapped in place for a fake CPU
tensor (ties kept), following docs/FIELD-NOTES.md. No downloads; bitsandbytes is not handled here.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from tuneplan.core.job.methods import Method
from tuneplan.core.job.strategy import ALL_LINEAR, Optimizer, Task
from tuneplan.core.job.tuners import TUNER_METHODS, PeftSpec, peft_spec
from tuneplan.core.models import parse_model_config
from tuneplan.errors import ProbeError, UnsupportedError

if TYPE_CHECKING:
    from tuneplan.adapters.probe.harness import StepSetup
    from tuneplan.adapters.probe.tracker import StorageTracker

# Methods that wrap the model with ``peft.get_peft_model`` (QLoRA does so after 4-bit loading).
PEFT_METHODS = frozenset({Method.LORA, Method.DORA, Method.PREFIX, Method.PROMPT,
                          Method.IA3}) | TUNER_METHODS
_DROP_KEYS = ("torch_dtype", "dtype", "transformers_version", "quantization_config")


def make_config(config: Mapping[str, Any], task: Task) -> Any:
    """A transformers config object from a config.json dict (no hub access)."""
    from transformers import AutoConfig

    cfg = {k: v for k, v in config.items() if k not in _DROP_KEYS}
    if "model_type" not in cfg:
        raise UnsupportedError("the config has no model_type")
    hf = AutoConfig.for_model(**cfg)
    hf.use_cache = False  # training: no KV cache (Trainer also turns it off with checkpointing)
    if task is Task.SEQ_CLS:
        hf.num_labels = 2  # --num-labels other than 2 is refused (harness.refuse_unrunnable)
        if getattr(hf, "pad_token_id", None) is None:
            hf.pad_token_id = 0
    return hf


def is_moe(config: Mapping[str, Any]) -> bool:
    keys = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
    return any(config.get(k) for k in keys)


def check_supported(setup: StepSetup) -> None:
    """Refuse, with the reason, what fake tensors cannot run (seen failing, see
    docs/FIELD-NOTES.md); the job's own unrunnable flags were refused when ``setup`` was made."""
    if not setup.fake:
        return
    if is_moe(setup.config) and setup.param_dtype is not torch.bfloat16:
        raise UnsupportedError(
            "MoE under fake tensors needs bfloat16 params (grouped_mm is bf16-only)"
        )
    if is_moe(setup.config) and setup.strategy.method is Method.QLORA and setup.kbit_prepare:
        raise UnsupportedError(
            "MoE qlora under fake tensors: kbit preparation upcasts the unquantized 3-D"
            " experts to fp32, and grouped_mm is bf16-only (use --recipe plain)"
        )
    if setup.strategy.optimizer is Optimizer.ADAFACTOR:
        raise UnsupportedError(
            "torch Adafactor reads tensor values (.item()): not under fake tensors"
        )


def is_encoder_decoder(config: Mapping[str, Any] | None) -> bool:
    """A T5-style config (``is_encoder_decoder``, or a model_type that is one)."""
    if not config:
        return False
    return bool(config.get("is_encoder_decoder")) or config.get("model_type") in _SEQ2SEQ_TYPES


_SEQ2SEQ_TYPES = frozenset({"t5", "mt5", "bart", "mbart", "umt5"})


def auto_class(task: Task, config: Mapping[str, Any] | None = None) -> Any:
    """The Auto class a job builds: an encoder-decoder language model is an
    ``AutoModelForSeq2SeqLM`` (T5ForConditionalGeneration), not a causal LM."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSeq2SeqLM,
        AutoModelForSequenceClassification,
    )

    if task is Task.CAUSAL_LM and is_encoder_decoder(config):
        return AutoModelForSeq2SeqLM
    return AutoModelForCausalLM if task is Task.CAUSAL_LM else AutoModelForSequenceClassification


def build_base(setup: StepSetup, *, checkpointing: bool = True) -> nn.Module:
    """The transformers model from the config, random weights, on ``setup.device`` or meta, in
    ``setup.param_dtype``; with the job's checkpointing unless ``checkpointing`` is False."""
    check_supported(setup)
    s = setup.strategy
    auto = auto_class(s.task, setup.config)
    hf = make_config(setup.config, s.task)
    torch.manual_seed(setup.seed)
    device = torch.device("meta") if setup.fake else torch.device(setup.device)
    try:
        with device:
            model: Any = auto.from_config(
                hf, attn_implementation=str(s.attention), dtype=setup.param_dtype
            )
    except ValueError as exc:  # e.g. "Gemma2ForCausalLM does not support ... sdpa yet"
        raise UnsupportedError(f"transformers cannot build it: {exc}") from exc
    if checkpointing and setup.checkpointing:
        enable_checkpointing(model, input_grads=s.method in PEFT_METHODS)
    return cast(nn.Module, model)


def enable_checkpointing(model: Any, *, input_grads: bool) -> None:
    """Non-reentrant activation checkpointing as Trainer turns it on; ``input_grads``: also
    make the embedding output require grad (what Trainer does for PEFT models)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if input_grads:
        model.enable_input_require_grads()


def peft_config(setup: StepSetup) -> Any:
    """The PEFT config of the job's method (QLoRA: its LoRA adapters)."""
    import peft

    s = setup.strategy
    if s.method in TUNER_METHODS:
        spec = tuner_spec(setup)
        return getattr(peft, spec.config_class)(**spec.kwargs)
    task_type = ("SEQ_2_SEQ_LM" if is_encoder_decoder(setup.config) else "CAUSAL_LM") if (
        s.task is Task.CAUSAL_LM) else "SEQ_CLS"
    # PEFT takes the string "all-linear" or a list of module names.
    targets: Any = ALL_LINEAR if s.all_linear else list(s.lora_targets)
    to_save = list(s.trainable_modules) or None
    if s.method in (Method.LORA, Method.DORA, Method.QLORA):
        return peft.LoraConfig(
            r=s.lora_rank,
            lora_alpha=s.lora_alpha,
            lora_dropout=s.lora_dropout,
            target_modules=targets,
            use_dora=s.method is Method.DORA,
            modules_to_save=to_save,
            task_type=task_type,
        )
    if s.method is Method.IA3:
        # "all-linear" is LoRA's default; IA3 uses PEFT's per-architecture default targets.
        explicit = None if s.all_linear else targets
        return peft.IA3Config(target_modules=explicit, modules_to_save=to_save, task_type=task_type)
    cls = peft.PrefixTuningConfig if s.method is Method.PREFIX else peft.PromptTuningConfig
    return cls(num_virtual_tokens=s.num_virtual_tokens, modules_to_save=to_save,
               task_type=task_type)


def tuner_spec(setup: StepSetup) -> PeftSpec:
    """The PEFT config of a tuner job, as the estimate and the launch bundle have it."""
    return peft_spec(parse_model_config(setup.config, name="probe"), setup.strategy)


def freeze_named(model: nn.Module, names: tuple[str, ...]) -> None:
    """Freeze the adapter parameters ``names`` (LoRA-FA's ``lora_A``) after ``get_peft_model``."""
    for name, p in model.named_parameters():
        if any(f".{n}." in name for n in names):
            p.requires_grad_(False)


def apply_method(model: nn.Module, setup: StepSetup) -> nn.Module:
    """Full fine-tuning leaves the model as is; PEFT methods wrap it like Trainer users do."""
    method = setup.strategy.method
    if method in (Method.FULL, Method.QLORA):
        return model  # QLoRA: built by qlora.build_qlora, adapters included
    if method not in PEFT_METHODS:
        raise UnsupportedError(f"method {method} is not full, qlora or a PEFT method")
    import peft

    try:
        wrapped: nn.Module = peft.get_peft_model(
            model, peft_config(setup), autocast_adapter_dtype=True
        )
        if method in TUNER_METHODS:
            freeze_named(wrapped, tuner_spec(setup).freeze)
        return wrapped
    except (ValueError, TypeError) as exc:
        raise UnsupportedError(f"peft cannot apply {method}: {exc}") from exc


def fakeify_(model: nn.Module, mode: Any) -> None:
    """Swap every meta parameter/buffer for a fake CPU tensor in place, keeping ties."""
    swapped: dict[int, Any] = {}
    with mode:
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                if id(p) not in swapped:
                    fake = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                    swapped[id(p)] = nn.Parameter(fake, requires_grad=p.requires_grad)
                module._parameters[name] = swapped[id(p)]
            for name, b in list(module._buffers.items()):
                if b is None:
                    continue
                if id(b) not in swapped:
                    swapped[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
                module._buffers[name] = swapped[id(b)]
        for module in model.modules():
            _fakeify_plain_attributes(module, mode)
    leftover = [n for n, t in model.state_dict(keep_vars=True).items() if t.device.type == "meta"]
    if leftover:
        raise ProbeError(f"meta tensors left after the fake swap: {leftover[:3]}")


def _to_fake(t: torch.Tensor, mode: Any) -> torch.Tensor:
    if t.device.type == "meta":
        return torch.empty(t.shape, dtype=t.dtype, device="cpu")
    fake: torch.Tensor = mode.from_tensor(t)
    return fake  # keeps the values (e.g. PEFT's prompt token ids)


def _fakeify_plain_attributes(module: nn.Module, mode: Any) -> None:
    """Tensors kept as plain attributes (PEFT's ``prompt_tokens`` dict) must be fake too."""
    from torch._subclasses.fake_tensor import FakeTensor

    for key, value in list(vars(module).items()):
        if key.startswith("_"):
            continue
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor | nn.Parameter):
            setattr(module, key, _to_fake(value, mode))
        elif isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values()):
            for k, v in list(value.items()):
                if isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor):
                    value[k] = _to_fake(v, mode)


@contextmanager
def patched_packed_sequence_check() -> Iterator[None]:
    """transformers reads position ids to detect packing; fake ids read as packed
    (docs/FIELD-NOTES.md)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices

    def find(position_ids: torch.Tensor) -> torch.Tensor | None:
        if isinstance(position_ids, FakeTensor):
            return None  # the harness never packs; random ids are one sequence per row
        return original(position_ids)

    masking_utils.find_packed_sequence_indices = find
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def make_inputs(setup: StepSetup, vocab_size: int) -> dict[str, torch.Tensor]:
    """Random token ids (never 0, the seq-cls pad id) and labels, as the step's batch."""
    # Fake inputs are made inside fake mode: no generator there, and values are never read.
    gen = None if setup.fake else torch.Generator().manual_seed(setup.seed)
    s = setup.strategy
    shape = (s.batch_size, s.seq_len)
    ids = torch.randint(1, vocab_size, shape, generator=gen)
    labels = ids.clone() if s.task is Task.CAUSAL_LM else torch.randint(
        0, 2, shape[:1], generator=gen)
    return {"input_ids": ids, "labels": labels}


def tracked_optimizer(params: list[nn.Parameter], setup: StepSetup, tracker: StorageTracker
                      ) -> tuple[torch.optim.Optimizer, list[Any]]:
    """``setup``'s optimizer over ``params`` and, per parameter, a hook that tells ``tracker``
    when its gradient is complete (what every probe step sets up before its loop); remove
    the hooks when done."""
    hooks = [p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
        lambda p: tracker.mark_gradient(p.grad)) for p in params]
    return make_optimizer(params, setup), hooks


def make_optimizer(params: list[nn.Parameter], setup: StepSetup) -> torch.optim.Optimizer:
    """The optimizer with its implementation chosen explicitly (it sets the step temporary)."""
    impl = setup.impl
    flags: dict[str, Any] = {"foreach": impl == "foreach"}
    if impl == "fused":
        flags = {"fused": True, "foreach": False}
    optimizer = setup.strategy.optimizer
    if optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=1e-4, **flags)
    if optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags)
    if optimizer in (Optimizer.ADAMW8BIT, Optimizer.LION):
        return _bnb_optimizer(params, optimizer)
    if optimizer is Optimizer.ADAFACTOR:
        if impl == "fused":
            raise UnsupportedError("torch Adafactor has no fused implementation")
        return torch.optim.Adafactor(params, lr=1e-2, foreach=flags["foreach"])
    raise UnsupportedError(  # refused when the StepSetup was made; kept for safety
        f"--optimizer {optimizer} is not adamw, sgd, adafactor, adamw8bit or lion"
    )


def _bnb_optimizer(params: list[nn.Parameter], name: Optimizer) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW8bit or (32-bit) Lion; under fake tensors its code tables are
    computed from real values first (docs/FIELD-NOTES.md), then made fake."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    bnb: Any = _import_bnb(name)
    cls = bnb.optim.Lion if name is Optimizer.LION else bnb.optim.AdamW8bit
    mode = next((p.fake_mode for p in params if isinstance(p, FakeTensor)), None)
    if mode is None:
        return cast(torch.optim.Optimizer, cls(params, lr=1e-4))
    with unset_fake_temporarily():
        opt = cls(params, lr=1e-4)
    opt.name2qmap = {k: mode.from_tensor(v) for k, v in opt.name2qmap.items()}
    return cast(torch.optim.Optimizer, opt)


def _import_bnb(what: str) -> Any:
    try:
        return importlib.import_module("bitsandbytes")
    except ImportError:
        raise UnsupportedError(f"{what} needs bitsandbytes (pip install bitsandbytes)") from None
