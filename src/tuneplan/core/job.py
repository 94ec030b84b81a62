"""The training strategy a memory estimate is made for: method, precision, batch, sharding.

``Strategy`` holds plain choices (``StrEnum``s) and numbers; it validates only ranges that make
no sense for any model. Whether a model and recipe can honour it is decided in
``core/memory/refusals.py``. The planner's ``Job`` (tokens, epochs, budget) will live here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tuneplan.core.methods import Method, Quant
from tuneplan.core.recipes import Recipe
from tuneplan.errors import InvalidValueError


class Precision(StrEnum):
    BF16_MIXED = "bf16-mixed"      # fp32 trainable weights, bf16 autocast
    FP16_MIXED = "fp16-mixed"
    BF16 = "bf16"                  # pure bf16: weights, grads and optimizer state in bf16
    FP32 = "fp32"

    @property
    def compute_bytes(self) -> int:
        return 4 if self is Precision.FP32 else 2

    @property
    def is_mixed(self) -> bool:
        return self in (Precision.BF16_MIXED, Precision.FP16_MIXED)


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW8BIT = "adamw8bit"
    PAGED_ADAMW8BIT = "paged-adamw8bit"
    PAGED_ADAMW32BIT = "paged-adamw32bit"
    ADAFACTOR = "adafactor"
    SGD = "sgd"
    LION = "lion"

    @property
    def is_8bit(self) -> bool:
        return self in (Optimizer.ADAMW8BIT, Optimizer.PAGED_ADAMW8BIT)

    @property
    def is_paged(self) -> bool:
        return self in (Optimizer.PAGED_ADAMW8BIT, Optimizer.PAGED_ADAMW32BIT)


class Attention(StrEnum):
    SDPA = "sdpa"
    FLASH = "flash"
    EAGER = "eager"


class Checkpointing(StrEnum):
    NONE = "none"
    FULL = "full"                  # keep each block's input, recompute the block in backward
    OFFLOAD = "offload"            # full, with the kept inputs moved to host memory


class Sharding(StrEnum):
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    FSDP = "fsdp"
    FSDP_GRAD_OP = "fsdp-grad-op"
    HYBRID = "hybrid"


class Offload(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_PARAMS = "optimizer+params"


class Task(StrEnum):
    CAUSAL_LM = "causal-lm"
    SEQ_CLS = "seq-cls"


class Loss(StrEnum):
    STANDARD = "standard"
    CHUNKED = "chunked"


ALL_LINEAR = "all-linear"


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """How one GPU (of ``gpus`` × ``nodes``) trains: every knob that changes memory.

    ``lora_targets`` is ``("all-linear",)`` or module names; ``loss`` None means the recipe's
    default; ``trainable_layers`` is used by ``freeze`` (the last N blocks train).
    """

    method: Method = Method.LORA
    recipe: Recipe = Recipe.HF
    precision: Precision = Precision.BF16_MIXED
    optimizer: Optimizer = Optimizer.ADAMW
    optimizer_in_backward: bool = False
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = (ALL_LINEAR,)
    trainable_modules: tuple[str, ...] = ()
    trainable_layers: int = 0
    num_virtual_tokens: int = 20
    quant: Quant = Quant.NF4
    double_quant: bool = True
    batch_size: int = 1
    grad_accum: int = 1
    seq_len: int = 2048
    packing: bool = False
    checkpointing: Checkpointing = Checkpointing.FULL
    attention: Attention = Attention.SDPA
    compile: bool = False
    task: Task = Task.CAUSAL_LM
    loss: Loss | None = None
    num_labels: int = 2
    gpus: int = 1
    nodes: int = 1
    sharding: Sharding = Sharding.DDP
    offload: Offload = Offload.NONE
    allow_long_context: bool = False

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum", "seq_len", "gpus", "nodes", "num_labels"):
            if getattr(self, name) < 1:
                raise InvalidValueError(f"{name.replace('_', '-')} must be at least 1")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise InvalidValueError("lora-dropout must be in [0, 1)")
        if self.num_virtual_tokens < 1:
            raise InvalidValueError("num-virtual-tokens must be at least 1")

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch: batch_size · seq_len (padded batches reach seq_len)."""
        return self.batch_size * self.seq_len

    @property
    def all_linear(self) -> bool:
        return ALL_LINEAR in self.lora_targets

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out
