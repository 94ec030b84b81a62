"""``tuneplan memory`` and ``tuneplan explain``: per-GPU memory of a job, term by term.

Thin: job flags are parsed by ``tuneplan.service.jobflags``, the estimate is ``core.memory``, the
document and words come from ``tuneplan.service.memory_report``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tuneplan.service.jobflags import JOB_FLAGS_HELP

_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
ModelArg = Annotated[str, typer.Argument(help="Bundled name, HF id, folder or config.json.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def register(app: typer.Typer) -> None:
    app.command("memory", context_settings=_CONTEXT, epilog=JOB_FLAGS_HELP)(memory_command)
    app.command("explain", context_settings=_CONTEXT, epilog=JOB_FLAGS_HELP)(explain_command)


def memory_command(ctx: typer.Context, model: ModelArg, as_json: JsonOpt = False) -> None:
    """Per-GPU memory: allocated, reserved and whole-device peaks with every term."""
    from rich.console import Console
    from rich.table import Table

    from tuneplan.cli.app import emit_json
    from tuneplan.service.memory_report import memory_document, run_memory
    from tuneplan.units import format_bytes

    est, spec, gpu = run_memory(model, ctx.args)
    if as_json:
        emit_json(memory_document(est, spec, gpu))
        return
    table = Table(title=f"{est.model} — peak during {est.peak_phase}")
    table.add_column("term")
    table.add_column("size", justify="right")
    for term in est.breakdown:
        if term.value:
            table.add_row(term.path, format_bytes(int(term.value)))
    table.add_row("allocated peak", format_bytes(est.allocated_peak_bytes))
    table.add_row("reserved peak", format_bytes(est.reserved_peak_bytes))
    table.add_row("whole device", format_bytes(est.device_total_bytes))
    table.add_row("host RAM per node", format_bytes(est.host_ram_bytes))
    if gpu is not None:
        room = est.headroom(gpu.usable_memory_bytes)
        table.add_row(f"fits {gpu.name}?", f"{'yes' if room >= 0 else 'no'} "
                      f"({format_bytes(room)} headroom)")
    Console().print(table)


def explain_command(ctx: typer.Context, model: ModelArg, as_json: JsonOpt = False) -> None:
    """Every memory term with its formula, inputs and source, in words."""
    from tuneplan.cli.app import emit_json
    from tuneplan.service.memory_report import explain_lines, memory_document, run_memory

    est, spec, gpu = run_memory(model, ctx.args)
    if as_json:
        emit_json(memory_document(est, spec, gpu))
        return
    typer.echo("\n".join(explain_lines(est, gpu)))
