"""A plan (``core.planner.record.SavedPlan``) -> the text of a spot-safe launch bundle.

``launch_spec`` derives the checkpoint cadence from the plan's strategy, offer and timings;
``render_bundle`` returns {relative path: file text} for the chosen targets. The training
entry point's text is passed in (it is package data, read by an adapter); the engines' files
come from ``core.launch.engines``, the clouds' from ``core.launch.clouds``. Writes nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from tuneplan.core.catalog.offers import Offer, offer_record
from tuneplan.core.cost.estimate import CostAssumptions, checkpoint_bytes
from tuneplan.core.cost.spot import young_daly_interval_s
from tuneplan.core.job.methods import Method, freeze_selection, peft_lora_targets
from tuneplan.core.job.strategy import Loss, Optimizer, Sharding, Strategy
from tuneplan.core.job.tuners import LAUNCH_REFUSALS, TUNER_METHODS, launch_peft
from tuneplan.core.models import ModelSpec
from tuneplan.core.planner.record import SavedPlan
from tuneplan.errors import InvalidValueError
from tuneplan.units import GB, HOUR_S

if TYPE_CHECKING:
    from tuneplan.core.launch.native import NativeRun
    from tuneplan.core.launch.targets import DstackChoice, Refusal, SkyCatalog, SkyChoice

_T = TypeVar("_T")
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
    AXOLOTL = "axolotl"
    LLAMAFACTORY = "llamafactory"
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
            "no launch target: use --to "
            "accelerate|deepspeed|skypilot|dstack|axolotl|llamafactory|all")
    return tuple(t for t in Target if t in out)


#: The cloud tasks' file names (``_cloud_files``), each the mark of its target as written.
SKY_FILE = "sky.yaml"
DSTACK_FILE = ".dstack.yml"


def written_targets(chosen: Iterable[Target], files: Iterable[str]) -> tuple[Target, ...]:
    """The chosen targets whose files the bundle holds: under ``all`` a target that cannot
    run the plan is left out (RUN.md says why), so it is not named as written. A target's
    mark is the file it runs (accelerate and DeepSpeed both run train.py, which a framework's
    native run does not have)."""
    from tuneplan.core.launch import frameworks as launch_frameworks

    mark = {Target.ACCELERATE: "train.py", Target.DEEPSPEED: "train.py",
            Target.SKYPILOT: SKY_FILE, Target.DSTACK: DSTACK_FILE,
            Target.AXOLOTL: launch_frameworks.AXOLOTL_FILE,
            Target.LLAMAFACTORY: launch_frameworks.LLAMAFACTORY_FILE}
    names = set(files)
    return tuple(t for t in chosen if t is not Target.ALL and mark[t] in names)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """Everything the bundle needs from a plan, in base units (seconds, bytes): the plan's
    ``Strategy`` and ``Offer`` themselves, and the checkpoint cadence derived from them."""

    plan_id: str
    model_id: str
    strategy: Strategy
    offer: Offer
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
    on_demand_usd: Decimal | None
    spot_usd: Decimal | None
    why: tuple[str, ...]
    warnings: tuple[str, ...]
    #: the modules PEFT is given (``peft_lora_targets``: split q/k/v names on a fused
    #: ``query_key_value`` model name that module); empty: ``strategy.lora_targets``
    peft_targets: tuple[str, ...] = ()

    @property
    def lora_targets(self) -> tuple[str, ...]:
        """What every launch file names as the LoRA targets: the modules PEFT wraps."""
        return self.peft_targets or self.strategy.lora_targets

    @property
    def gpu_name(self) -> str:
        return self.offer.gpu

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def zero_stage(self) -> int | None:
        """DeepSpeed ZeRO stage of the plan's sharding (None: not a DeepSpeed plan)."""
        return {Sharding.ZERO1: 1, Sharding.ZERO2: 2, Sharding.ZERO3: 3}.get(
            self.strategy.sharding)

    @property
    def is_fsdp(self) -> bool:
        return self.strategy.sharding in (Sharding.FSDP, Sharding.FSDP_GRAD_OP, Sharding.HYBRID)

    @property
    def planned_steps(self) -> int | None:
        """Optimizer steps = tokens x epochs / (micro-batch x seq_len x grad_accum x GPUs)."""
        if not self.tokens_per_epoch:
            return None
        s = self.strategy
        per_step = s.batch_size * s.seq_len * s.grad_accum * self.world_size
        return math.ceil(self.tokens_per_epoch * self.epochs / per_step)


