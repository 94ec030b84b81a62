"""Job flags of CLI.md (``--method``, ``--lora-rank``, ``--job job.yaml`` …) → ``Strategy``.

Shared by the commands that describe a job (memory, explain; later fit, throughput, plan, cost,
probe). Reads the ``--job`` file (YAML/JSON, long-flag keys with ``-`` → ``_``); flags override
it. Every unknown flag or unreadable value raises InvalidValueError; values the estimate cannot
honour raise UnsupportedError later. Prints nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
    Task,
)
from tuneplan.errors import InvalidValueError, UnsupportedError


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in str(text).split(",") if x.strip())


def _int(text: str) -> int:
    try:
        return int(str(text))
    except ValueError as exc:
        raise InvalidValueError(f"expected a whole number, got {text!r}") from exc


_VALUE: dict[str, tuple[str, Callable[[str], Any]]] = {
    "method": ("method", Method), "recipe": ("recipe", Recipe),
    "precision": ("precision", Precision),
    "optimizer": ("optimizer", Optimizer), "quant": ("quant", Quant),
    "attention": ("attention", Attention), "sharding": ("sharding", Sharding),
    "offload": ("offload", Offload), "task": ("task", Task), "loss": ("loss", Loss),
    "lora-rank": ("lora_rank", _int), "lora-alpha": ("lora_alpha", _int),
    "lora-dropout": ("lora_dropout", float), "lora-targets": ("lora_targets", _csv),
    "trainable-modules": ("trainable_modules", _csv),
    "trainable-layers": ("trainable_layers", _int),
    "num-virtual-tokens": ("num_virtual_tokens", _int), "num-labels": ("num_labels", _int),
    "batch-size": ("batch_size", _int), "grad-accum": ("grad_accum", _int),
    "seq-len": ("seq_len", _int), "gpus": ("gpus", _int), "nodes": ("nodes", _int),
}
_BOOL = {"double-quant": "double_quant", "packing": "packing", "compile": "compile",
         "optimizer-in-backward": "optimizer_in_backward",
         "allow-long-context": "allow_long_context"}
# Accepted so that a job file or calibration case can carry them; they do not change memory.
_IGNORED_VALUE = {"gpu", "tokens", "epochs", "dataset-rows", "avg-tokens", "job"}

JOB_FLAGS_HELP = (
    "Job flags (CLI.md): --method, --recipe, --precision, --optimizer, --optimizer-in-backward, "
    "--lora-rank/-alpha/-dropout/-targets, --trainable-modules, --trainable-layers, --quant, "
    "--double-quant/--no-double-quant, --batch-size, --grad-accum, --seq-len, --packing, "
    "--gradient-checkpointing/--no-gradient-checkpointing/--offload-activations, --attention, "
    "--compile, --task, --loss, --num-labels, --num-virtual-tokens, --gpu, --gpus, --nodes, "
    "--sharding, --offload, --tokens, --dataset-rows, --avg-tokens, --epochs, "
    "--allow-long-context, --job FILE.")


def load_job_file(path: str) -> dict[str, Any]:
    """Read a job file (YAML or JSON) into ``{flag-name: value}``; InvalidValueError if bad."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidValueError(f"cannot read job file {path}: {exc.strerror}") from exc
    try:
        import yaml

        data = yaml.safe_load(text) if not path.endswith(".json") else json.loads(text)
    except Exception as exc:  # yaml and json raise different errors; both mean bad input
        raise InvalidValueError(f"job file {path} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidValueError(f"job file {path} must hold a mapping of flags")
    return {str(k).replace("_", "-"): v for k, v in data.items()}


def parse_job_args(args: Sequence[str]) -> dict[str, Any]:
    """Turn ``["--method", "qlora", "--packing", ...]`` into ``{flag: value}`` (file first)."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise InvalidValueError(f"unexpected argument {arg!r}: job flags start with --")
        name, _, inline = arg[2:].partition("=")
        if name in _VALUE or name in _IGNORED_VALUE:
            if not inline and i + 1 >= len(args):
                raise InvalidValueError(f"--{name} needs a value")
            flags[name] = inline or args[i + 1]
            i += 1 if inline else 2
            continue
        flags[name] = True
        i += 1
    job = flags.pop("job", None)
    base = load_job_file(str(job)) if job else {}
    return base | flags


def strategy_from_flags(flags: dict[str, Any]) -> Strategy:
    """Build a Strategy from flag names; unknown flags and bad values raise InvalidValueError."""
    kwargs: dict[str, Any] = {}
    for raw, value in flags.items():
        name, negated = (raw[3:], True) if raw.startswith("no-") else (raw, False)
        if name in _VALUE:
            field, convert = _VALUE[name]
            kwargs[field] = _convert(name, convert, value)
        elif name in _BOOL:
            kwargs[_BOOL[name]] = _switch(value, negated)
        elif name in ("gradient-checkpointing", "offload-activations"):
            _checkpointing(kwargs, name, negated, value)
        elif name not in _IGNORED_VALUE:
            raise InvalidValueError(f"unknown job flag --{raw}; see `--help`")
    if kwargs.get("method") is Method.LORA8BIT and "quant" in flags and \
            kwargs["quant"] is not Quant.INT8:
        raise UnsupportedError("lora8bit keeps int8 base weights; drop --quant or use qlora")
    return Strategy(**kwargs)


def _convert(name: str, convert: Callable[[str], Any], value: Any) -> Any:
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    try:
        return convert(str(value))
    except ValueError as exc:
        raise InvalidValueError(f"--{name}: {value!r} is not a valid value") from exc


def _switch(value: Any, negated: bool) -> bool:
    """A switch's state: ``--x`` / ``x: true`` is on, ``--no-x`` / ``no-x: true`` off."""
    return bool(value) ^ negated


def _checkpointing(kwargs: dict[str, Any], name: str, negated: bool, value: Any) -> None:
    on = _switch(value, negated)
    if name == "offload-activations":
        if on:
            kwargs["checkpointing"] = Checkpointing.OFFLOAD
    elif kwargs.get("checkpointing") is not Checkpointing.OFFLOAD:
        kwargs["checkpointing"] = Checkpointing.FULL if on else Checkpointing.NONE


def default_sharding(flags: dict[str, Any]) -> dict[str, Any]:
    """CLI.md defaults that depend on other flags: ``--sharding`` is ddp on one GPU and zero3
    on several; the unsloth recipe offloads its checkpoints unless told otherwise."""
    checkpoint_flags = {"gradient-checkpointing", "no-gradient-checkpointing",
                        "offload-activations", "no-offload-activations"}
    if str(flags.get("recipe")) == "unsloth" and not checkpoint_flags & set(flags):
        flags = flags | {"offload-activations": True}
    if "sharding" in flags:
        return flags
    gpus = _int(str(flags.get("gpus", 1))) * _int(str(flags.get("nodes", 1)))
    return flags | {"sharding": "ddp" if gpus <= 1 else "zero3"}
