"""``tuneplan probe`` (measure or simulate a short run beside the estimate) and
``tuneplan calibration list|export|import`` (saved probes, shared as JSON).

Thin: the work is ``adapters/probe/run.py`` and ``adapters/calibration.py``. Progress goes to
stderr, so ``--json`` prints exactly one document on stdout.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from tuneplan.cli.options import JsonFlag, emit_json, job_flags, make_console
from tuneplan.service.jobs import JobRequest

JsonOpt = JsonFlag
calibration_app = typer.Typer(help="Saved probe measurements: list, export, import.",
                              no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_command)
    app.add_typer(calibration_app, name="calibration")


@job_flags("probe")
def probe_command(
    model: Annotated[str, typer.Argument(help="Bundled name, HF id, or folder.")],
    steps: Annotated[int, typer.Option(help="Steps to run (the first is warm-up).")] = 10,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    random_weights: Annotated[bool, typer.Option(
        "--random-weights", help="Random weights from the config (no download).")] = False,
    simulate: Annotated[bool, typer.Option(
        "--simulate", help="Fake tensors: the tensor-level peak, no real memory.")] = False,
    download: Annotated[bool, typer.Option(
        "--download", help="Allow downloading the weights from the hub.")] = False,
    *, request: JobRequest,
    as_json: JsonOpt = False,
) -> None:
    """Measure a short run (or simulate it) and set it beside the estimate, term by term."""
    from tuneplan.adapters.probe.run import ProbeRequest, run_probe

    req = ProbeRequest(model=model, strategy=request.job().strategy, steps=steps, device=device,
                       random_weights=random_weights, simulate=simulate, download=download)
    with _progress() as report:
        doc = run_probe(req, report)
    doc.pop("record", None)
    if as_json:
        emit_json(doc)
        return
    _print_probe(doc)


@contextmanager
def _progress() -> Iterator[Callable[[str, int, int], None]]:
    """A transient progress bar on stderr; yields the ``report(what, done, total)`` callback."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=make_console(stderr=True), transient=True) as bar:
        task = bar.add_task("probe", total=1)

        def report(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=max(total, 1))

        yield report


def _print_probe(doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{doc['model']} on {doc['device_name']}: measured vs estimated")
    for col in ("term", "measured", "estimated", "error"):
        table.add_column(col, justify="left" if col == "term" else "right")
    for row in doc["comparison"]:
        err = "n/a" if row["error_pct"] is None else f"{row['error_pct']:+.1f} %"
        name = row["name"] + (" (analytic)" if row.get("measured_source") == "analytic" else "")
        table.add_row(name, _fmt(row["name"], row["measured_bytes"]),
                      _fmt(row["name"], row["estimated_bytes"]), err)
    console = make_console()
    console.print(table)
    measured = doc["measured"]
    if measured.get("tokens_per_second"):
        console.print(f"tokens/s measured: {measured['tokens_per_second']:,}")
    if measured.get("simulation_seconds") is not None:
        console.print(f"simulation took {measured['simulation_seconds']} s")
    for fb in doc.get("fallbacks", []):
        console.print(f"not simulated: {fb['part']} ({fb['reason']}); "
                      f"analytic {fb['analytic_term']} used")
    console.print(f"saved as probe #{doc.get('probe_id')} ({doc['seconds']} s in all)")


def _fmt(name: str, value: int) -> str:
    from tuneplan.units import format_bytes

    return f"{value:,}" if name == "tokens/s" else format_bytes(int(value))


@calibration_app.command("list")
def calibration_list(as_json: JsonOpt = False) -> None:
    """Every saved probe: when, where, what, and its main figure."""
    from rich.table import Table

    from tuneplan.adapters.calibration import CalibrationStore

    with CalibrationStore.open() as store:
        records = store.records()
    if as_json:
        emit_json([r.as_dict() for r in records])
        return
    table = Table(title=f"Saved probes ({len(records)})")
    for col in ("id", "when", "device", "gpu", "model", "method", "origin"):
        table.add_column(col)
    for r in records:
        table.add_row(str(r.id), r.created_at.isoformat(timespec="seconds"), r.device_name,
                      r.gpu or "-", r.model, str(r.strategy.get("method", "?")), r.origin)
    make_console().print(table)


@calibration_app.command("export")
def calibration_export(file: Annotated[Path, typer.Argument(help="JSON file to write.")]) -> None:
    """Write every saved probe to FILE as JSON."""
    from tuneplan.adapters.calibration import CalibrationStore, export_document

    with CalibrationStore.open() as store:
        records = store.records()
    file.write_text(json.dumps(export_document(records), indent=2) + "\n", encoding="utf-8")
    typer.echo(f"exported {len(records)} probe(s) to {file}")


@calibration_app.command("import")
def calibration_import(file: Annotated[Path, typer.Argument(help="JSON file to read.")]) -> None:
    """Add the probes in FILE; every record is checked first, nothing written if one is bad."""
    from tuneplan.adapters.calibration import CalibrationStore, parse_document
    from tuneplan.errors import InvalidValueError

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidValueError(f"cannot read {file}: {exc}") from exc
    records = parse_document(data)
    with CalibrationStore.open() as store:
        ids = store.add_all(records)
    typer.echo(f"imported {len(ids)} probe(s) from {file}")