def checkpoint_write_s(ckpt_bytes: int) -> float:
    """Seconds one checkpoint takes to write at the cost model's stated write rate."""
    return ckpt_bytes / CostAssumptions().checkpoint_write_bytes_per_s


def _interval(plan: SavedPlan, ckpt_bytes: int) -> tuple[float, str]:
    """(seconds between checkpoints, where the figure comes from)."""
    if plan.spot_interval_s:
        return plan.spot_interval_s, "the plan's spot cost model (Young/Daly)"
    a = CostAssumptions()
    write_s = checkpoint_write_s(ckpt_bytes)
    interval = young_daly_interval_s(write_s, HOUR_S / a.default_interruptions_per_hour)
    return interval, (f"Young/Daly sqrt(2 x {write_s:.0f} s write x "
                      f"{1 / a.default_interruptions_per_hour:.0f} h MTBF), default assumptions")


def launch_spec(plan: SavedPlan, model: ModelSpec | None = None) -> LaunchSpec:
    """The launch view of a plan (``saved_plan(plan, result)`` for one just made, or a saved
    one an adapter read back), with the checkpoint cadence: save_steps = interval / step time
    (hourly when no interruption is expected); kept = what the disk holds beside the weights,
    within [MIN_KEPT, MAX_KEPT]. With the plan's ``model``, the LoRA targets are the modules
    PEFT wraps (``peft_lora_targets``), so every launch file names what the estimate counted.
    Raises InvalidValueError when the plan cannot be launched."""
    s = plan.strategy
    if model is not None and model.is_encoder_decoder:
        raise InvalidValueError(f"plan {plan.id} cannot be launched: {model.name} is an "
                                "encoder-decoder, and the bundled train.py (and the axolotl / "
                                "LLaMA-Factory configs) train causal LMs on text completions, "
                                "not source/target pairs")
    if s.method in LAUNCH_REFUSALS:
        raise InvalidValueError(f"plan {plan.id} cannot be launched: "
                                f"{LAUNCH_REFUSALS[s.method]}")
    if s.optimizer.is_galore and s.optimizer_in_backward:
        raise InvalidValueError(
            f"plan {plan.id} cannot be launched: layer-wise GaLore (optim galore_*_layerwise, "
            "the optimizer in backward) keeps its per-parameter optimizers outside the "
            "Trainer's optimizer state (transformers 5.24 LayerWiseDummyOptimizer), so a "
            "resumed spot run would restart them from zero; re-plan without "
            "--optimizer-in-backward")
    if plan.step_s <= 0 or plan.total_params < 1:
        raise InvalidValueError(f"plan {plan.id} cannot be launched: step time "
                                f"{plan.step_s} s, {plan.total_params} parameters")
    total = plan.total_params
    # the memory estimate's own count of what a checkpoint holds; a plan file written before
    # plans carried it gets the per-parameter rule of thumb
    ckpt = plan.checkpoint_bytes if plan.checkpoint_bytes is not None else checkpoint_bytes(
        method=s.method, precision=s.precision, optimizer=s.optimizer,
        total_params=total, trainable_params=plan.trainable_params)[0]
    interval_s, source = _interval(plan, ckpt)
    disk = plan.offer.disk_bytes
    weights = total * 2
    # The cost model priced storage for ``checkpoints_kept``; a known disk may hold more.
    kept = CostAssumptions().checkpoints_kept if not disk else \
        (disk - weights - DISK_HEADROOM_BYTES) // max(ckpt, 1)
    kept = max(MIN_KEPT, min(MAX_KEPT, kept))
    every_s = interval_s if math.isfinite(interval_s) else HOUR_S
    return LaunchSpec(
        plan_id=plan.id, model_id=plan.model_id, strategy=s, offer=plan.offer,
        use_spot=plan.uses_spot, step_s=plan.step_s, checkpoint_interval_s=interval_s,
        interval_source=source, save_steps=max(1, round(every_s / plan.step_s)),
        save_total_limit=kept, checkpoint_bytes=ckpt,
        disk_bytes=weights + kept * ckpt + DISK_HEADROOM_BYTES, total_params=total,
        trainable_params=plan.trainable_params, tokens_per_epoch=plan.job.tokens_per_epoch,
        epochs=plan.job.epochs, hours=plan.hours, on_demand_usd=plan.on_demand_usd,
        spot_usd=plan.spot_usd, why=plan.why, warnings=plan.warnings,
        peft_targets=peft_lora_targets(model, s) if model is not None else ())


