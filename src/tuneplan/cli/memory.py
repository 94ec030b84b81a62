"""``tuneplan memory`` and ``tuneplan explain``: per-GPU memory of a job, term by term.

Thin: job flags are parsed by ``tuneplan.service.jobflags``, the estimate is ``core.memory``, the
document and words come from ``tuneplan.service.memory_report``.
"""

from __future__ import annotations

import typer

from tuneplan.cli.options import JsonFlag, ModelArg, emit_json, job_flags, make_console
from tuneplan.service.jobs import JobRequest


def register(app: typer.Typer) -> None:
    app.command("memory")(memory_command)
    app.command("explain")(explain_command)


@job_flags("memory")
def memory_command(model: ModelArg, request: JobRequest, as_json: JsonFlag = False) -> None:
    """Per-GPU memory: allocated, reserved and whole-device peaks with every term."""
    from rich.table import Table

    from tuneplan.core.catalog.hardware import usable_phrase
    from tuneplan.core.planner.search import DEFAULT_MEMORY_MARGIN
    from tuneplan.service.memory_report import memory_document, memory_limit_bytes, run_memory
    from tuneplan.units import format_bytes

    est, spec, gpu = run_memory(request)
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
    if est.loading is not None:
        for term in est.loading:
            if term.path.startswith("loading/"):
                table.add_row(term.path, format_bytes(int(term.value)))
        table.add_row("whole device while loading" + (" (binds)" if est.loading_binds else ""),
                      format_bytes(est.loading_peak_bytes))
    table.add_row("host RAM per node", format_bytes(est.host_ram_bytes))
    if spec.extra.get("structure"):
        table.add_row("model structure", f"{spec.extra['structure']} "
                      f"(confidence {spec.extra.get('confidence', 'medium')})")
    if gpu is not None:
        limit = memory_limit_bytes(gpu)
        room = est.headroom(limit)
        table.add_row(f"{gpu.name} usable", usable_phrase(gpu))
        table.add_row(f"limit (usable x {DEFAULT_MEMORY_MARGIN:.0%})", format_bytes(limit))
        table.add_row(f"fits {gpu.name}?", f"{'yes' if room >= 0 else 'no'} "
                      f"({format_bytes(room)} headroom): "
                      + ("loading peak" if est.loading_binds else "whole device") + " vs limit")
    console = make_console()
    console.print(table)
    for note in est.notes:
        console.print("note: " + note, markup=False)


@job_flags("explain")
def explain_command(model: ModelArg, request: JobRequest, as_json: JsonFlag = False) -> None:
    """Every memory term with its formula, inputs and source, in words."""
    from tuneplan.service.memory_report import explain_lines, memory_document, run_memory

    est, spec, gpu = run_memory(request)
    if as_json:
        emit_json(memory_document(est, spec, gpu))
        return
    typer.echo("\n".join(explain_lines(est, gpu)))
