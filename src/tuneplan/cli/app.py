"""The command line: one Typer app; each command group lives in its own module and is added
here by ``build_app`` (no registration by import side effect).

Thin by design: parse flags, call the service layer, present. Every ``TuneplanError`` and every
usage error (an unknown flag, a missing argument) becomes one line on stderr with exit code 2
(bad input) or 1; tracebacks only with ``--debug``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from tuneplan.cli.options import FormatOpt, WideOpt
from tuneplan.errors import TuneplanError

try:  # Typer 0.29+ carries its own Click; older releases use the click package
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - depends on the installed Typer
    from click import exceptions as click_errors  # type: ignore[no-redef]

_DEBUG = {"on": False}  # set by --debug for this invocation; TUNEPLAN_DEBUG=1 does the same


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        sys.stdout.write(f"tuneplan {version('tuneplan')}\n")
        raise typer.Exit(0)


def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    _show_version: Annotated[bool, typer.Option(
        "--version", help="Print the version and exit.", callback=_version,
        is_eager=True)] = False,
) -> None:
    _DEBUG["on"] = debug


def models_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")
                       ] = False,
    fmt: FormatOpt = None, wide: WideOpt = False,
) -> None:
    """List the bundled model registry with exact parameter counts."""
    from tuneplan.cli.options import OutputFormat, emit_json, make_console, output_format
    from tuneplan.cli.tables import Column, print_table
    from tuneplan.service.catalog import models_document
    from tuneplan.units import format_count

    chosen = output_format(fmt, as_json, wide=wide)
    rows = models_document()
    if chosen is OutputFormat.JSON:
        emit_json(rows)
        return
    columns: tuple[Column[dict[str, Any]], ...] = (
        Column("name", lambda r: r["name"]),
        Column("alias", lambda r: r["alias"], priority=1, wrap=True),
        Column("type", lambda r: r["model_type"], priority=2),
        Column("total params", lambda r: format_count(r["total_params"]), right=True),
        Column("active params", lambda r: format_count(r["active_params"]), right=True),
    )
    print_table(columns, rows, chosen, make_console(), title=f"Bundled models ({len(rows)})",
                wide=wide)


def build_app() -> typer.Typer:
    """The whole app, every command group added explicitly."""
    from tuneplan.cli import catalog, compute, launch, memory, plan, probe, refresh, web

    app = typer.Typer(
        name="tuneplan",
        help="Will a fine-tuning job fit, on which GPU, how long will it take and what will it "
             "cost?",
        no_args_is_help=True, pretty_exceptions_enable=False)
    app.callback()(_root)
    app.command("models")(models_command)
    catalog.register(app)
    refresh.register(catalog.catalog_app)
    compute.register(app)
    memory.register(app)
    plan.register(app)
    web.register(app)
    probe.register(app)
    launch.register(app)
    return app


app = build_app()


def _usage_line(exc: click_errors.UsageError) -> str:
    """A usage error in one line, naming the closest valid flag for an unknown one."""
    if isinstance(exc, click_errors.NoSuchOption):
        import difflib

        near = difflib.get_close_matches(exc.option_name, list(exc.possibilities or ()), n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        command = exc.ctx.command_path if exc.ctx is not None else "tuneplan"
        return f"unknown flag {exc.option_name} for `{command}`{hint} (see --help)"
    return exc.format_message()


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry: run the app, and turn errors into one line and an exit code."""
    _DEBUG["on"] = False
    command = typer.main.get_command(app)
    try:
        code = command.main(args=list(argv) if argv is not None else None, prog_name="tuneplan",
                            standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        sys.stdout.write(exc.format_message() + "\n")
        code = 0
    except click_errors.UsageError as exc:
        sys.stderr.write(f"error: {' '.join(_usage_line(exc).split())}\n")
        code = 2
    except click_errors.ClickException as exc:
        sys.stderr.write(f"error: {' '.join(exc.format_message().split())}\n")
        code = exc.exit_code
    except typer.Abort:
        sys.stderr.write("error: aborted\n")
        code = 1
    except TuneplanError as exc:
        if _DEBUG["on"] or os.environ.get("TUNEPLAN_DEBUG"):
            raise
        from tuneplan.cli.options import plain

        message = plain(" ".join(str(exc).split()))  # one line, no control or escape chars
        sys.stderr.write(f"error: {message}\n")
        code = exc.exit_code
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
