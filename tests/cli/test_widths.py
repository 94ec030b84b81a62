"""Every table fits the terminal with its ids whole; csv and markdown hold the rows --json has
(docs/CLI.md, "Output formats")."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rich.cells import cell_len

from tests.cli.conftest import CliResult

Run = Callable[..., CliResult]
ESC = "\x1b"
PLAN = ("plan", "Qwen/Qwen2.5-0.5B", "--method", "qlora", "--tokens", "10M", "--top", "3",
        "--provider", "runpod,lambda")


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    id_header: str                       # the column holding each row's id
    ids: Callable[[Any], list[str]]      # the ids, in order, from the --json document
    decisions: tuple[str, ...]           # headers that must show at any width
    columns: int                         # how many columns csv/markdown hold


CASES = {
    "plan": Case(PLAN, "id", lambda d: [p["id"] for p in d["plans"]],
                 ("#", "id", "GPUs", "mem/GPU GiB", "hours", "on-demand"), 13),
    "offers": Case(("offers", "--gpu", "H100", "--limit", "6"), "id",
                   lambda d: [o["id"] for o in d], ("id", "provider", "GPU x n", "$/h"), 11),
    "fit": Case(("fit", "Qwen/Qwen2.5-0.5B", "--gpu", "L4"), "method",
                lambda d: [m["method"] for m in d["methods"]],
                ("method", "peak at job settings", "fits"), 5),
    "gpus": Case(("gpus", "--min-memory", "141GB"), "gpu", lambda d: [g["name"] for g in d],
                 ("gpu", "memory", "usable"), 11),
    "providers": Case(("providers",), "provider", lambda d: [p["name"] for p in d],
                      ("provider", "billing", "spot"), 10),
    "models": Case(("models",), "name", lambda d: [m["name"] for m in d],
                   ("name", "total params", "active params"), 5),
    "catalog status": Case(("catalog", "status"), "source",
                           lambda d: [s["source"] for s in d["sources"]],
                           ("source", "fetched at (UTC)", "age", "offers", "note"), 6),
    "catalog history": Case(("catalog", "history", "A100"), "gpu",
                            lambda d: [p["gpu"] for p in d],
                            ("fetched at (UTC)", "gpu", "on-demand", "spot"), 6),
}


def _widest_line(text: str) -> int:
    """The widest line of the table (the lines after it, such as the catalog's age, are left
    to the terminal to wrap, so a search finds them whole)."""
    return max(cell_len(line) for line in text.splitlines() if line[:1] in "┏┃┡│└")


def _header_words(text: str) -> set[str]:
    """The words of a Rich table's header rows (a header may wrap between its words)."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    rule = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    return {word for line in lines[top + 1:rule]
            for cell in line.strip("┃").split("┃") for word in cell.split()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_table_fits_80_and_120_columns_with_every_id_whole(
        run_cli: Run, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    case = CASES[name]
    ids = case.ids(run_cli(*case.args, "--json").ok_json())
    assert ids
    for width in (80, 120):
        monkeypatch.setenv("COLUMNS", str(width))
        shown = run_cli(*case.args)
        assert shown.code == 0, shown.stderr
        assert _widest_line(shown.stdout) <= width, (width, shown.stdout)
        shown_ids = [i for i in ids if i in shown.stdout]
        assert shown_ids == ids, (width, shown.stdout)
        words = _header_words(shown.stdout)
        for header in case.decisions:
            assert set(header.split()) <= words, (width, header, shown.stdout)
        assert "…" not in shown.stdout  # nothing ellipsised


#: The commands whose table is a figure per row (its row id is the figure's name): the
#: names taken from their --json, the headers that must show.
FIGURES = {
    "memory": (("memory", "Qwen/Qwen2.5-0.5B", "--method", "lora"),
               lambda d: [t["name"] for t in d["per_gpu"]["terms"] if t["bytes"]],
               ("term", "size")),
    "throughput": (("throughput", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--gpu", "L4"),
                   lambda d: [t["name"] for t in d["step"]["terms"]], ("figure", "value")),
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_each_figure_table_fits_80_and_120_columns_with_every_name_whole(
        run_cli: Run, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    args, names_of, headers = FIGURES[name]
    names = names_of(run_cli(*args, "--json").ok_json())
    assert names
    for width in (80, 120):
        monkeypatch.setenv("COLUMNS", str(width))
        shown = run_cli(*args)
        assert shown.code == 0, shown.stderr
        assert _widest_line(shown.stdout) <= width, (width, shown.stdout)
        assert [n for n in names if n in shown.stdout] == names, (width, shown.stdout)
        assert set(headers) <= _header_words(shown.stdout)
        assert "…" not in shown.stdout


def test_plan_at_80_columns_names_what_it_left_out_and_wide_shows_it(
        run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    narrow = run_cli(*PLAN).stdout
    assert "provider" in _header_words(narrow)
    assert not {"settings", "storage", "billing"} & _header_words(narrow)
    footer = " ".join(narrow.split("columns left out to fit 80 characters: ")[1].split())
    assert footer.startswith("instance, settings, tok/s, spot exp/P90, billing, storage "
                             "(--wide shows them")
    wide = run_cli(*PLAN, "--wide")
    assert wide.code == 0 and "left out" not in wide.stdout
    assert {"settings", "storage", "provider", "billing"} <= _header_words(wide.stdout)
    assert _widest_line(wide.stdout) > 80  # every column, on lines the terminal wraps


@pytest.mark.parametrize("name", sorted(CASES))
def test_csv_has_the_json_rows_and_markdown_the_column_count(run_cli: Run, name: str) -> None:
    case = CASES[name]
    ids = case.ids(run_cli(*case.args, "--format", "json").ok_json())
    as_csv = run_cli(*case.args, "--format", "csv")
    assert as_csv.code == 0, as_csv.stderr
    header, *rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    column = header.index(case.id_header)
    assert [row[column] for row in rows] == ids
    assert ESC not in as_csv.stdout
    if name != "offers":  # offers' csv is the --json record (docs/CLI.md)
        assert len(header) == case.columns and all(len(r) == case.columns for r in rows)
    markdown = run_cli(*case.args, "--format", "markdown")
    assert markdown.code == 0, markdown.stderr
    lines = markdown.stdout.splitlines()
    assert len(lines) == len(ids) + 2
    for line in lines:
        assert line.startswith("| ") and line.endswith(" |")
        assert line.count("|") - line.count("\\|") == case.columns + 1, line
    assert set(lines[1].strip("| ").split(" | ")) <= {"---", "---:"}


def test_cost_table_csv_and_markdown(run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    offer = run_cli("offers", "--gpu", "L4", "--limit", "1", "--json").ok_json()[0]["id"]
    args = ("cost", "Qwen/Qwen2.5-0.5B", "--offer", offer, "--tokens", "10M")
    doc = run_cli(*args, "--json").ok_json()
    total = f"${float(doc['cost']):,.2f}"
    for width in (80, 120):
        monkeypatch.setenv("COLUMNS", str(width))
        table = run_cli(*args)
        assert table.code == 0 and _widest_line(table.stdout) <= width
        assert "total cost" in table.stdout and total in table.stdout
        assert {"figure", "value"} <= _header_words(table.stdout)
    rows = list(csv.reader(io.StringIO(run_cli(*args, "--format", "csv").stdout)))
    assert rows[0] == ["figure", "value"] and ["total cost", total] in rows
    markdown = run_cli(*args, "--format", "markdown").stdout.splitlines()
    assert markdown[:2] == ["| figure | value |", "| --- | ---: |"]
    assert f"| total cost | {total} |" in markdown


def test_catalog_text_stays_data_in_csv_and_markdown(run_cli: Run, tmp_path: Any) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("provider,gpu,gpu_count,region,price_per_hour,instance_type\n"
                    "acme,H100 SXM5,8,us-east,20,a|b*[/x]_c\n", encoding="utf-8")
    assert run_cli("catalog", "import", str(path)).code == 0
    args = ("offers", "--provider", "acme")
    rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--format", "csv").stdout)))
    assert [r["instance_type"] for r in rows] == ["a|b*[/x]_c"]
    markdown = run_cli(*args, "--format", "markdown").stdout
    assert "a\\|b\\*\\[/x\\]\\_c" in markdown and "[/x]" not in markdown
    assert "a|b*[/x]_c" in run_cli(*args, "--wide").stdout  # not read as Rich markup


def test_no_color_writes_no_escape(run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert ESC + "[" in run_cli("catalog", "status").stdout  # the check can fail
    monkeypatch.setenv("NO_COLOR", "1")
    for args in (("catalog", "status"), PLAN, ("offers", "--gpu", "H100", "--limit", "3")):
        result = run_cli(*args)
        assert result.code == 0 and result.stdout and ESC not in result.stdout, args


@pytest.mark.parametrize("flags,message", [
    (("--json", "--format", "csv"), "disagree"),
    (("--format", "csv", "--wide"), "--wide is for the table"),
    (("--json", "--wide"), "--wide is for the table"),
    (("--format", "yaml"), "yaml"),
])
def test_formats_that_disagree_are_refused_in_one_line(run_cli: Run, flags: tuple[str, ...],
                                                        message: str) -> None:
    result = run_cli("gpus", *flags)
    assert result.code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr


def test_offers_csv_flag_is_format_csv(run_cli: Run) -> None:
    args = ("offers", "--gpu", "B200", "--limit", "3")
    assert run_cli(*args, "--csv").stdout == run_cli(*args, "--format", "csv").stdout
    assert run_cli(*args, "--csv", "--format", "markdown").code == 2


def test_shell_completion_is_enabled(run_cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_TUNEPLAN_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "tuneplan pl")
    monkeypatch.setenv("COMP_CWORD", "1")
    result = run_cli()
    assert result.code == 0 and result.stdout.split() == ["plan"]
    monkeypatch.delenv("_TUNEPLAN_COMPLETE")
    assert "--install-completion" in run_cli("--help").stdout
    assert run_cli("--version").stdout.startswith("tuneplan ")


def test_the_always_shown_columns_win_over_the_width_and_empty_tables_print() -> None:
    from rich.console import Console

    from tuneplan.cli.options import OutputFormat
    from tuneplan.cli.tables import Column, print_table

    columns = (Column("id", lambda r: r[0]), Column("note", lambda r: r[1], wrap=True),
               Column("extra", lambda r: r[1], priority=1))
    rows = [("x" * 50, "some words that wrap when the terminal is narrow")]
    sink = io.StringIO()
    print_table(columns, rows, OutputFormat.TABLE, Console(file=sink, width=40))
    shown = sink.getvalue()
    assert "x" * 50 in shown  # wider than the terminal, still whole
    assert "extra" not in _header_words(shown) and "1 columns left out" in shown
    assert set(rows[0][1].split()) <= set(shown.replace("│", " ").split())  # wrapped, whole
    sink = io.StringIO()
    print_table(columns, [], OutputFormat.TABLE, Console(file=sink, width=80))
    assert {"id", "note", "extra"} <= _header_words(sink.getvalue())


def test_python_dash_m_runs_the_same_command_line() -> None:
    import subprocess
    import sys

    import tuneplan
    from tests.waiting import HANG_GUARD_S

    done = subprocess.run([sys.executable, "-m", "tuneplan", "--version"], capture_output=True,
                          text=True, timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"tuneplan {tuneplan.__version__}"
