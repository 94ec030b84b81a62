"""``tuneplan launch``: write a spot-safe launch bundle for a plan.

Thin: the adapter finds the plan and writes files, ``core.launch.bundle`` renders them.
``register(app)`` adds the command to the main Typer app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Opt = typer.Option


def launch_command(
    plan_id: Annotated[str | None, typer.Argument(
        help="A plan id from the last `tuneplan plan` (or within --plan).")] = None,
    plan_file: Annotated[Path | None, Opt("--plan", help="A `tuneplan plan --json` file.")] = None,
    to: Annotated[str, Opt("--to", help="accelerate, deepspeed, skypilot, dstack, axolotl, "
                                        "llamafactory or all (comma-separated for several).")]
    = "all",
    out: Annotated[Path | None, Opt("--out", help="Folder to write (default launch-PLAN_ID).")]
    = None,
    force: Annotated[bool, Opt("--force", help="Write into a folder that is not empty.")]
    = False,
    as_json: Annotated[bool, Opt("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Write the launch bundle (train.py, accelerate/DeepSpeed configs, SkyPilot and dstack
    tasks, axolotl and LLaMA-Factory configs, RUN.md) for a plan."""
    from tuneplan.adapters.launch_files import write_bundle
    from tuneplan.cli.options import emit_json, make_console
    from tuneplan.core.launch.bundle import expand_targets
    from tuneplan.service.launch import saved_bundle, written_document

    expand_targets([to])  # an unknown target is refused before the plan is read
    spec, files = saved_bundle(plan_id, plan_file, [to])
    folder = out if out is not None else Path(f"launch-{spec.plan_id}")
    written = write_bundle(files, folder, force=force)
    doc = written_document(spec, folder, files, [to])
    if as_json:
        emit_json(doc)
        return
    left = doc["left_out"]
    left_out = f"; left out: {', '.join(left)} (RUN.md says why)" if left else ""
    console = make_console()
    console.print(f"Wrote {len(written)} files for plan {spec.plan_id} to {folder}/ "
                  f"({', '.join(doc['targets'])}{left_out}); checkpoints every "
                  f"{spec.save_steps} steps, keeping {spec.save_total_limit}. See RUN.md.")


def register(app: typer.Typer) -> None:
    """Add ``launch`` to ``app``."""
    app.command("launch")(launch_command)
