"""``tuneplan launch``: write a spot-safe launch bundle for a plan.

Thin: the adapter finds the plan and writes files, ``core.launch.bundle`` renders them.
``register(app)`` adds the command to the main Typer app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

Opt = typer.Option


def launch_command(
    plan_id: Annotated[str | None, typer.Argument(
        help="A plan id from the last `tuneplan plan` (or within --plan).")] = None,
    plan_file: Annotated[Path | None, Opt("--plan", help="A `tuneplan plan --json` file.")] = None,
    to: Annotated[str, Opt("--to", help="accelerate, deepspeed, skypilot, dstack or all "
                                        "(comma-separated for several).")] = "all",
    out: Annotated[Path | None, Opt("--out", help="Folder to write (default launch-PLAN_ID).")]
    = None,
    force: Annotated[bool, Opt("--force", help="Write into a folder that is not empty.")]
    = False,
    as_json: Annotated[bool, Opt("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Write the launch bundle (train.py, accelerate/DeepSpeed configs, SkyPilot and dstack
    tasks, RUN.md) for a plan."""
    from tuneplan.adapters.launch_files import load_plan, read_train_script, write_bundle
    from tuneplan.cli.options import emit_json
    from tuneplan.core.launch.bundle import bundle_files, expand_targets, launch_spec

    targets = expand_targets([to])
    spec = launch_spec(load_plan(plan_id, plan_file))
    folder = out if out is not None else Path(f"launch-{spec.plan_id}")
    files = bundle_files(spec, targets, train_script=read_train_script())
    written = write_bundle(files, folder, force=force)
    if as_json:
        emit_json({"plan_id": spec.plan_id, "out": str(folder),
                   "targets": [t.value for t in targets], "files": sorted(files),
                   "save_steps": spec.save_steps, "save_total_limit": spec.save_total_limit,
                   "checkpoint_interval_s": spec.checkpoint_interval_s})
        return
    console = Console()
    console.print(f"Wrote {len(written)} files for plan {spec.plan_id} to {folder}/ "
                  f"({', '.join(t.value for t in targets)}); checkpoints every "
                  f"{spec.save_steps} steps, keeping {spec.save_total_limit}. See RUN.md.")


def register(app: typer.Typer) -> None:
    """Add ``launch`` to ``app``."""
    app.command("launch")(launch_command)
