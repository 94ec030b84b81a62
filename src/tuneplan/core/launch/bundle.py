"""A plan (the JSON entry of ``tuneplan plan``) -> the text of a spot-safe launch bundle.

``launch_spec`` reads the plan's fields once, reporting every missing or bad one at once;
``render_bundle`` returns {relative path: file text} for the chosen targets. The training
entry point's text is passed in (it is package data, read by an adapter); the engines' files
come from ``core.launch.engines``, the clouds' from ``core.launch.clouds``. Writes nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from tuneplan.core.cost.estimate import CostAssumptions, checkpoint_bytes
from tuneplan.core.cost.spot import young_daly_interval_s
from tuneplan.core.job.methods import Method, Quant
from tuneplan.core.job.strategy import Checkpointing, Offload, Optimizer, Precision, Sharding
from tuneplan.errors import InvalidValueError
from tuneplan.units import GB, HOUR_S

#: Checkpoints kept at least: the newest may be half-written when the machine dies, so the one
#: before it must survive the retention sweep.
MIN_KEPT = 2
MAX_KEPT = 5
#: Disk beyond weights and checkpoints: image, pip cache, dataset, logs (stated, not measured).
DISK_HEADROOM_BYTES = 100 * GB
CHECKPOINT_DIR = "/checkpoints"
MARKER_NAME = "TUNEPLAN_COMPLETE.json"


class Target(StrEnum):
    ACCELERATE = "accelerate"
    DEEPSPEED = "deepspeed"
    SKYPILOT = "skypilot"
    DSTACK = "dstack"
    ALL = "all"


def expand_targets(targets: Iterable[str]) -> tuple[Target, ...]:
    """Targets in a fixed order; ``all`` means every one. Raises InvalidValueError."""
    out: set[Target] = set()
    for raw in targets:
        for word in str(raw).split(","):
            try:
                target = Target(word.strip().lower())
            except ValueError:
                choices = ", ".join(t.value for t in Target)
                raise InvalidValueError(f"unknown launch target {word!r}: use {choices}") from None
            out |= set(Target) - {Target.ALL} if target is Target.ALL else {target}
    if not out:
        raise InvalidValueError(
            "no launch target: use --to accelerate|deepspeed|skypilot|dstack|all")
    return tuple(t for t in Target if t in out)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """Everything the bundle needs from a plan, in base units (seconds, bytes)."""

    plan_id: str
    model: str
    method: Method
    precision: Precision
    optimizer: Optimizer
    lora_rank: int
    lora_alpha: int
    lora_dropout: float
    lora_targets: tuple[str, ...]
    trainable_modules: tuple[str, ...]
    quant: Quant
    double_quant: bool
    batch_size: int
    grad_accum: int
    seq_len: int
    packing: bool
    checkpointing: Checkpointing
    attention: str
    gpus: int
    nodes: int
    sharding: Sharding
    offload: Offload
    provider: str
    instance_type: str
    gpu: str
    region: str
    zone: str | None
    use_spot: bool
    step_s: float
    checkpoint_interval_s: float
    interval_source: str
    save_steps: int
    save_total_limit: int
    checkpoint_bytes: int
    disk_bytes: int
    total_params: int
    trainable_params: int
    tokens_per_epoch: int | None
    epochs: float
    hours: float | None
    on_demand_usd: str | None
    spot_usd: str | None
    why: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    @property
    def zero_stage(self) -> int | None:
        """DeepSpeed ZeRO stage of the plan's sharding (None: not a DeepSpeed plan)."""
        return {Sharding.ZERO1: 1, Sharding.ZERO2: 2, Sharding.ZERO3: 3}.get(self.sharding)

    @property
    def is_fsdp(self) -> bool:
        return self.sharding in (Sharding.FSDP, Sharding.FSDP_GRAD_OP, Sharding.HYBRID)

    @property
    def planned_steps(self) -> int | None:
        """Optimizer steps = tokens x epochs / (micro-batch x seq_len x grad_accum x GPUs)."""
        if not self.tokens_per_epoch:
            return None
        per_step = self.batch_size * self.seq_len * self.grad_accum * self.world_size
        return math.ceil(self.tokens_per_epoch * self.epochs / per_step)


