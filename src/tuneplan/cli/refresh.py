"""CLI command ``tuneplan catalog refresh [--source NAME[,NAME...]] [--json]`` (live prices).

Thin: pick the sources, run ``adapters.refresh`` (sources fetched concurrently, conditional
GETs cached under ``store.default_cache_dir``) with progress on stderr: a Rich progress bar
when stderr is a terminal, one plain line per source finished otherwise. Then one table row
(or JSON entry) per source. Exit 1 naming the failed sources, 2 for an unknown source name
(InvalidValueError), 0 otherwise.
"""

from __future__ import annotations

import sys
import threading
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
    help="Only these sources or groups (repeatable, or comma-separated: --source a,b): azure, "
    "runpod, vastai, lambda (needs LAMBDA_API_KEY), gpuhunt or gpuhunt/<provider> (needs "
    "the catalog extra), skypilot or skypilot/<cloud>, aws (opt-in: its offer file is "
    "hundreds of MB), or all (every source, aws included). Default: all but the opt-in ones.")]


def catalog_refresh_command(source: SourceFlag = None, as_json: JsonFlag = False) -> None:
    """Refresh offers from live price sources; a source that fails keeps its previous snapshot."""
    from tuneplan.adapters.importers.network import HttpCache
    from tuneplan.adapters.refresh import refresh, select_sources
    from tuneplan.adapters.store import CatalogStore, default_cache_dir
    from tuneplan.cli.options import emit_json, make_console

    chosen = select_sources(source)  # an unknown name exits 2 before anything is fetched
    console = make_console()
    progress = (_RefreshProgress(make_console(stderr=True), len(chosen)) if sys.stderr.isatty()
                else _PlainProgress(len(chosen)))
    with CatalogStore.open() as store, progress:
        outcomes = refresh(store, [s.name for s in chosen], on_progress=progress.update,
                           cache=HttpCache(default_cache_dir()))
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


class _PlainProgress:
    """One stderr line per finished source (stderr is not a terminal: a log, a pipe, CI)."""

    def __init__(self, total: int) -> None:
        self._total, self._done = total, 0
        self._lock = threading.Lock()  # refresh calls on_progress from several threads

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, source: LiveSource, outcome: SourceOutcome | None) -> None:
        if outcome is None:
            return
        with self._lock:
            self._done += 1
            sys.stderr.write(f"refresh [{self._done}/{self._total}] {plain(outcome.status)}: "
                             f"{plain(' '.join(outcome.message.split()))}\n")
            sys.stderr.flush()


class _RefreshProgress:
    """A Rich progress bar over the sources (stderr is a terminal); ``update`` is refresh's
    ``on_progress``, called from several threads (Rich's Progress is thread-safe)."""

    def __init__(self, target: Console, total: int) -> None:
        # Imported here: rich.progress costs start-up time for every other command.
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), console=target, transient=True)
        self._task = self._progress.add_task("refreshing", total=total)
        self._running: dict[str, None] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> _RefreshProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, source: LiveSource, outcome: SourceOutcome | None) -> None:
        with self._lock:
            if outcome is None:
                self._running[source.name] = None
            else:
                self._running.pop(source.name, None)
                self._progress.advance(self._task)
            names = list(self._running)
        shown = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
        self._progress.update(self._task, description=f"fetching {safe(shown or '...')}")


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
