"""Tables that fit the terminal, or the same columns as CSV or Markdown (docs/CLI.md, "Output
formats").

A table is described once, as a list of ``Column``: its header, how one row becomes the cell's
text, and its priority. ``print_table`` then writes it in the format asked for:

- ``table``: a Rich table no wider than the console. Priority-0 columns (the row's id and the
  figures a choice is made on) are always shown, at full width, never wrapped nor cut. The
  others are added in priority order while they fit; only free-text columns (``wrap=True``)
  wrap, down to ``WRAP_FLOOR`` characters. A footer names the columns left out and how to see
  them (``--wide``, ``--format csv``).
- ``csv``: every column, written by the csv module; ``markdown``: every column, a pipe table.

Cells are data: controls and escapes become U+FFFD (``plain``); a Rich cell is a ``Text``, so
catalog text is never read as markup; Markdown specials are backslash-escaped.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tuneplan.cli.options import OutputFormat, plain

R = TypeVar("R")

#: A wrapping column is never made narrower than this many characters (or its longest word,
#: if shorter than its whole text): narrower, a sentence becomes a column of fragments.
WRAP_FLOOR = 14
#: Characters a column adds to a Rich table besides its text: one space each side, one rule.
_PER_COLUMN = 3


@dataclass(frozen=True)
class Column(Generic[R]):
    """One column of a table: ``cell(row)`` is its plain text (never markup).

    ``priority`` 0 means always shown (ids and decision columns); higher numbers are left out
    first when the terminal is narrow. ``wrap`` lets free text wrap; other cells never do.
    ``style(row)`` may colour a cell in the terminal table (not in CSV or Markdown)."""

    header: str
    cell: Callable[[R], str]
    priority: int = 0
    right: bool = False
    wrap: bool = False
    style: Callable[[R], str | None] | None = None


def print_table(columns: Sequence[Column[R]], rows: Sequence[R], fmt: OutputFormat,
                console: Console, *, title: str | None = None, wide: bool = False) -> None:
    """Write ``rows`` as ``fmt`` (table, csv or markdown; a command writes its own JSON)."""
    if fmt is OutputFormat.JSON:
        raise ValueError("print_table writes tables; a command writes its own JSON document")
    cells = [[plain(column.cell(row)) for column in columns] for row in rows]
    headers = [column.header for column in columns]
    if fmt is OutputFormat.CSV:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows(cells)
    elif fmt is OutputFormat.MARKDOWN:
        sys.stdout.write(_markdown(columns, headers, cells))
    else:
        _print_rich(columns, rows, cells, console, title, wide)


def _markdown(columns: Sequence[Column[R]], headers: list[str], cells: list[list[str]]) -> str:
    # The escape RUN.md uses for catalog text: specials (the pipe too) backslash-escaped.
    from tuneplan.core.launch.readme import _md as markdown_literal

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(values) + " |\n"

    rule = ["---:" if column.right else "---" for column in columns]
    return line([markdown_literal(h) for h in headers]) + line(rule) + "".join(
        line([markdown_literal(value) for value in row]) for row in cells)


def _print_rich(columns: Sequence[Column[R]], rows: Sequence[R], cells: list[list[str]],
                console: Console, title: str | None, wide: bool) -> None:
    texts = [[c.header, *(row[i] for row in cells)] for i, c in enumerate(columns)]
    natural = [max(cell_len(t) for t in column) for column in texts]
    least = [_least_width(c, t) for c, t in zip(columns, texts, strict=True)]
    budget = console.width
    widths = dict(enumerate(natural)) if wide else _fitted(columns, least, natural, budget)
    table = Table(title=Text(plain(title)) if title is not None else None)
    for i in sorted(widths):
        c = columns[i]
        # Every cell fits its width except free text, so only free text and headers wrap.
        table.add_column(Text(c.header), justify="right" if c.right else "left",
                         width=widths[i], overflow="fold")
    for row, values in zip(rows, cells, strict=True):
        table.add_row(*(Text(values[i], style=_style(columns[i], row)) for i in sorted(widths)))
    needed = _table_width(widths.values())
    if needed > console.width:  # --wide, or the always-shown columns alone are wider
        saved = console.width
        console.width = needed  # the terminal wraps long lines; a cut id would be worse
        console.print(table)
        console.width = saved
    else:
        console.print(table)
    hidden = [columns[i].header for i in range(len(columns)) if i not in widths]
    if hidden:
        console.print(Text(f"{len(hidden)} columns left out to fit {budget} characters: "
                           f"{', '.join(hidden)} (--wide shows them; --format csv or markdown "
                           "prints every column)"))


def _least_width(column: Column[R], texts: list[str]) -> int:
    """The narrowest a column may be: free text down to ``WRAP_FLOOR`` (or its whole text if
    shorter, or its longest word if longer); any other column its widest cell, its header
    allowed to wrap between words."""
    words = max((cell_len(w) for w in column.header.split()), default=1)
    if not column.wrap:
        return max([words, *(cell_len(t) for t in texts[1:])])
    longest_word = max((cell_len(w) for t in texts for w in t.split()), default=1)
    return min(max(cell_len(t) for t in texts), max(WRAP_FLOOR, longest_word))


def _table_width(widths: Iterable[int]) -> int:
    values = list(widths)
    return sum(values) + _PER_COLUMN * len(values) + 1


def _fitted(columns: Sequence[Column[R]], least: list[int], natural: list[int], budget: int
            ) -> dict[int, int]:
    """Width of each column shown (by index), the table at most ``budget`` wide if it can be.

    The priority-0 columns are always shown and first widened to their natural width (so a
    decision column never wraps to make room for a lesser one); then the others are added by
    priority while they fit at their least width; what is left widens them, by priority."""
    order = sorted(range(len(columns)), key=lambda i: (columns[i].priority, i))
    widths = {i: least[i] for i in order if columns[i].priority == 0}

    def grow(indexes: Iterable[int]) -> None:
        spare = budget - _table_width(widths.values())
        for i in indexes:
            step = max(0, min(natural[i] - widths[i], spare))
            widths[i] += step
            spare -= step

    grow(list(widths))
    for i in order:
        if i not in widths and (_table_width(widths.values()) + least[i] + _PER_COLUMN
                                <= budget):
            widths[i] = least[i]
    grow([i for i in order if columns[i].priority > 0 and i in widths])
    return widths


def _style(column: Column[R], row: R) -> str:
    return (column.style(row) or "") if column.style is not None else ""