class _Reader:
    """Pulls typed fields out of nested mappings, collecting every problem."""

    def __init__(self, plan: Mapping[str, Any]) -> None:
        self.plan = plan
        self.problems: list[str] = []

    def get(self, path: str, kind: Any, default: Any = ...) -> Any:
        node: Any = self.plan
        for key in path.split("."):
            if not isinstance(node, Mapping) or node.get(key) is None:
                if default is ...:
                    self.problems.append(f"{path} is missing")
                return None if default is ... else default
            node = node[key]
        try:
            return kind(node)
        except (TypeError, ValueError):
            name = getattr(kind, "__name__", kind)
            self.problems.append(f"{path}={node!r} is not a valid {name}")
            return None


def _interval(r: _Reader, ckpt_bytes: int) -> tuple[float, str]:
    """(seconds between checkpoints, where the figure comes from)."""
    minutes = r.get("cost.spot.checkpoint_interval_minutes", float, None)
    if minutes:
        return minutes * 60, "the plan's spot cost model (Young/Daly)"
    a = CostAssumptions()
    write_s = ckpt_bytes / a.checkpoint_write_bytes_per_s
    interval = young_daly_interval_s(write_s, HOUR_S / a.default_interruptions_per_hour)
    return interval, (f"Young/Daly sqrt(2 x {write_s:.0f} s write x "
                      f"{1 / a.default_interruptions_per_hour:.0f} h MTBF), default assumptions")


def _plan_fields(r: _Reader) -> dict[str, Any]:
    """The plan's own fields (strategy, offer, job, cost), keyed as LaunchSpec names them."""
    s = "strategy."
    return dict(
        plan_id=r.get("id", str), model=r.get("job.model", str),
        method=r.get(s + "method", Method), precision=r.get(s + "precision", Precision),
        optimizer=r.get(s + "optimizer", Optimizer),
        lora_rank=r.get(s + "lora_rank", int, 16), lora_alpha=r.get(s + "lora_alpha", int, 32),
        lora_dropout=r.get(s + "lora_dropout", float, 0.0),
        lora_targets=tuple(r.get(s + "lora_targets", list, ["all-linear"])),
        trainable_modules=tuple(r.get(s + "trainable_modules", list, [])),
        quant=r.get(s + "quant", Quant, Quant.NF4),
        double_quant=r.get(s + "double_quant", bool, True),
        batch_size=r.get(s + "batch_size", int), grad_accum=r.get(s + "grad_accum", int, 1),
        seq_len=r.get(s + "seq_len", int), packing=r.get(s + "packing", bool, False),
        checkpointing=r.get(s + "checkpointing", Checkpointing, Checkpointing.FULL),
        attention=r.get(s + "attention", str, "sdpa"),
        gpus=r.get(s + "gpus", int, 1), nodes=r.get(s + "nodes", int, 1),
        sharding=r.get(s + "sharding", Sharding, Sharding.DDP),
        offload=r.get(s + "offload", Offload, Offload.NONE),
        provider=r.get("offer.provider", str), instance_type=r.get("offer.instance_type", str),
        gpu=r.get("offer.gpu", str), region=r.get("offer.region", str),
        zone=r.get("offer.zone", str, None), use_spot=r.get("cost.uses_spot", bool, False),
        step_s=r.get("throughput.step_seconds", float),
        total_params=r.get("memory.total_params", int),
        trainable_params=r.get("memory.trainable_params", int),
        tokens_per_epoch=r.get("job.tokens_per_epoch", int, None),
        epochs=r.get("job.epochs", float, 1.0), hours=r.get("cost.hours", float, None),
        on_demand_usd=r.get("cost.on_demand_usd", str, None),
        spot_usd=r.get("cost.spot.expected_usd", str, None),
        why=tuple(r.get("why", list, [])), warnings=tuple(r.get("warnings", list, [])))


def launch_spec(plan: Mapping[str, Any]) -> LaunchSpec:
    """Read a plan entry (``tuneplan plan --json``'s ``plans[i]`` with its ``job``) and derive
    the checkpoint cadence: save_steps = interval / step time (hourly when no interruption is
    expected); kept = what the disk holds beside the weights, within [MIN_KEPT, MAX_KEPT].

    Raises InvalidValueError listing every missing or bad field."""
    r = _Reader(plan)
    fields = _plan_fields(r)
    if r.problems:
        raise InvalidValueError("plan cannot be launched: " + "; ".join(r.problems))
    total, step_s = fields["total_params"], fields["step_s"]
    ckpt, _ = checkpoint_bytes(
        method=fields["method"], precision=fields["precision"], optimizer=fields["optimizer"],
        total_params=total, trainable_params=fields["trainable_params"])
    interval_s, source = _interval(r, ckpt)
    disk = r.get("offer.disk_bytes", int, None)
    weights = total * 2
    # The cost model priced storage for ``checkpoints_kept``; a known disk may hold more.
    kept = CostAssumptions().checkpoints_kept if not disk else \
        (disk - weights - DISK_HEADROOM_BYTES) // max(ckpt, 1)
    kept = max(MIN_KEPT, min(MAX_KEPT, kept))
    every_s = interval_s if math.isfinite(interval_s) else HOUR_S
    return LaunchSpec(
        **fields, checkpoint_interval_s=interval_s, interval_source=source,
        save_steps=max(1, round(every_s / step_s)), save_total_limit=kept,
        checkpoint_bytes=ckpt, disk_bytes=weights + kept * ckpt + DISK_HEADROOM_BYTES)


