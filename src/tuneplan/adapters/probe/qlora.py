"""QLoRA for the harness: real NF4/FP4 on the CPU, or a fake-tensor stand-in for big models.

Real: the random model is saved to a temporary folder and reloaded with a
``BitsAndBytesConfig`` (the path users take). Fake: transformers' own Linear→Linear4bit swap
on meta, then ``FakeLinear4bit`` stand-ins. Both then optionally run PEFT's
``prepare_model_for_kbit_training`` and add LoRA. Does not model 8-bit (LLM.int8) loading.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from tuneplan.errors import UnsupportedError

if TYPE_CHECKING:
    from tuneplan.adapters.probe.harness import StepSetup


def _bnb_config(setup: StepSetup) -> Any:
    from transformers import BitsAndBytesConfig

    compute = setup.autocast_dtype or setup.param_dtype
    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type=str(setup.strategy.quant),  # nf4 | fp4 (others refused)
        bnb_4bit_use_double_quant=setup.strategy.double_quant,
        bnb_4bit_compute_dtype=compute,
    )


def build_qlora(setup: StepSetup) -> nn.Module:
    """The 4-bit model with LoRA adapters, as a user's QLoRA script builds it."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise UnsupportedError("qlora needs bitsandbytes (pip install bitsandbytes)") from None
    if setup.fake:
        return build_qlora_fake(setup)
    from tuneplan.adapters.probe import build

    base = build.build_base(setup, checkpointing=False)  # checkpointing comes after loading
    auto = build.auto_class(setup.strategy.task, setup.config)
    with tempfile.TemporaryDirectory(prefix="tuneplan-qlora-") as folder:
        base.save_pretrained(folder)  # type: ignore[operator]
        del base
        model: Any = auto.from_pretrained(
            folder,
            quantization_config=_bnb_config(setup),
            device_map="cpu",
            dtype=setup.param_dtype,
            attn_implementation=str(setup.strategy.attention),
        )
    return cast(nn.Module, _prepare_and_wrap(model, setup))


def _prepare_and_wrap(model: Any, setup: StepSetup) -> Any:
    """What a QLoRA script does after loading: kbit preparation, checkpointing, LoRA."""
    import peft

    from tuneplan.adapters.probe import build

    model.config.use_cache = False
    kwargs = {"use_reentrant": False}
    if setup.kbit_prepare:
        model = peft.prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
            model,
            use_gradient_checkpointing=setup.checkpointing,
            gradient_checkpointing_kwargs=kwargs,
        )
    elif setup.checkpointing:
        build.enable_checkpointing(model, input_grads=True)
    return peft.get_peft_model(model, build.peft_config(setup), autocast_adapter_dtype=True)


def quant_state_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """bitsandbytes' per-block constants: neither parameters nor buffers, so listed here."""
    holders = [*model.parameters(), *(m for m in model.modules() if isinstance(m, FakeLinear4bit))]
    for holder in holders:
        state = getattr(holder, "quant_state", None)
        while state is not None:
            for name in ("absmax", "code", "offset"):
                value = getattr(state, name, None)
                if isinstance(value, torch.Tensor):
                    yield value
            state = getattr(state, "state2", None)


class FakeLinear4bit(nn.Module):
    """Stands in for ``bnb.nn.Linear4bit`` under fake tensors (Params4bit cannot be faked).

    Holds the packed 4-bit weight as a plain frozen parameter and a ``QuantState`` of the
    same shapes ``quantize_4bit`` produces, and computes as ``Linear4bit.forward`` does.
    """

    def __init__(self, src: Any, dtype: torch.dtype) -> None:
        super().__init__()
        out_f, in_f = int(src.out_features), int(src.in_features)
        w = src.weight
        self.in_features, self.out_features = in_f, out_f
        self.compute_dtype: torch.dtype | None = src.compute_dtype
        self.quant_type = str(w.quant_type)
        self.blocksize = int(w.blocksize)
        self.compress_statistics = bool(w.compress_statistics)
        # The dtype the real checkpoint is quantized from (the meta stand-in is fp32).
        self.orig_dtype = dtype
        packed = torch.empty(((out_f * in_f + 1) // 2, 1), dtype=torch.uint8, device="meta")
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.bias: nn.Parameter | None = src.bias
        self.quant_state: Any = None

    def materialize(self) -> None:
        """Create the quant state's fake tensors; call inside the fake mode."""
        bnbf: Any = importlib.import_module("bitsandbytes.functional")

        blocks = -(-(self.out_features * self.in_features) // self.blocksize)
        code = torch.empty(16, dtype=torch.float32)
        offset, state2 = None, None
        absmax = torch.empty(blocks, dtype=torch.float32)
        if self.compress_statistics:  # absmax re-quantized to 8 bits in blocks of 256
            absmax = torch.empty(blocks, dtype=torch.uint8)
            offset = torch.empty((), dtype=torch.float32)
            state2 = bnbf.QuantState(
                absmax=torch.empty(-(-blocks // 256), dtype=torch.float32),
                code=torch.empty(256, dtype=torch.float32),
                blocksize=256,
                dtype=torch.float32,
            )
        self.quant_state = bnbf.QuantState(
            absmax=absmax,
            shape=torch.Size([self.out_features, self.in_features]),
            code=code,
            blocksize=self.blocksize,
            quant_type=self.quant_type,
            dtype=self.orig_dtype,
            offset=offset,
            state2=state2,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bnb: Any = importlib.import_module("bitsandbytes")

        inp_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        bias: torch.Tensor | None = self.bias
        if self.bias is not None:
            if self.bias.dtype != x.dtype:  # Linear4bit swaps the bias storage itself, in place
                self.bias.data = self.bias.data.to(x.dtype)
            bias = self.bias.to(self.compute_dtype)
        out = bnb.matmul_4bit(x, self.weight, bias=bias, quant_state=self.quant_state)
        return cast(torch.Tensor, out.to(inp_dtype))


def build_qlora_fake(setup: StepSetup) -> nn.Module:
    """On meta: replace Linears as from_pretrained does, prepare, add LoRA, swap stand-ins."""
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import HfQuantizer

    from tuneplan.adapters.probe import build

    model: Any = build.build_base(setup, checkpointing=False)
    skip = HfQuantizer.get_modules_to_not_convert(model, None, model._keep_in_fp32_modules)
    replace_with_bnb_linear(
        model, modules_to_not_convert=skip, quantization_config=_bnb_config(setup)
    )
    model.is_loaded_in_4bit = True
    model = _prepare_and_wrap(model, setup)
    bnb: Any = importlib.import_module("bitsandbytes")
    for name, module in list(model.named_modules()):
        if isinstance(module, bnb.nn.Linear4bit):
            model.set_submodule(name, FakeLinear4bit(module, setup.param_dtype))
    return cast(nn.Module, model)


def materialize_stand_ins(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, FakeLinear4bit):
            module.materialize()


def logical_numel(model: nn.Module) -> int:
    """Parameter count with each 4-bit weight counted as its out×in values, not packed bytes."""
    total = 0
    packed: set[int] = set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None) or getattr(module, "quant_state", None)
        if isinstance(weight, torch.Tensor) and state is not None and id(weight) not in packed:
            packed.add(id(weight))
            total += int(state.shape[0]) * int(state.shape[1])
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) not in packed and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
