"""``tuneplan launch``'s use case, shared with the web's bundle download: a typed plan (saved,
or fresh from a result) -> its launch files, rendered by ``core.launch``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuneplan.core.launch.bundle import LaunchSpec
    from tuneplan.core.models import ModelSpec
    from tuneplan.core.planner.plan import Plan, PlanResult
    from tuneplan.core.planner.record import SavedPlan


def bundle(plan: SavedPlan, targets: Iterable[str]) -> tuple[LaunchSpec, dict[str, str]]:
    """(spec, {relative path: text}) of ``plan``'s bundle for ``targets`` (accelerate,
    deepspeed, skypilot, dstack, axolotl, llamafactory, all; comma lists accepted). A cloud
    tool or framework named on its own that cannot run the plan is InvalidValueError; under
    ``all`` it is left out, with its reason in RUN.md."""
    from tuneplan.adapters.importers.snapshot import load_sky_catalog
    from tuneplan.adapters.launch_files import read_train_script
    from tuneplan.core.launch.bundle import asks_all, bundle_files, expand_targets, launch_spec

    targets = list(targets)
    model = _model(plan.model_id)
    spec = launch_spec(plan, model)
    files = bundle_files(spec, expand_targets(targets), train_script=read_train_script(),
                         sky_catalog=load_sky_catalog(), strict=not asks_all(targets),
                         model=model)
    return spec, files


def _model(model_id: str) -> ModelSpec | None:
    """The plan's model, for the LoRA target names PEFT is given (and torchtune's model
    builder, chosen by its dimensions); None when it cannot be
    resolved now (a hub model offline): then the targets are written as the plan states them,
    and train.py maps them onto a fused ``query_key_value`` at run time."""
    from tuneplan.adapters.hub import resolve_model
    from tuneplan.errors import TuneplanError

    try:
        return resolve_model(model_id)
    except TuneplanError:
        return None


def saved_bundle(plan_id: str | None, plan_file: Path | None, targets: Iterable[str]
                 ) -> tuple[LaunchSpec, dict[str, str]]:
    """The bundle of a plan from the last ``tuneplan plan`` (or a ``--plan`` file)."""
    from tuneplan.adapters.launch_files import load_plan

    return bundle(load_plan(plan_id, plan_file), targets)


def result_bundle(plan: Plan, result: PlanResult, targets: Iterable[str]
                  ) -> tuple[LaunchSpec, dict[str, str]]:
    """The bundle of a plan of a result still in memory (the web's download)."""
    from tuneplan.core.planner.record import saved_plan

    return bundle(saved_plan(plan, result), targets)


def written_document(spec: LaunchSpec, folder: Path, files: dict[str, str],
                     targets: Iterable[str]) -> dict[str, Any]:
    """``tuneplan launch --json``: ``targets`` the ones written, ``left_out`` the ones
    ``all`` left out (RUN.md says why)."""
    from tuneplan.core.launch.bundle import expand_targets, written_targets

    chosen = expand_targets(targets)
    written = written_targets(chosen, files)
    return {"plan_id": spec.plan_id, "out": str(folder),
            "targets": [t.value for t in written],
            "left_out": [t.value for t in chosen if t not in written], "files": sorted(files),
            "save_steps": spec.save_steps, "save_total_limit": spec.save_total_limit,
            "checkpoint_interval_s": spec.checkpoint_interval_s}