#: transformers ``OptimizerNames`` of each planned optimizer: the ``optim`` the HF Trainer
#: (and so train.py, axolotl and LLaMA-Factory) builds. train.py keeps its own copy (it
#: imports nothing from tuneplan); a test holds the two equal.
HF_OPTIMIZERS = {Optimizer.ADAMW: "adamw_torch", Optimizer.ADAMW8BIT: "adamw_bnb_8bit",
                 Optimizer.PAGED_ADAMW8BIT: "paged_adamw_8bit",
                 Optimizer.PAGED_ADAMW32BIT: "paged_adamw_32bit",
                 Optimizer.ADAFACTOR: "adafactor", Optimizer.SGD: "sgd",
                 Optimizer.LION: "lion_32bit", Optimizer.GALORE_ADAMW: "galore_adamw",
                 Optimizer.GALORE_ADAMW8BIT: "galore_adamw_8bit",
                 Optimizer.GALORE_ADAFACTOR: "galore_adafactor"}


def hf_optim(s: Strategy) -> str:
    """The Trainer ``optim`` a plan runs: ``HF_OPTIMIZERS``, with AdamW as the implementation
    its memory and step time were estimated for (``core.job.versions.adamw_impl``): fused
    (``adamw_torch_fused``, the Trainer's own default on the stack the bundle pins) or torch's
    foreach default (``adamw_torch``), which keeps a parameter-sized temporary in its step."""
    from tuneplan.core.job.versions import adamw_impl

    if s.optimizer is Optimizer.ADAMW and adamw_impl(s, None) == "fused":
        return "adamw_torch_fused"
    return HF_OPTIMIZERS[s.optimizer]


def train_config(spec: LaunchSpec, *, output_dir: str = CHECKPOINT_DIR) -> dict[str, Any]:
    """The settings ``train.py`` reads (``train_config.json``): the plan's choices, the
    checkpoint cadence and retention, and where checkpoints go."""
    s = spec.strategy
    return {
        "plan_id": spec.plan_id, "model_name_or_path": spec.model_id, "model_config": None,
        "method": s.method.value, "precision": s.precision.value,
        "optimizer": s.optimizer.value, "optim": hf_optim(s), "lora_rank": s.lora_rank,
        "lora_alpha": s.lora_alpha, "lora_dropout": s.lora_dropout,
        "lora_targets": list(spec.lora_targets), "trainable_modules": list(s.trainable_modules),
        "quant": s.quant.value, "double_quant": s.double_quant,
        "batch_size": s.batch_size, "grad_accum": s.grad_accum, "seq_len": s.seq_len,
        "packing": s.packing, "gradient_checkpointing": s.checkpointing.value != "none",
        "attention": s.attention.value, "sharding": s.sharding.value,
        "loss": (s.loss or Loss.STANDARD).value,  # the HF Trainer's default: standard
        "world_size": spec.world_size, "epochs": spec.epochs, "max_steps": -1,
        "learning_rate": 2e-4 if s.method.is_lora else 2e-5, "warmup_steps": 0,
        "lr_scheduler": "cosine", "seed": 42,
        "save_steps": spec.save_steps, "save_total_limit": spec.save_total_limit,
        "output_dir": f"{output_dir}/{spec.plan_id}", "marker_name": MARKER_NAME,
        "dataset": {"kind": "jsonl", "path": "data/train.jsonl", "text_field": "text",
                    "cache_dir": "data/tokenised"},
        "deepspeed": "ds_config.json" if spec.zero_stage is not None else None,
        # PEFT's other tuners: the config train.py builds (core/job/tuners.py), else None
        "peft": launch_peft(s).as_dict() if s.method in TUNER_METHODS else None,
        "galore": galore_arguments(s),
        # LISA: the blocks train.py's switch trains at a time, and how often it draws them
        "lisa": {"layers": s.lisa_layers, "interval": s.lisa_interval}
        if s.method is Method.LISA else None,
        # freeze: what trains, as the estimate counts it (core/job/methods.py)
        "freeze": freeze_selection(s) if s.method is Method.FREEZE else None,
        # the plan's count, which train.py compares with what it set to train
        "trainable_params": spec.trainable_params,
    }


