"""The command line: Typer + Rich, one small function per command, ``--json`` everywhere.

Thin by design: parse flags, call the core or an adapter, present. Every ``TuneplanError``
becomes one line on stderr with exit code 2 (bad input) or 1; tracebacks only with --debug.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tuneplan.errors import TuneplanError
from tuneplan.service.jsondoc import dumps

app = typer.Typer(
    name="tuneplan",
    help="Will a fine-tuning job fit, on which GPU, how long will it take and what will it cost?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def emit_json(document: Any) -> None:
    """Print one JSON document on stdout (Decimals as strings keep money exact)."""
    sys.stdout.write(dumps(document, indent=2, ascii_only=True) + "\n")


_DEBUG = {"on": False}  # set by --debug for this invocation; TUNEPLAN_DEBUG=1 does the same


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    _DEBUG["on"] = debug


@app.command("models")
def models_command(as_json: JsonFlag = False) -> None:
    """List the bundled model registry with exact parameter counts."""
    from tuneplan.adapters.hub import list_bundled_models
    from tuneplan.units import format_count

    rows = list_bundled_models()
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"Bundled models ({len(rows)})")
    table.add_column("name", no_wrap=True)
    for column in ("alias", "type", "total params", "active params"):
        table.add_column(column, justify="right" if "params" in column else "left")
    for row in rows:
        table.add_row(row["name"], row["alias"], row["model_type"],
                      format_count(row["total_params"]), format_count(row["active_params"]))
    console.print(table)


# gpus, providers, offers and the `catalog` group live in cli_catalog (issue 4).
from tuneplan.cli.catalog import register as _register_catalog  # noqa: E402

_register_catalog(app)

# `catalog refresh` (live price sources) lives in cli_refresh (issue 4); importing registers it.
import tuneplan.cli.refresh  # noqa: E402, F401

# throughput and cost live in cli_compute (issue 5).
from tuneplan.cli.compute import register as _register_compute  # noqa: E402

_register_compute(app)


# memory and explain live in cli_memory (issue 3).
from tuneplan.cli.memory import register as _register_memory  # noqa: E402

_register_memory(app)

# plan and fit live in cli_plan (issue 6).
from tuneplan.cli.plan import register as _register_plan  # noqa: E402

_register_plan(app)

# serve (the web app) lives in cli_web (issue 7).
from tuneplan.cli.web import register as _register_web  # noqa: E402

_register_web(app)

# probe and the `calibration` group live in cli_probe (issue 9).
from tuneplan.cli.probe import register as _register_probe  # noqa: E402

_register_probe(app)

# launch (bundles for accelerate, DeepSpeed, SkyPilot, dstack) lives in cli_launch (issue 8).
from tuneplan.cli.launch import register as _register_launch  # noqa: E402

_register_launch(app)


def main() -> None:
    """Console-script entry: run the app and turn errors into one line and an exit code.

    Click's standalone mode handles usage errors itself (exit 2); tuneplan's own errors
    propagate out of it and are reported here.
    """
    _DEBUG["on"] = False
    try:
        app()
    except TuneplanError as exc:
        if _DEBUG["on"] or os.environ.get("TUNEPLAN_DEBUG"):
            raise
        message = " ".join(str(exc).split())  # one line, whatever the message held
        sys.stderr.write(f"error: {message}\n")
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
