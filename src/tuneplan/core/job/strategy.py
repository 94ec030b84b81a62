"""The training strategy a memory estimate is made for: method, precision, batch, sharding.

``Strategy`` holds plain choices (``StrEnum``s) and numbers; it validates only ranges that make
no sense for any model. Whether a model and recipe can honour it is decided in
``core/memory/refusals.py``. The planner's ``Job`` (tokens, epochs, budget, constraints) lives
here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from tuneplan.core.job.galore import (
    DEFAULT_RANK,
    DEFAULT_SCALE,
    DEFAULT_TARGETS,
    DEFAULT_UPDATE_PROJ_GAP,
)
from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.stack import DEFAULT_STACK, Stack
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
    # GaLore (galore-torch 1.0 through the HF Trainer): full fine-tuning whose targeted
    # weight gradients are projected to rank r before the optimizer sees them
    GALORE_ADAMW = "galore-adamw"
    GALORE_ADAMW8BIT = "galore-adamw8bit"
    GALORE_ADAFACTOR = "galore-adafactor"

    @property
    def is_galore(self) -> bool:
        return self in (Optimizer.GALORE_ADAMW, Optimizer.GALORE_ADAMW8BIT,
                        Optimizer.GALORE_ADAFACTOR)

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

#: Strategy fields the planner searches over for every offer when they are left free (the
#: micro-batch that fits, GPUs and nodes, sharding, offload, checkpointing, and where memory
#: binds the precision, loss and optimizer): given (``Job.fixed``), every plan keeps them, and
#: a fixed one is a constraint that can bind. Values are the flags that fix them.
SEARCHED_FIELDS: dict[str, str] = {
    "batch_size": "--batch-size", "gpus": "--gpus", "nodes": "--nodes",
    "sharding": "--sharding", "offload": "--offload",
    "checkpointing": "--gradient-checkpointing/--offload-activations",
    "precision": "--precision", "loss": "--loss", "optimizer": "--optimizer",
    "packing": "--packing"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """How one GPU (of ``gpus`` × ``nodes``) trains: every knob that changes memory.

    ``lora_targets`` is ``("all-linear",)`` or module names; ``loss`` None means the recipe's
    default; ``trainable_layers`` is used by ``freeze`` (the last N blocks train);
    ``galore_*`` are the GaLore optimizers' ``optim_args`` and ``optim_target_modules``.
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
    #: LISA: blocks trained at a time and steps between switches (LMFlow's defaults, args.py
    #: ``lisa_activated_layers`` 2, ``lisa_interval_steps`` 20)
    lisa_layers: int = 2
    lisa_interval: int = 20
    galore_rank: int = DEFAULT_RANK
    galore_update_proj_gap: int = DEFAULT_UPDATE_PROJ_GAP
    galore_scale: float = DEFAULT_SCALE
    galore_targets: tuple[str, ...] = DEFAULT_TARGETS
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
    #: library versions the job runs (``--stack``); version-dependent terms follow them
    stack: Stack = DEFAULT_STACK

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum", "seq_len", "gpus", "nodes", "num_labels"):
            if getattr(self, name) < 1:
                raise InvalidValueError(f"{name.replace('_', '-')} must be at least 1")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise InvalidValueError("lora-dropout must be in [0, 1)")
        if self.num_virtual_tokens < 1:
            raise InvalidValueError("num-virtual-tokens must be at least 1")
        if self.lisa_layers < 1 or self.lisa_interval < 1:
            raise InvalidValueError("lisa-layers and lisa-interval must be at least 1")
        if self.galore_rank < 1 or self.galore_update_proj_gap < 1:
            raise InvalidValueError("galore-rank and galore-update-proj-gap must be at least 1")
        if not self.galore_scale > 0:
            raise InvalidValueError("galore-scale must be more than zero")
        if not self.galore_targets:
            raise InvalidValueError("galore-targets must name at least one pattern")

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
            out[name] = list(value) if isinstance(value, tuple) else (
                value.as_dict() if isinstance(value, Stack) else value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Strategy:
        """The inverse of ``as_dict``: every key must be a field (missing ones take their
        default); values are converted to the field's type and validated by the constructor.
        Raises InvalidValueError naming every bad or unknown key."""
        return cls(**_typed_fields(cls, data, "strategy"))


class Interconnect(StrEnum):
    """Minimum link between the GPUs of a node a job asks for."""

    ANY = "any"
    PCIE = "pcie"
    NVLINK = "nvlink"          # NVLink (bridge or switch) or AMD Infinity Fabric
    NVSWITCH = "nvswitch"      # every GPU talks to every other at full NVLink speed

    @property
    def rank(self) -> int:
        return list(Interconnect).index(self)  # declaration order: weakest first


class Objective(StrEnum):
    COST = "cost"
    TIME = "time"
    PARETO = "pareto"
    RISK = "risk"          # cost with memory, fabric, host-streaming and spot risks priced in


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """What a person wants trained and under which constraints (the planner's input).

    ``strategy`` holds the training settings; its ``method`` may be ``auto`` (the planner tries
    full, LoRA and QLoRA) and its batch, checkpointing, sharding and GPU counts are starting
    points the planner searches over. Training length is ``tokens`` per epoch, or
    ``dataset_rows`` x ``avg_tokens``. Constraints left None/empty mean "any". ``fixed`` names
    the strategy fields the person chose, which the planner does not search over.
    """

    model: str
    strategy: Strategy = Strategy()
    tokens: int | None = None
    dataset_rows: int | None = None
    avg_tokens: int | None = None
    epochs: float = 1.0
    budget_usd: Decimal | None = None
    deadline_s: float | None = None
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    gpu: str | None = None           # only offers of this GPU (word-prefix match)
    spot: bool | None = None         # None: spot shown, ranked on-demand; True: spot may win;
                                     # False: no spot prices at all
    max_gpus: int | None = None      # GPUs in total, all nodes together
    multi_node: bool | None = None   # None: several nodes only for an offer one node of
                                     # which cannot hold the job; True: also when one
                                     # node is starved or late; False: one node only
    min_interconnect: Interconnect = Interconnect.ANY
    objective: Objective = Objective.COST
    # Strategy fields the person set (flag or job file): the planner keeps them as given and
    # searches only the others (batch, GPUs, nodes, sharding, offload, checkpointing,
    # precision); empty: every searched field is free.
    fixed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = []
        unknown = [name for name in self.fixed if name not in Strategy.__dataclass_fields__]
        if unknown:
            problems.append(f"fixed names no strategy field: {', '.join(unknown)}")
        if self.epochs <= 0:
            problems.append("epochs must be > 0")
        if self.tokens is not None and self.tokens < 1:
            problems.append("tokens must be at least 1")
        # --avg-tokens alone is meaningful (padding of unpacked batches); rows need it.
        if self.dataset_rows is not None and self.avg_tokens is None and self.tokens is None:
            problems.append("give --avg-tokens together with --dataset-rows")
        if self.dataset_rows is not None and self.tokens is not None:
            problems.append("give --tokens or --dataset-rows (with --avg-tokens), not both: "
                            "the length would be --tokens and --dataset-rows unused")
        for name in ("dataset_rows", "avg_tokens", "max_gpus"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name.replace('_', '-')} must be at least 1")
        if self.budget_usd is not None and self.budget_usd <= 0:
            problems.append("budget must be > 0")
        if self.deadline_s is not None and self.deadline_s <= 0:
            problems.append("deadline must be > 0")
        if problems:
            raise InvalidValueError("; ".join(problems))

    def is_fixed(self, name: str) -> bool:
        """Whether the person set the strategy field ``name`` (the planner keeps it)."""
        return name in self.fixed

    @property
    def tokens_per_epoch(self) -> int | None:
        """``tokens``, else rows x average tokens; None when the length is not given."""
        if self.tokens is not None:
            return self.tokens
        if self.dataset_rows is not None and self.avg_tokens is not None:
            return self.dataset_rows * self.avg_tokens
        return None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"model": self.model, "strategy": self.strategy.as_dict()}
        for name in self.__dataclass_fields__:
            if name not in ("model", "strategy"):
                value = getattr(self, name)
                out[name] = list(value) if isinstance(value, tuple) else value
        out["tokens_per_epoch"] = self.tokens_per_epoch
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        """The inverse of ``as_dict`` (``tokens_per_epoch``, derived, is checked against the
        fields). Raises InvalidValueError naming every bad or unknown key."""
        rest = dict(data)
        derived = rest.pop("tokens_per_epoch", None)
        raw = rest.pop("strategy", None)
        strategy = Strategy.from_dict(raw if raw is not None else {})
        job = cls(strategy=strategy, **_typed_fields(cls, rest, "job", skip=("strategy",)))
        if derived is not None and derived != job.tokens_per_epoch:
            raise InvalidValueError(f"job.tokens_per_epoch={derived!r} disagrees with its "
                                    f"tokens / dataset_rows x avg_tokens ({job.tokens_per_epoch})")
        return job