def galore_arguments(s: Strategy) -> dict[str, Any] | None:
    """The TrainingArguments a GaLore optimizer needs beside ``optim`` (transformers 5.24
    ``trainer_optimizer._get_galore_optimizer``): ``optim_target_modules``, the patterns the
    estimate matched, and ``optim_args`` "rank=..,update_proj_gap=..,scale=.." (the keys it
    pops; ``proj_type`` left at std, as estimated). None for other optimizers."""
    if not s.optimizer.is_galore:
        return None
    return {"optim_target_modules": list(s.galore_targets),
            "optim_args": f"rank={s.galore_rank},update_proj_gap={s.galore_update_proj_gap},"
                          f"scale={s.galore_scale:g}"}


def asks_all(targets: Iterable[str]) -> bool:
    """Whether the targets say ``all`` (then a cloud tool that cannot run the offer is left
    out with its reason in RUN.md; named on its own, it is refused with an error)."""
    return any(word.strip().lower() == Target.ALL.value
               for raw in targets for word in str(raw).split(","))


def render_bundle(plan: SavedPlan, targets: Iterable[str], *, train_script: str,
                  sky_catalog: SkyCatalog | None = None) -> dict[str, str]:
    """{relative path: text} of the bundle for ``plan``. ``train_script`` is the text of the
    training entry point; ``sky_catalog`` SkyPilot's catalog (its accelerator names), read by
    an adapter (none: SkyPilot is refused for want of names)."""
    targets = list(targets)
    return bundle_files(launch_spec(plan), expand_targets(targets), train_script=train_script,
                        sky_catalog=sky_catalog, strict=not asks_all(targets))


def bundle_files(spec: LaunchSpec, chosen: tuple[Target, ...], *, train_script: str,
                 sky_catalog: SkyCatalog | None = None, strict: bool = True,
                 model: ModelSpec | None = None) -> dict[str, str]:
    """``render_bundle`` for a spec already read and targets already expanded. ``strict``:
    a chosen cloud or framework target that cannot run the plan raises InvalidValueError
    (its reason); else it is left out and RUN.md says why. A plan whose recipe is not one
    train.py runs (``core.launch.recipes``) gets its framework's own run
    (``core.launch.native``; ``model`` picks torchtune's builder) or is refused."""
    from tuneplan.core.launch import native as launch_native
    from tuneplan.core.launch import recipes as launch_recipes

    recipe = spec.strategy.recipe
    if launch_recipes.runs_hf_trainer(recipe):
        return _hf_bundle(spec, chosen, train_script=train_script, sky_catalog=sky_catalog,
                          strict=strict)
    native = launch_native.native_run(spec, model)
    if not isinstance(native, launch_native.NativeRun):
        hf = launch_recipes.hf_trainer_refusal(recipe, ", ".join(t.value for t in chosen))
        assert hf is not None
        own = f"; {native.tool} cannot run it as planned: {native.reason}" if native else ""
        raise InvalidValueError(f"{hf.tool} cannot launch plan {spec.plan_id}: "
                                f"{hf.reason}{own}")
    return _native_bundle(spec, chosen, native, sky_catalog=sky_catalog, strict=strict)


#: Targets whose files run the bundle's command line (train.py's, or a framework's own).
_CLOUDS = (Target.SKYPILOT, Target.DSTACK)