def train_config(spec: LaunchSpec, *, output_dir: str = CHECKPOINT_DIR) -> dict[str, Any]:
    """The settings ``train.py`` reads (``train_config.json``): the plan's choices, the
    checkpoint cadence and retention, and where checkpoints go."""
    return {
        "plan_id": spec.plan_id, "model_name_or_path": spec.model, "model_config": None,
        "method": spec.method.value, "precision": spec.precision.value,
        "optimizer": spec.optimizer.value, "lora_rank": spec.lora_rank,
        "lora_alpha": spec.lora_alpha, "lora_dropout": spec.lora_dropout,
        "lora_targets": list(spec.lora_targets), "trainable_modules": list(spec.trainable_modules),
        "quant": spec.quant.value, "double_quant": spec.double_quant,
        "batch_size": spec.batch_size, "grad_accum": spec.grad_accum, "seq_len": spec.seq_len,
        "packing": spec.packing, "gradient_checkpointing": spec.checkpointing.value != "none",
        "attention": spec.attention, "sharding": spec.sharding.value,
        "world_size": spec.world_size, "epochs": spec.epochs, "max_steps": -1,
        "learning_rate": 2e-4 if spec.method.is_lora else 2e-5, "warmup_steps": 0,
        "lr_scheduler": "cosine", "seed": 42,
        "save_steps": spec.save_steps, "save_total_limit": spec.save_total_limit,
        "output_dir": f"{output_dir}/{spec.plan_id}", "marker_name": MARKER_NAME,
        "dataset": {"kind": "jsonl", "path": "data/train.jsonl", "text_field": "text"},
        "deepspeed": "ds_config.json" if spec.zero_stage is not None else None,
    }


def render_bundle(plan: Mapping[str, Any], targets: Iterable[str], *,
                  train_script: str) -> dict[str, str]:
    """{relative path: text} of the bundle for ``plan`` (an entry of ``tuneplan plan --json``
    with its ``job``). ``train_script`` is the text of the training entry point."""
    return bundle_files(launch_spec(plan), expand_targets(targets), train_script=train_script)


def bundle_files(spec: LaunchSpec, chosen: tuple[Target, ...], *,
                 train_script: str) -> dict[str, str]:
    """``render_bundle`` for a spec already read and targets already expanded."""
    from tuneplan.core.launch import clouds as launch_clouds
    from tuneplan.core.launch import engines as launch_engines
    from tuneplan.core.launch.readme import render_run_md

    with_ds = spec.zero_stage is not None or Target.DEEPSPEED in chosen
    files: dict[str, str] = {
        "train.py": train_script,
        "train_config.json": json.dumps(train_config(spec), indent=2) + "\n",
        "requirements.txt": launch_engines.requirements(spec, deepspeed=with_ds),
        "accelerate_config.yaml": launch_engines.render_accelerate_config(spec),
    }
    if with_ds:
        files["ds_config.json"] = json.dumps(launch_engines.deepspeed_config(spec), indent=2) + "\n"
    if Target.ACCELERATE in chosen:
        files["launch_accelerate.sh"] = launch_engines.launch_script(spec, "accelerate")
    if Target.DEEPSPEED in chosen:
        files["launch_torchrun.sh"] = launch_engines.launch_script(spec, "torchrun")
    if Target.SKYPILOT in chosen:
        files["sky.yaml"] = launch_clouds.render_skypilot(spec)
    if Target.DSTACK in chosen:
        files[".dstack.yml"] = launch_clouds.render_dstack(spec)
        files["volume.dstack.yml"] = launch_clouds.render_dstack_volume(spec)
    files["RUN.md"] = render_run_md(spec, tuple(files), chosen)
    return files


def spec_summary(spec: LaunchSpec) -> dict[str, Any]:
    """The spec as plain JSON values (for ``launch --json``)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(spec).items()}
