"""CLI command ``tuneplan catalog refresh [--source NAME] [--json]`` (live price sources).

Thin: pick the sources, run ``adapters.refresh`` with a Rich progress bar (on stderr with
``--json``), present one line per source. Exit 1 naming the failed sources, 2 for an unknown
source name (InvalidValueError), 0 otherwise.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from tuneplan.cli.options import JsonFlag, plain, safe

if TYPE_CHECKING:
    from tuneplan.adapters.refresh import LiveSource, SourceOutcome

SourceFlag = Annotated[list[str] | None, typer.Option(
    "--source", metavar="NAME",
    help="Only this source or group (repeatable): azure, runpod, vastai, gpuhunt, lambda "
    "(needs LAMBDA_API_KEY), skypilot or skypilot/<cloud>, aws (opt-in: its offer file is "
    "hundreds of MB). Default: all but the opt-in ones.")]


def catalog_refresh_command(source: SourceFlag = None, as_json: JsonFlag = False) -> None:
    """Refresh offers from live price sources; a source that fails keeps its previous snapshot."""
    from tuneplan.adapters.refresh import refresh, select_sources
    from tuneplan.adapters.store import CatalogStore
    from tuneplan.cli.options import emit_json, make_console

    chosen = select_sources(source)  # an unknown name exits 2 before anything is fetched
    console = make_console()
    target = make_console(stderr=True) if as_json else console
    with CatalogStore.open() as store, _RefreshProgress(target, len(chosen)) as bar:
        outcomes = refresh(store, [s.name for s in chosen], on_progress=bar.update)
    failed = [o.source for o in outcomes if o.failed]
    if as_json:
        emit_json({"sources": [asdict(o) for o in outcomes], "failed": failed})
    else:
        console.print(_table(outcomes))
    for outcome in outcomes:
        if outcome.failed:
            sys.stderr.write(f"error: {plain(' '.join(outcome.message.split()))}\n")
    if failed:
        sys.stderr.write(f"error: refresh failed for {plain(', '.join(failed))} "
                         "(their previous snapshots are kept)\n")
        raise typer.Exit(1)


class _RefreshProgress:
    """A Rich progress bar over the sources; ``update`` is refresh's ``on_progress``."""

    def __init__(self, target: Console, total: int) -> None:
        # Imported here: rich.progress costs start-up time for every other command.
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), console=target, transient=True)
        self._task = self._progress.add_task("refreshing", total=total)

    def __enter__(self) -> _RefreshProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, source: LiveSource, outcome: SourceOutcome | None) -> None:
        if outcome is None:
            self._progress.update(self._task, description=f"fetching {source.name}")
        else:
            self._progress.advance(self._task)


def _table(outcomes: list[SourceOutcome]) -> Table:
    table = Table(title="Catalog refresh")
    for column in ("source", "status", "offers", "rejected", "unknown GPUs", "message"):
        table.add_column(column, justify="right" if column in ("offers", "rejected") else "left")
    colour = {"ok": "green", "failed": "red", "skipped": "yellow"}
    for o in outcomes:
        table.add_row(safe(o.source), f"[{colour.get(o.status, 'white')}]{o.status}[/]",
                      str(o.offers_written), str(o.rejected_rows),
                      str(len(o.unknown_gpu_names)), safe(o.message))
    return table


def register(catalog_app: typer.Typer) -> None:
    """Add ``refresh`` to the ``catalog`` group."""
    catalog_app.command("refresh")(catalog_refresh_command)