def _native_bundle(spec: LaunchSpec, chosen: tuple[Target, ...], native: NativeRun, *,
                   sky_catalog: SkyCatalog | None, strict: bool) -> dict[str, str]:
    """The framework's config, its requirements, the cloud tasks running its command and
    RUN.md; the HF Trainer targets are refused (RUN.md says why under ``all``)."""
    from tuneplan.core.launch import native as launch_native
    from tuneplan.core.launch import recipes as launch_recipes
    from tuneplan.core.launch import targets as launch_targets
    from tuneplan.core.launch.readme import render_run_md

    hf_named = [t for t in chosen if t not in _CLOUDS]
    refused: list[launch_targets.Refusal] = []
    if hf_named:
        cmd = " ".join(native.command[:native.command.index(native.config_file) + 1])
        hf = launch_recipes.hf_trainer_refusal(
            spec.strategy.recipe, ", ".join(t.value for t in hf_named),
            instead=f"the bundle runs `{cmd}` ({native.config_file}) in the SkyPilot and "
                    "dstack tasks (--to skypilot, dstack or all) and in RUN.md")
        assert hf is not None
        refused.append(hf)

    sky, dst = _cloud_choices(spec, chosen, sky_catalog, refused)
    _raise_if_strict(spec, refused, strict)
    files: dict[str, str] = {
        native.config_file: launch_native.render_native(spec, native),
        "requirements.txt": launch_native.native_requirements(native)}
    files |= _cloud_files(spec, sky, dst, native)
    files["RUN.md"] = render_run_md(spec, tuple(files), chosen, sky=sky, dstack=dst,
                                    refused=tuple(refused), native=native)
    return files


#: The plain optimizer step inside backward (``--optimizer-in-backward`` without GaLore) on
#: the HF Trainer targets: transformers 5.24 steps a per-parameter optimizer from a
#: post-accumulate-grad hook only for the ``*_layerwise`` GaLore/APOLLO optimizers
#: (``trainer_optimizer._get_galore_optimizer`` and its APOLLO twin); ``adamw_torch`` and the
#: rest keep every gradient until ``optimizer.step()``, which the plan did not count.
#: axolotl and LLaMA-Factory have no option for it either (``frameworks._common_refusal``).
_IN_BACKWARD_REFUSAL = (
    "plan {plan} cannot be launched with train.py (accelerate, deepspeed, skypilot, dstack), "
    "axolotl or LLaMA-Factory: the HF Trainer has no optimizer step inside backward except "
    "layer-wise GaLore, so the run would keep the full gradients the plan did not count; "
    "re-plan without --optimizer-in-backward, or with --recipe torchtune (its "
    "full_finetune_single_device runs optimizer_in_bwd)")


def _hf_bundle(spec: LaunchSpec, chosen: tuple[Target, ...], *, train_script: str,
               sky_catalog: SkyCatalog | None, strict: bool) -> dict[str, str]:
    """train.py's bundle (recipes hf and plain)."""
    from tuneplan.core.launch import clouds as launch_clouds
    from tuneplan.core.launch import engines as launch_engines
    from tuneplan.core.launch import frameworks as launch_frameworks
    from tuneplan.core.launch import targets as launch_targets
    from tuneplan.core.launch.readme import render_run_md

    if spec.strategy.optimizer_in_backward:
        # Every target here refuses it, so nothing is left to write even under ``all``.
        raise InvalidValueError(_IN_BACKWARD_REFUSAL.format(plan=spec.plan_id))
    if spec.strategy.method is Method.FREEZE and spec.is_fsdp:
        raise InvalidValueError(
            f"plan {spec.plan_id} cannot be launched: --method freeze under FSDP: FSDP1 "
            "flattens the embedding, final norm and head into one flat parameter of one "
            "dtype, and under mixed precision train.py keeps the trainable norm in fp32 "
            "beside the frozen half-precision embedding (nor is freeze start-tested under "
            "FSDP); re-plan with --sharding ddp or a ZeRO stage")
    refused: list[launch_targets.Refusal] = []

    sky, dst = _cloud_choices(spec, chosen, sky_catalog, refused)
    framework_files: dict[str, str] = {}
    ax = (_take(launch_frameworks.axolotl_config(spec), refused)
          if Target.AXOLOTL in chosen else None)
    if ax is not None:
        framework_files[launch_frameworks.AXOLOTL_FILE] = launch_frameworks.render_axolotl(
            spec, ax)
    lf = (_take(launch_frameworks.llamafactory_config(spec), refused)
          if Target.LLAMAFACTORY in chosen else None)
    if lf is not None:
        framework_files[launch_frameworks.LLAMAFACTORY_FILE] = \
            launch_frameworks.render_llamafactory(spec, lf)
        framework_files[launch_frameworks.DATASET_INFO_FILE] = \
            launch_frameworks.llamafactory_dataset_info(spec)
    _raise_if_strict(spec, refused, strict)
    with_ds = spec.zero_stage is not None or Target.DEEPSPEED in chosen
    files: dict[str, str] = {
        "train.py": train_script,
        "train_config.json": json.dumps(train_config(spec), indent=2) + "\n",
        "requirements.txt": launch_engines.requirements(spec, deepspeed=with_ds),
        "accelerate_config.yaml": launch_engines.render_accelerate_config(spec),
        launch_engines.GUARD_SCRIPT: launch_engines.guard_script(spec),
    }
    if with_ds:
        files["ds_config.json"] = json.dumps(launch_engines.deepspeed_config(spec), indent=2) + "\n"
    if Target.ACCELERATE in chosen:
        files["launch_accelerate.sh"] = launch_clouds.manual_script(spec, "accelerate")
    if Target.DEEPSPEED in chosen:
        files["launch_torchrun.sh"] = launch_clouds.manual_script(spec, "torchrun")
    files |= _cloud_files(spec, sky, dst, None)
    manual = Target.ACCELERATE in chosen or Target.DEEPSPEED in chosen
    if manual and launch_clouds.manual_needs_store_script(spec):
        files[launch_clouds.STORE_SCRIPT] = launch_clouds.store_script(spec)
    files |= framework_files
    files["RUN.md"] = render_run_md(spec, tuple(files), chosen, sky=sky, dstack=dst,
                                    refused=tuple(refused))
    return files


