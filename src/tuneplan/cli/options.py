"""Options every command shares: ``--json``/``--format``/``--wide``, the model argument, the
job flags, and the console a command prints on.

``job_flags(command)`` turns ``service.jobflags.FLAGS`` into real Typer options on a command,
so ``--help`` lists every job flag with its choices and default, a misspelled flag is refused by
the parser with the closest valid name, and no help text is written twice. The decorated
command receives a ``JobRequest`` (the given flags and the ``--job`` file) instead of one
parameter per flag.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import unicodedata
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from tuneplan.errors import InvalidValueError
from tuneplan.service.jobflags import (
    PANELS,
    PLANNER_SEARCHES,
    PLANNER_SEARCHES_HELP,
    Flag,
    flags_for,
)
from tuneplan.service.jobs import JobRequest

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
ModelArg = Annotated[str, typer.Argument(help="Bundled name, HF id, folder or config.json.")]
F = TypeVar("F", bound=Callable[..., Any])


class OutputFormat(StrEnum):
    """How a command that prints a table prints it (docs/CLI.md, "Output formats")."""

    TABLE = "table"
    JSON = "json"
    CSV = "csv"
    MARKDOWN = "markdown"


FormatOpt = Annotated[OutputFormat | None, typer.Option(
    "--format", help="table (fitted to the terminal), json (= --json), csv or markdown (every "
                     "column, nothing else on stdout).")]
WideOpt = Annotated[bool, typer.Option(
    "--wide", help="Table: show every column, however narrow the terminal.")]


def output_format(fmt: OutputFormat | None, as_json: bool = False, *, wide: bool = False,
                  as_csv: bool = False) -> OutputFormat:
    """The one format ``--format``, its aliases ``--json``/``--csv`` and ``--wide`` ask for;
    flags that disagree are refused, never one of them silently ignored."""
    asked = {f for f, given in ((OutputFormat.JSON, as_json), (OutputFormat.CSV, as_csv),
                                (fmt, fmt is not None)) if given and f is not None}
    if len(asked) > 1:
        names = " and ".join(sorted(f"--format {f.value}" for f in asked))
        raise InvalidValueError(f"{names} disagree: give one output format")
    chosen = asked.pop() if asked else OutputFormat.TABLE
    if wide and chosen is OutputFormat.JSON:
        raise InvalidValueError("--wide is for the table, not for --json")
    if wide and chosen is not OutputFormat.TABLE:
        raise InvalidValueError(f"--wide is for the table: --format {chosen.value} always "
                                "holds every column")
    return chosen


def make_console(*, stderr: bool = False) -> Console:
    """The Rich console of this invocation, made when a command prints (not at import), so
    the terminal's width, or ``COLUMNS`` when set, is the one of this run; with ``NO_COLOR``
    set (https://no-color.org) it writes no ANSI escape at all, colour or style."""
    if os.environ.get("NO_COLOR", ""):
        return Console(stderr=stderr, color_system=None, no_color=True)
    return Console(stderr=stderr)


#: Unicode categories never sent to a terminal: controls (ESC, NUL, C1), format characters
#: (bidi overrides, zero-width), private use, surrogates, unassigned, line/paragraph separators.
_UNSHOWN = frozenset(("Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"))


def plain(text: object) -> str:
    """``text`` with every control, escape or bidi character replaced by U+FFFD: for lines
    written straight to stdout/stderr (no Rich markup there, so nothing else to escape)."""
    raw = "" if text is None else str(text)
    return "".join("\ufffd" if unicodedata.category(ch) in _UNSHOWN else ch for ch in raw)


def safe(text: object) -> str:
    """``text`` made inert for a Rich console: every control, escape or bidi character becomes
    U+FFFD and Rich markup (``[/x]``, ``[link=...]``) is escaped, so data from a catalog file or
    an API is shown as the characters it holds and can neither crash nor restyle the output.
    Use it for every provider, instance, region, source, note or message printed with Rich."""
    from rich.markup import escape

    return escape(plain(text))


def emit_json(document: Any) -> None:
    """Print one JSON document on stdout (Decimals as strings keep money exact)."""
    from tuneplan.service.jsondoc import dumps

    sys.stdout.write(dumps(document, indent=2, ascii_only=True) + "\n")


def _default_text(flag: Flag) -> str | None:
    default = flag.default
    if default is None or default == ():
        return None
    if isinstance(default, tuple):
        return ",".join(default)
    if isinstance(default, bool):
        return "on" if default else "off"
    return default.value if isinstance(default, StrEnum) else str(default)


def _option(flag: Flag, command: str) -> inspect.Parameter:
    default = _default_text(flag)
    text = flag.help
    if command == "plan" and flag.name in PLANNER_SEARCHES:
        text += " " + PLANNER_SEARCHES_HELP
    if flag.kind.choices:
        text += f" One of: {', '.join(flag.kind.choices)}."
    shown: bool | str = default if default else False
    if flag.kind.switch:
        decls = [f"--{flag.name}/--no-{flag.name}"]
        annotation: Any = bool | None
        info = typer.Option(None, *decls, help=text, rich_help_panel=PANELS[flag.group],
                            show_default=shown)
    else:
        annotation = str | None
        info = typer.Option(None, f"--{flag.name}", help=text, metavar=flag.kind.metavar,
                            rich_help_panel=PANELS[flag.group], show_default=shown)
    return inspect.Parameter(_param(flag), inspect.Parameter.KEYWORD_ONLY, default=info,
                             annotation=annotation)


def _param(flag: Flag) -> str:
    return "jobflag_" + flag.key


def job_flags(command: str) -> Callable[[F], F]:
    """Give the decorated command every job flag of ``command`` plus ``--job FILE``; it is
    called with ``request=JobRequest(...)`` in their place."""
    flags = flags_for(command)

    def decorate(fn: F) -> F:
        own = inspect.signature(fn, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != "request"]
        job_file = inspect.Parameter(
            "jobflag_file", inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--job", help="A YAML/JSON file of job flags "
                                 "(flag: value); flags given here override it.",
                                 metavar="FILE", rich_help_panel=PANELS[flags[0].group]),
            annotation=Path | None)
        params = [*kept, *(_option(f, command) for f in flags), job_file]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {f.name: kwargs.pop(_param(f)) for f in flags}
            path = kwargs.pop("jobflag_file")
            model = kwargs.get("model", "")
            request = JobRequest(model=model, command=command,
                                 values={k: v for k, v in values.items() if v is not None},
                                 job_file=path)
            return fn(*args, request=request, **kwargs)

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate
