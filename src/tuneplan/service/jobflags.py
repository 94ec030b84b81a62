"""The one vocabulary of a job: every job flag named, converted, bounded and documented once.

``FLAGS`` lists each flag with the ``Strategy``/``Job`` field it sets, how text becomes a value,
its bounds and its help; defaults are read from the dataclasses themselves (never repeated
here). ``job_from_values`` is the only mapping from a request — CLI flags (strings), a job file
(YAML/JSON types), a web form (typed values) — to a ``Job``. The CLI builds its Typer options
from ``FLAGS`` (``cli/options.py``) and the web its form model (``web/inputs.py``), so both
accept, default and refuse exactly the same things. Prints nothing, reads only job files.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.recipes import Recipe
from tuneplan.core.job.stack import LIBRARIES, Stack
from tuneplan.core.job.strategy import (
    SEARCHED_FIELDS,
    Attention,
    Checkpointing,
    Interconnect,
    Job,
    Loss,
    Objective,
    Offload,
    Optimizer,
    Precision,
    Sharding,
    Strategy,
    Task,
)
from tuneplan.errors import InvalidValueError, UnsupportedError
from tuneplan.units import parse_count, parse_duration, parse_usd

MAX_JOB_FILE_BYTES = 1_000_000  # a job file is a few hundred bytes; bigger is not one


class JobFlagError(InvalidValueError):
    """A bad value for one flag; ``flag`` is its name (``lora-rank``) so a face can point at it
    (the web answers 422 with the field)."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag

    def __reduce__(self) -> tuple[Any, ...]:  # crosses from a worker process intact
        return (type(self), (self.flag, str(self)))


class Group(StrEnum):
    """Which commands take a flag: every job command takes ``strategy``; the others add what
    they use (a flag a command cannot honour is unknown to it, not ignored)."""

    STRATEGY = "strategy"
    GPU = "gpu"              # --gpu NAME: the card the estimate is for / plans are kept to
    LENGTH = "length"        # training length: tokens, rows x average tokens, epochs
    LIMITS = "limits"        # --max-gpus
    PLANNER = "planner"      # constraints and ranking of `plan`


COMMAND_GROUPS: dict[str, frozenset[Group]] = {
    "memory": frozenset({Group.STRATEGY, Group.GPU}),
    "explain": frozenset({Group.STRATEGY, Group.GPU}),
    "throughput": frozenset({Group.STRATEGY, Group.GPU, Group.LENGTH}),
    "cost": frozenset({Group.STRATEGY, Group.LENGTH}),
    # fit answers in bytes only (largest batch and sequence, changes that fit): no length
    "fit": frozenset({Group.STRATEGY, Group.GPU, Group.LIMITS}),
    "plan": frozenset(Group),
    "probe": frozenset({Group.STRATEGY}),
}
#: The sentence --help and the plan form add to each of them.
PLANNER_SEARCHES_HELP = "On plan: searched when not given; given, every plan keeps it."
# What --help calls each group's panel.
PANELS = {Group.STRATEGY: "Job: training strategy", Group.GPU: "Job: hardware",
          Group.LENGTH: "Job: training length", Group.LIMITS: "Job: hardware",
          Group.PLANNER: "Planner: constraints and ranking"}


@dataclass(frozen=True, slots=True)
class Kind:
    """How a flag's value is read: ``convert`` takes a str (CLI, web) or a file's typed value
    and returns the field's value or raises ValueError/InvalidValueError with the reason."""

    metavar: str
    convert: Callable[[Any], Any]
    choices: tuple[str, ...] = ()
    switch: bool = False
    number: type | None = None       # int or float: a form may type it as such, within bounds
    low: float | None = None
    high: float | None = None