def _take(got: _T | Refusal, refused: list[Refusal]) -> _T | None:
    """``got``, or None with its refusal kept for RUN.md (or the error when strict)."""
    from tuneplan.core.launch.targets import Refusal

    if isinstance(got, Refusal):
        refused.append(got)
        return None
    return got


def _cloud_choices(spec: LaunchSpec, chosen: tuple[Target, ...],
                   sky_catalog: SkyCatalog | None,
                   refused: list[Refusal]) -> tuple[SkyChoice | None, DstackChoice | None]:
    """The SkyPilot and dstack choices for the chosen targets (refusals kept in ``refused``)."""
    from tuneplan.core.launch import targets as launch_targets

    sky = _take(launch_targets.skypilot_choice(
        spec, sky_catalog or launch_targets.SkyCatalog()), refused) \
        if Target.SKYPILOT in chosen else None
    dst = _take(launch_targets.dstack_choice(spec), refused) \
        if Target.DSTACK in chosen else None
    return sky, dst


def _cloud_files(spec: LaunchSpec, sky: SkyChoice | None, dst: DstackChoice | None,
                 native: NativeRun | None) -> dict[str, str]:
    """``sky.yaml`` and the dstack files, running train.py or ``native``'s command, and the
    checkpoint store script when either keeps checkpoints on local disk or a host path."""
    from tuneplan.core.launch import clouds as launch_clouds
    from tuneplan.core.launch import targets as launch_targets

    files: dict[str, str] = {}
    if sky is not None:
        files[SKY_FILE] = launch_clouds.render_skypilot(spec, sky, native=native)
    if dst is not None:
        files[DSTACK_FILE] = launch_clouds.render_dstack(spec, dst, native=native)
        files["fleet.dstack.yml"] = launch_clouds.render_dstack_fleet(spec, dst)
        if dst.storage is launch_targets.Storage.NETWORK_VOLUME:
            files["volume.dstack.yml"] = launch_clouds.render_dstack_volume(spec, dst)
    if any(c is not None and launch_clouds.needs_store_script(c.storage) for c in (sky, dst)):
        files[launch_clouds.STORE_SCRIPT] = launch_clouds.store_script(spec)
    return files


def _raise_if_strict(spec: LaunchSpec, refused: list[Refusal], strict: bool) -> None:
    if refused and strict:
        raise InvalidValueError("; ".join(f"{r.tool} cannot launch plan {spec.plan_id}: "
                                          f"{r.reason}" for r in refused))


def spec_summary(spec: LaunchSpec) -> dict[str, Any]:
    """The spec as plain JSON values (for ``launch --json``): the strategy as its own
    ``as_dict``, the offer as ``offer_record``."""
    out: dict[str, Any] = {}
    for name in spec.__dataclass_fields__:
        value = getattr(spec, name)
        if isinstance(value, Strategy):
            value = value.as_dict()
        elif isinstance(value, Offer):
            value = offer_record(value)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out