def _convert(hint: Any, value: Any) -> Any:
    """``value`` (as JSON holds it) as a field of type ``hint``: read from the dataclass's own
    annotations, so no second list of the fields and their types exists."""
    if get_origin(hint) in (Union, UnionType):
        inner = [h for h in get_args(hint) if h is not type(None)]
        return None if value is None else _convert(inner[0], value)
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return hint(value)
    if hint is Stack:  # {"transformers": "4.30", ...} as as_dict writes it, or "a=1,b=2"
        try:
            return Stack.parse(value)
        except InvalidValueError as exc:
            raise ValueError(str(exc)) from None
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError("not true/false")
        return value
    if hint is int or hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("not a number")
        if hint is int and int(value) != value:
            raise ValueError("not an integer")
        return hint(value)
    if hint is Decimal:
        try:
            return Decimal(str(value))
        except InvalidOperation:
            raise ValueError("not an amount") from None
    if hint is str:
        if not isinstance(value, str) or not value:
            raise ValueError("not a name")
        return value
    if get_origin(hint) is tuple:  # tuple[str, ...]
        if isinstance(value, str) or not isinstance(value, list | tuple) or not all(
                isinstance(v, str) for v in value):
            raise ValueError("not a list of strings")
        return tuple(value)
    raise TypeError(f"no conversion for {hint!r}")  # a new field type: teach _convert


def _typed_fields(cls: type, data: Mapping[str, Any], where: str,
                  skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Keyword arguments for ``cls`` from ``data``, each converted to its annotated type."""
    if not isinstance(data, Mapping):
        raise InvalidValueError(f"{where} is not a mapping")
    hints = get_type_hints(cls)
    names = {f.name for f in fields(cls)} - set(skip)
    problems = [f"unknown key {where}.{key}" for key in data if key not in names]
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in names:
            try:
                out[key] = _convert(hints[key], value)
            except (TypeError, ValueError) as exc:
                problems.append(f"{where}.{key}={value!r} is not valid ({exc})")
    if problems:
        raise InvalidValueError("; ".join(problems))
    return out