def _integer(low: int, high: int) -> Kind:
    def convert(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError("expected a whole number")
        try:
            number = int(value) if isinstance(value, int) else int(str(value).strip())
        except ValueError:
            raise ValueError(f"expected a whole number, got {_show(value)}") from None
        if not low <= number <= high:
            raise ValueError(f"must be between {low:,} and {high:,}, got {number:,}")
        return number

    return Kind(f"INT[{low}..{high}]" if high < 10**6 else "INT", convert, number=int, low=low,
                high=high)


def _count(low: int, high: int) -> Kind:
    def convert(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError("expected a count such as 50M")
        number = parse_count(value if isinstance(value, int) else str(value))
        if not low <= number <= high:
            raise ValueError(f"must be between {low:,} and {high:,}, got {number:,}")
        return number

    return Kind("COUNT", convert)


def _real(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Kind:
    def convert(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError("expected a number")
        try:
            number = float(str(value).strip())
        except ValueError:
            raise ValueError(f"expected a number, got {_show(value)}") from None
        below = number <= low if low_open else number < low
        above = number >= high if high_open else number > high
        if number != number or below or above:  # NaN fails every comparison but this one
            lo, hi = "(" if low_open else "[", ")" if high_open else "]"
            raise ValueError(f"must be in {lo}{low:g}, {high:g}{hi}, got {_show(value)}")
        return number

    return Kind("NUMBER", convert, number=float, low=low, high=high)


def _enum(cls: type[StrEnum]) -> Kind:
    choices = tuple(member.value for member in cls)

    def convert(value: Any) -> StrEnum:
        text = value.value if isinstance(value, StrEnum) else str(value).strip().lower()
        try:
            return cls(text)
        except ValueError:
            near = difflib.get_close_matches(text, choices, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ValueError(f"{_show(value)} is not one of {', '.join(choices)}{hint}") from None

    return Kind(cls.__name__.upper(), convert, choices)


def _names(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    names = tuple(str(item).strip() for item in items if str(item).strip())
    for name in names:
        if len(name) > 96 or not all(c.isalnum() or c in "._-*/" for c in name):
            raise ValueError(f"{_show(name)} is not a module or provider name")
    return names


def _text(value: Any) -> str:
    text = str(value).strip()
    if not text or len(text) > 96 or not all(c.isprintable() for c in text):
        raise ValueError(f"{_show(value)} is not a name")
    return text


def _positive(parse: Callable[[str], Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("expected an amount")
        number = parse(str(value))
        if not number > 0:
            raise ValueError(f"must be more than zero, got {_show(value)}")
        return number

    return convert


def _switch(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, got {_show(value)}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _patterns(value: Any) -> tuple[str, ...]:
    """Module-name patterns (transformers' ``optim_target_modules`` list), comma-separated."""
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    names = tuple(str(item).strip() for item in items if str(item).strip())
    if not names:
        raise ValueError("expected at least one module-name pattern")
    for name in names:
        if len(name) > 96 or not name.isprintable() or " " in name:
            raise ValueError(f"{_show(name)} is not a module-name pattern")
        if any(q in name for q in (")*", ")+", ")?", "){")):
            # a repeated group can backtrack exponentially on a module name (a web form
            # takes these patterns): module names need none
            raise ValueError(f"{_show(name)}: a repeated group is not taken in a module-name "
                             "pattern")
        try:
            re.compile(name)
        except (re.error, OverflowError, RecursionError) as exc:
            raise ValueError(f"{_show(name)} is not a regular expression ({exc})") from None
    return names


SWITCH = Kind("", _switch, switch=True)
NAMES = Kind("A,B", _names)
TEXT = Kind("NAME", _text)
_BIG = 10**15  # tokens or rows: ~1,000x the largest published pre-training run, far below 2^63


@dataclass(frozen=True, slots=True)
class Flag:
    """One job flag: ``--name`` sets ``owner``'s ``field`` (or, when ``apply`` is given, it
    sets several fields from one value, e.g. the checkpointing switches)."""

    name: str
    field: str
    owner: type
    kind: Kind
    group: Group
    help: str
    apply: Callable[[dict[str, Any], Any], None] | None = None

    @property
    def key(self) -> str:
        """The name in a web form or API body (``lora_rank``)."""
        return self.name.replace("-", "_")

    @property
    def default(self) -> Any:
        """The dataclass's own default (None for fields that default to "derived"); a switch
        that sets a field through ``apply`` reads its state in that field's default."""
        if self.apply is not None:
            return _SWITCH_DEFAULTS[self.name](Strategy())
        spec = self.owner.__dataclass_fields__[self.field]  # type: ignore[attr-defined]
        if spec.default is not dataclasses.MISSING:
            return spec.default
        return None


def _gradient_checkpointing(fields: dict[str, Any], on: Any) -> None:
    if fields.get("checkpointing") is not Checkpointing.OFFLOAD:
        fields["checkpointing"] = Checkpointing.FULL if on else Checkpointing.NONE


def _offload_activations(fields: dict[str, Any], on: Any) -> None:
    if on:
        fields["checkpointing"] = Checkpointing.OFFLOAD
    elif fields.get("checkpointing") is Checkpointing.OFFLOAD:
        fields["checkpointing"] = Checkpointing.FULL


_SWITCH_DEFAULTS: dict[str, Callable[[Strategy], bool]] = {
    "gradient-checkpointing": lambda s: s.checkpointing is not Checkpointing.NONE,
    "offload-activations": lambda s: s.checkpointing is Checkpointing.OFFLOAD,
}
S, J = Strategy, Job
FLAGS: tuple[Flag, ...] = (
    Flag("method", "method", S, _enum(Method), Group.STRATEGY,
         "Fine-tuning method (auto: the planner tries full, LoRA and QLoRA)."),
    Flag("recipe", "recipe", S, _enum(Recipe), Group.STRATEGY,
         "Training framework whose tensor layout and dtypes the estimate follows."),
    Flag("precision", "precision", S, _enum(Precision), Group.STRATEGY,
         "bf16-mixed/fp16-mixed: fp32 trainable weights with autocast; bf16: pure bf16."),
    Flag("optimizer", "optimizer", S, _enum(Optimizer), Group.STRATEGY, "Optimizer."),
    Flag("optimizer-in-backward", "optimizer_in_backward", S, SWITCH, Group.STRATEGY,
         "Step each parameter during backward and free its gradient at once."),
    Flag("lisa-layers", "lisa_layers", S, _integer(1, 65_536), Group.STRATEGY,
         "lisa: how many blocks train at a time (drawn at random every --lisa-interval steps)."),
    Flag("lisa-interval", "lisa_interval", S, _integer(1, 10**9), Group.STRATEGY,
         "lisa: optimizer steps between switches of the trained blocks."),
    Flag("galore-rank", "galore_rank", S, _integer(1, 65_536), Group.STRATEGY,
         "GaLore: rank r of the gradient projection (optim_args rank)."),
    Flag("galore-update-proj-gap", "galore_update_proj_gap", S, _integer(1, 10**9),
         Group.STRATEGY, "GaLore: optimizer steps between projector SVDs (update_proj_gap)."),
    Flag("galore-scale", "galore_scale", S, _real(0.0, 1e6, low_open=True), Group.STRATEGY,
         "GaLore: scale of the projected-back update (optim_args scale)."),
    Flag("galore-targets", "galore_targets", S, Kind("PATTERN,...", _patterns),
         Group.STRATEGY, "GaLore: module-name patterns of the projected linears "
         "(optim_target_modules; default attention and MLP)."),
    Flag("lora-rank", "lora_rank", S, _integer(1, 4096), Group.STRATEGY,
         "LoRA-family rank r; also the rank-like r of adalora (init_r), loha, lokr, vera, "
         "hra, miss, shira, randlora and lora-fa."),
    Flag("lora-alpha", "lora_alpha", S, _integer(1, 65_536), Group.STRATEGY, "LoRA alpha."),
    Flag("lora-dropout", "lora_dropout", S, _real(0.0, 1.0, high_open=True), Group.STRATEGY,
         "LoRA dropout probability, in [0, 1)."),
    Flag("lora-targets", "lora_targets", S, NAMES, Group.STRATEGY,
         "Modules adapters wrap: all-linear (PEFT's rule) or names such as q_proj,v_proj."),
    Flag("trainable-modules", "trainable_modules", S, NAMES, Group.STRATEGY,
         "Modules trained in full beside the adapters (embed_tokens, lm_head)."),
    Flag("trainable-layers", "trainable_layers", S, _integer(0, 65_536), Group.STRATEGY,
         "freeze: how many of the last blocks train."),
    Flag("num-virtual-tokens", "num_virtual_tokens", S, _integer(1, 65_536), Group.STRATEGY,
         "Prefix/prompt/p-tuning: virtual tokens; llama-adapter: adapter_len."),
    Flag("quant", "quant", S, _enum(Quant), Group.STRATEGY,
         "QLoRA base-weight quantization."),
    Flag("double-quant", "double_quant", S, SWITCH, Group.STRATEGY,
         "QLoRA: quantize the quantization constants too."),
    Flag("batch-size", "batch_size", S, _integer(1, 65_536), Group.STRATEGY,
         "Micro-batch per GPU (sequences)."),
    Flag("grad-accum", "grad_accum", S, _integer(1, 1_048_576), Group.STRATEGY,
         "Gradient-accumulation steps."),
    Flag("seq-len", "seq_len", S, _integer(1, 16_777_216), Group.STRATEGY,
         "Sequence length in tokens (padded batches reach it)."),
    Flag("packing", "packing", S, SWITCH, Group.STRATEGY,
         "Pack sequences to seq-len (no padding)."),
    Flag("gradient-checkpointing", "checkpointing", S, SWITCH, Group.STRATEGY,
         "Recompute each block in backward.", apply=_gradient_checkpointing),
    Flag("offload-activations", "checkpointing", S, SWITCH, Group.STRATEGY,
         "Checkpointing with the kept block inputs in host memory.",
         apply=_offload_activations),
    Flag("attention", "attention", S, _enum(Attention), Group.STRATEGY, "Attention kernel."),
    Flag("compile", "compile", S, SWITCH, Group.STRATEGY, "torch.compile the model."),
    Flag("task", "task", S, _enum(Task), Group.STRATEGY, "Training objective."),
    Flag("loss", "loss", S, _enum(Loss), Group.STRATEGY,
         "Loss kernel (default: the recipe's own)."),
    Flag("num-labels", "num_labels", S, _integer(1, 1_048_576), Group.STRATEGY,
         "seq-cls: number of labels."),
    Flag("gpus", "gpus", S, _integer(1, 1024), Group.STRATEGY, "GPUs per node."),
    Flag("nodes", "nodes", S, _integer(1, 4096), Group.STRATEGY, "Nodes."),
    Flag("sharding", "sharding", S, _enum(Sharding), Group.STRATEGY,
         "How state is split across GPUs (default: ddp on one GPU, zero3 on several)."),
    Flag("offload", "offload", S, _enum(Offload), Group.STRATEGY,
         "Move optimizer state (and parameters) to host memory."),
    Flag("allow-long-context", "allow_long_context", S, SWITCH, Group.STRATEGY,
         "Allow seq-len beyond the model's trained context."),
    Flag("stack", "stack", S, Kind("LIB=VER,...", Stack.parse), Group.STRATEGY,
         "Library versions the job runs (" + ", ".join(LIBRARIES) + "), e.g. "
         "transformers=4.30,bitsandbytes=0.39; unnamed ones keep the pip default."),
    Flag("gpu", "gpu", J, TEXT, Group.GPU,
         "A GPU name (see `tuneplan gpus`): fit and headroom on it; plan keeps its offers."),
    Flag("tokens", "tokens", J, _count(1, _BIG), Group.LENGTH,
         "Training tokens per epoch (50M, 1.2B)."),
    Flag("dataset-rows", "dataset_rows", J, _count(1, _BIG), Group.LENGTH,
         "Rows in the data set (with --avg-tokens, instead of --tokens)."),
    Flag("avg-tokens", "avg_tokens", J, _count(1, 16_777_216), Group.LENGTH,
         "Average real tokens per row (padding when not packed)."),
    Flag("epochs", "epochs", J, _real(0.0, 10_000.0, low_open=True), Group.LENGTH, "Epochs."),
    Flag("max-gpus", "max_gpus", J, _integer(1, 65_536), Group.LIMITS,
         "At most this many GPUs in total, all nodes together."),
    Flag("budget", "budget_usd", J, Kind("USD", _positive(parse_usd)), Group.PLANNER,
         "Whole-job budget in USD."),
    Flag("deadline", "deadline_s", J, Kind("DURATION", _positive(parse_duration)),
         Group.PLANNER, "Wall-time limit (12h, 3d)."),
    Flag("provider", "providers", J, NAMES, Group.PLANNER, "Only these providers (a,b)."),
    Flag("region", "regions", J, NAMES, Group.PLANNER, "Only regions with these prefixes."),
    Flag("spot", "spot", J, SWITCH, Group.PLANNER,
         "--spot: spot may win the ranking; --no-spot: no spot prices at all."),
    Flag("multi-node", "multi_node", J, SWITCH, Group.PLANNER,
         "Also plan across several nodes."),
    Flag("min-interconnect", "min_interconnect", J, _enum(Interconnect), Group.PLANNER,
         "Weakest link between a node's GPUs the job accepts."),
    Flag("objective", "objective", J, _enum(Objective), Group.PLANNER, "What ranks plans."),
)
BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}
#: The flags of the Strategy fields ``tuneplan plan`` searches (``SEARCHED_FIELDS``): searched
#: when not given, kept in every plan when given (``Job.fixed``).
PLANNER_SEARCHES: frozenset[str] = frozenset(
    f.name for f in FLAGS if f.owner is Strategy and f.field in SEARCHED_FIELDS)


def flags_for(command: str) -> tuple[Flag, ...]:
    """The job flags ``command`` takes, in declaration order."""
    groups = COMMAND_GROUPS[command]
    return tuple(f for f in FLAGS if f.group in groups)


def suggest(name: str, names: Iterable[str]) -> str:
    """`` (did you mean --x?)`` for the closest known name, or ``""``."""
    near = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f"; did you mean --{near[0]}?" if near else ""


def normalise(values: Mapping[str, Any], *, origin: str) -> dict[str, Any]:
    """Keys of a file or form (``lora_rank``, ``lora-rank``) as flag names; unknown keys raise
    InvalidValueError naming the closest flag."""
    out: dict[str, Any] = {}
    for raw, value in values.items():
        name = str(raw).strip().replace("_", "-")
        if name not in BY_NAME:
            raise InvalidValueError(f"{origin}: unknown job flag {name!r}"
                                    + suggest(name, BY_NAME))
        out[name] = value
    return out


def load_job_file(path: str | Path) -> dict[str, Any]:
    """A job file (YAML, or JSON by its ``.json`` suffix): a mapping of flag names to values
    (``lora-rank: 8`` or ``lora_rank: 8``). A file describes the whole job, so it may carry
    flags a command does not use (``tokens`` for ``memory``); an unknown key is an error."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidValueError(f"cannot read job file {path}: {exc.strerror}") from exc
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise InvalidValueError(f"job file {path} is larger than {MAX_JOB_FILE_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # decode, JSON and YAML errors all mean the same: bad file
        reason = " ".join(str(exc).split())[:200]
        raise InvalidValueError(f"job file {path} is not valid YAML/JSON: {reason}") from exc
    if not isinstance(data, dict):
        raise InvalidValueError(f"job file {path} must hold a mapping of job flags")
    return normalise(data, origin=f"job file {path}")


def job_from_values(model: str, values: Mapping[str, Any], *, command: str,
                    file_values: Mapping[str, Any] | None = None,
                    defaults: Mapping[str, Any] | None = None) -> Job:
    """The ``Job`` for ``model`` from flag values (names as ``FLAGS`` spells them; None means
    "not given"). Precedence: ``values`` over ``file_values`` over ``defaults`` (a use case's
    own, such as an offer's GPU count) over the dataclasses' defaults. ``values`` may hold only
    the flags ``command`` takes; a job file may hold any job flag.

    Raises JobFlagError (naming the flag) for a bad value, for a flag given where it cannot
    apply (``APPLIES_TO``),
    InvalidValueError for an unknown flag and UnsupportedError for a combination no estimate
    can honour.
    """
    allowed = {f.name for f in flags_for(command)}
    given: dict[str, Any] = {}
    chosen: set[str] = set()  # flags the person set (a use case's defaults are not chosen)
    for layer, origin in ((defaults or {}, "default"), (file_values or {}, "job file"),
                          (values, "flag")):
        for name, value in layer.items():
            if value is None:
                continue
            if name not in BY_NAME or (origin == "flag" and name not in allowed):
                raise InvalidValueError(
                    f"`tuneplan {command}` takes no flag --{name}"
                    + suggest(name, allowed) if name in BY_NAME else
                    f"unknown job flag --{name}" + suggest(name, allowed))
            given[name] = value
            if origin != "default":
                chosen.add(name)
    fields: dict[type, dict[str, Any]] = {Strategy: {}, Job: {}}
    for flag in FLAGS:  # declaration order: the checkpointing switches combine predictably
        if flag.name not in given:
            continue
        try:
            value = flag.kind.convert(given[flag.name])
        except (ValueError, InvalidValueError) as exc:
            raise JobFlagError(flag.name, f"--{flag.name}: {exc}") from None
        if flag.apply is not None:
            flag.apply(fields[Strategy], value)
        else:
            fields[flag.owner][flag.field] = value
    _derive(fields[Strategy], given)
    strategy = _build(Strategy, fields[Strategy])
    for name in values:
        if values[name] is not None and name in APPLIES_TO:
            applies, where = APPLIES_TO[name]
            if not applies(strategy):
                has = (f"--optimizer {strategy.optimizer.value}" if name.startswith("galore-")
                       else f"--method {strategy.method.value} --task {strategy.task.value}")
                raise JobFlagError(name, f"--{name} applies only to {where}; this job has "
                                   f"{has}: drop it")
    fixed = tuple(sorted({f.field for f in FLAGS if f.owner is Strategy and f.name in chosen}))
    job: Job = _build(Job, {"model": model, "strategy": strategy, **fields[Job],
                            "fixed": fixed})
    return job


def _adapters(s: Strategy) -> bool:
    return s.method.is_low_rank or s.method is Method.AUTO


#: Strategy flags that mean something only for some methods or tasks: given as a flag (or
#: form field) where they do not apply they are refused, not silently ignored. A job file may
#: carry them (it describes the whole job, and `--method auto` tries several methods).
APPLIES_TO: dict[str, tuple[Callable[[Strategy], bool], str]] = {
    "lora-rank": (lambda s: s.method.uses_rank or s.method is Method.AUTO,
                  "methods with a rank (lora, dora, qlora, lora8bit, lora-fa, adalora, loha, "
                  "lokr, vera, hra, miss, shira, randlora)"),
    "lora-alpha": (lambda s: s.method.is_lora or s.method in (Method.LORA_FA, Method.AUTO),
                   "LoRA methods (lora, dora, qlora, lora8bit, lora-fa)"),
    "lora-dropout": (lambda s: s.method.is_lora or s.method is Method.AUTO,
                     "LoRA methods (lora, dora, qlora, lora8bit)"),
    "lora-targets": (lambda s: _adapters(s) or s.method is Method.IA3,
                     "adapter methods (the LoRA family and ia3)"),
    "trainable-modules": (lambda s: s.method not in (Method.FULL, Method.LISA),
                          "methods that freeze something (full trains every module, lisa "
                          "always trains the embedding and head)"),
    "trainable-layers": (lambda s: s.method is Method.FREEZE, "--method freeze"),
    "lisa-layers": (lambda s: s.method is Method.LISA, "--method lisa"),
    "lisa-interval": (lambda s: s.method is Method.LISA, "--method lisa"),
    **dict.fromkeys(
        ("galore-rank", "galore-update-proj-gap", "galore-scale", "galore-targets"),
        (lambda s: s.optimizer.is_galore,
         "--optimizer galore-adamw, galore-adamw8bit or galore-adafactor")),
    "num-virtual-tokens": (lambda s: s.method in (Method.PREFIX, Method.PROMPT,
                                                  Method.P_TUNING, Method.LLAMA_ADAPTER),
                           "prefix, prompt, p-tuning and llama-adapter"),
    "quant": (lambda s: s.method in (Method.QLORA, Method.LORA8BIT, Method.AUTO),
              "qlora (and lora8bit, as int8)"),
    "double-quant": (lambda s: s.method is Method.AUTO or (
        s.method is Method.QLORA and s.quant in (Quant.NF4, Quant.FP4)),
                     "qlora with --quant nf4 or fp4 (bitsandbytes' nested constants)"),
    "num-labels": (lambda s: s.task is Task.SEQ_CLS, "--task seq-cls"),
    "loss": (lambda s: s.task is Task.CAUSAL_LM, "--task causal-lm (the vocabulary loss)"),
}


def _derive(strategy: dict[str, Any], given: Mapping[str, Any]) -> None:
    """Defaults that depend on other flags, in one place: sharding is ddp on one GPU and zero3
    on several; the unsloth recipe offloads its checkpoints (as its trainer does) unless the
    checkpointing flags say otherwise; lora8bit keeps int8 base weights."""
    if "sharding" not in strategy:
        world = strategy.get("gpus", 1) * strategy.get("nodes", 1)
        strategy["sharding"] = Sharding.DDP if world <= 1 else Sharding.ZERO3
    if strategy.get("recipe") is Recipe.UNSLOTH and "checkpointing" not in strategy:
        strategy["checkpointing"] = Checkpointing.OFFLOAD
    if strategy.get("method") is Method.LORA8BIT and "quant" in given and \
            strategy.get("quant") is not Quant.INT8:
        raise UnsupportedError("lora8bit keeps int8 base weights; drop --quant or use qlora")


def _build(cls: Any, fields: dict[str, Any]) -> Any:
    try:
        return cls(**fields)
    except InvalidValueError:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(f"bad job: {exc}") from exc


def job_values(job: Job) -> dict[str, Any]:
    """The flag values that rebuild ``job`` with ``job_from_values`` (a job file's content):
    the job's own fields, and the strategy fields the person fixed (the others were defaults
    or derived, and stay free)."""
    out: dict[str, Any] = {}
    for flag in FLAGS:
        if flag.apply is not None or (flag.owner is Strategy and not job.is_fixed(flag.field)):
            continue
        source = job.strategy if flag.owner is Strategy else job
        value = getattr(source, flag.field)
        if value is None:
            continue
        out[flag.name] = list(value) if isinstance(value, tuple) else (
            str(value) if isinstance(value, Stack) else value)
    if job.is_fixed("checkpointing"):
        checkpointing = job.strategy.checkpointing
        out["gradient-checkpointing"] = checkpointing is not Checkpointing.NONE
        out["offload-activations"] = checkpointing is Checkpointing.OFFLOAD
    return out
