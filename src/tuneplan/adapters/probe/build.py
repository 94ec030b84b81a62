"""Build the model, PEFT wrapper, inputs and optimizer of a measured step (real or fake).

Real: random weights on the CPU from a config dict. Fake: the same model built on the meta
device (PEFT included), then every meta parameter/buffer swapped in place for a fake CPU
tensor (ties kept), following FIELD-NOTES. No downloads; bitsandbytes is not handled here.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from tuneplan.errors import ProbeError, UnsupportedError

if TYPE_CHECKING:
    from tuneplan.adapters.probe.harness import StepSetup

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PEFT_METHODS = ("lora", "dora", "prefix", "prompt", "ia3")
_DROP_KEYS = ("torch_dtype", "dtype", "transformers_version", "quantization_config")


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise UnsupportedError(f"dtype {name!r} is not one of {sorted(DTYPES)}") from None


def make_config(config: Mapping[str, Any], task: str) -> Any:
    """A transformers config object from a config.json dict (no hub access)."""
    from transformers import AutoConfig

    cfg = {k: v for k, v in config.items() if k not in _DROP_KEYS}
    if "model_type" not in cfg:
        raise UnsupportedError("the config has no model_type")
    hf = AutoConfig.for_model(**cfg)
    hf.use_cache = False  # training: no KV cache (Trainer also turns it off with checkpointing)
    if task == "seq-cls":
        hf.num_labels = 2
        if getattr(hf, "pad_token_id", None) is None:
            hf.pad_token_id = 0
    return hf


def is_moe(config: Mapping[str, Any]) -> bool:
    keys = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
    return any(config.get(k) for k in keys)


def check_supported(setup: StepSetup) -> None:
    """Refuse, with the reason, what the harness cannot run (seen failing, see FIELD-NOTES)."""
    if setup.task not in ("causal-lm", "seq-cls"):
        raise UnsupportedError(f"task {setup.task!r} is not causal-lm or seq-cls")
    if setup.attention not in ("sdpa", "eager"):
        raise UnsupportedError(f"attention {setup.attention!r} is not sdpa or eager")
    if not setup.fake:
        return
    if is_moe(setup.config) and setup.param_dtype != "bfloat16":
        raise UnsupportedError(
            "MoE under fake tensors needs bfloat16 params (grouped_mm is bf16-only)"
        )
    if is_moe(setup.config) and setup.method == "qlora" and setup.kbit_prepare:
        raise UnsupportedError(
            "MoE qlora under fake tensors: kbit preparation upcasts the unquantized 3-D"
            " experts to fp32, and grouped_mm is bf16-only (use kbit_prepare=False)"
        )
    if setup.optimizer == "adafactor":
        raise UnsupportedError(
            "torch Adafactor reads tensor values (.item()): not under fake tensors"
        )


def build_base(setup: StepSetup) -> nn.Module:
    """The transformers model from the config, random weights, on CPU or meta."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    check_supported(setup)
    auto = AutoModelForCausalLM if setup.task == "causal-lm" else AutoModelForSequenceClassification
    hf = make_config(setup.config, setup.task)
    torch.manual_seed(setup.seed)
    device = torch.device("meta") if setup.fake else torch.device("cpu")
    try:
        with device:
            model: Any = auto.from_config(  # type: ignore[no-untyped-call]
                hf, attn_implementation=setup.attention, dtype=dtype_of(setup.param_dtype)
            )
    except ValueError as exc:  # e.g. "Gemma2ForCausalLM does not support ... sdpa yet"
        raise UnsupportedError(f"transformers cannot build it: {exc}") from exc
    if setup.gradient_checkpointing:
        enable_checkpointing(model, input_grads=setup.method in PEFT_METHODS)
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
    import peft

    task_type = "CAUSAL_LM" if setup.task == "causal-lm" else "SEQ_CLS"
    targets: Any = setup.lora_targets
    if isinstance(targets, tuple):
        targets = list(targets)
    to_save = list(setup.trainable_modules) or None
    if setup.method in ("lora", "dora"):
        return peft.LoraConfig(
            r=setup.lora_rank,
            lora_alpha=setup.lora_alpha,
            lora_dropout=setup.lora_dropout,
            target_modules=targets,
            use_dora=setup.method == "dora",
            modules_to_save=to_save,
            task_type=task_type,
        )
    if setup.method == "ia3":
        # "all-linear" is LoRA's default; IA3 uses PEFT's per-architecture default targets.
        explicit = None if targets == "all-linear" else targets
        return peft.IA3Config(target_modules=explicit, modules_to_save=to_save, task_type=task_type)
    cls = peft.PrefixTuningConfig if setup.method == "prefix" else peft.PromptTuningConfig
    return cls(num_virtual_tokens=setup.num_virtual_tokens, task_type=task_type)


def apply_method(model: nn.Module, setup: StepSetup) -> nn.Module:
    """Full fine-tuning leaves the model as is; PEFT methods wrap it like Trainer users do."""
    if setup.method == "full":
        return model
    if setup.method == "qlora":
        return model  # built by qlora.build_qlora, adapters included
    if setup.method not in PEFT_METHODS:
        raise UnsupportedError(f"method {setup.method!r} is not one of full, {PEFT_METHODS}")
    import peft

    try:
        wrapped: nn.Module = peft.get_peft_model(
            model, peft_config(setup), autocast_adapter_dtype=True
        )
        return wrapped
    except (ValueError, TypeError) as exc:
        raise UnsupportedError(f"peft cannot apply {setup.method}: {exc}") from exc


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
    """transformers reads position ids to detect packing; fake ids read as packed (FIELD-NOTES)."""
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
    shape = (setup.batch_size, setup.seq_len)
    ids = torch.randint(1, vocab_size, shape, generator=gen)
    labels = ids.clone() if setup.task == "causal-lm" else torch.randint(
        0, 2, shape[:1], generator=gen)
    return {"input_ids": ids, "labels": labels}


def make_optimizer(params: list[nn.Parameter], setup: StepSetup) -> torch.optim.Optimizer:
    """The optimizer with its implementation chosen explicitly (it sets the step temporary)."""
    impl = setup.optimizer_impl
    if impl not in ("fused", "foreach", "single"):
        raise UnsupportedError(f"optimizer_impl {impl!r} is not fused, foreach or single")
    flags: dict[str, Any] = {"foreach": impl == "foreach"}
    if impl == "fused":
        flags = {"fused": True, "foreach": False}
    if setup.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **flags)
    if setup.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags)
    if setup.optimizer in ("adamw8bit", "lion"):
        return _bnb_optimizer(params, setup.optimizer)
    if setup.optimizer == "adafactor":
        if impl == "fused":
            raise UnsupportedError("torch Adafactor has no fused implementation")
        return torch.optim.Adafactor(params, lr=1e-2, foreach=flags["foreach"])
    raise UnsupportedError(
        f"optimizer {setup.optimizer!r} is not adamw, sgd, adafactor, adamw8bit or lion"
    )


def _bnb_optimizer(params: list[nn.Parameter], name: str) -> torch.optim.Optimizer:
    """bitsandbytes' AdamW8bit or (32-bit) Lion; under fake tensors its code tables are
    computed from real values first (FIELD-NOTES), then made fake."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    bnb: Any = _import_bnb(name)
    cls = bnb.optim.Lion if name == "lion" else bnb.optim.AdamW8bit
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
