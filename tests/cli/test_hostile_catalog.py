"""A catalog file cannot break tuneplan: hostile CSV text stays data, numbers are bounded at
parse time, a bad source can be removed, and first use is safe under concurrency."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

import tuneplan
from tests.cli.conftest import CliResult
from tuneplan.adapters.importers.user_csv import parse_user_csv
from tuneplan.adapters.store import CatalogStore, default_path
from tuneplan.cli.options import plain, safe
from tuneplan.core.catalog.offers import OfferFilter
from tuneplan.errors import InvalidValueError

Run = Callable[..., CliResult]
HEADER = ["provider", "gpu", "gpu_count", "region", "price_per_hour", "spot_price_per_hour",
          "instance_type", "zone", "vcpus", "ram", "disk", "interconnect", "notes"]
GOOD = {"provider": "acme", "gpu": "H100 SXM5", "gpu_count": "8", "region": "us-east",
        "price_per_hour": "20", "spot_price_per_hour": "", "instance_type": "h8",
        "zone": "", "vcpus": "96", "ram": "1TiB", "disk": "2TB", "interconnect": "",
        "notes": ""}
MARKUP = ["[/x]", "[link=file:///etc/passwd]x[/link]", "[bold red]boom[/]", "[/]", "\\[x]",
          "x\\", "[", "]"]
CONTROLS = ["\x1b[31mred\x1b[0m", "\x1b]8;;file:///etc/passwd\x07x\x1b]8;;\x07", "a\x00b",
            "\x9b31m", "\u202egnp.exe", "\x07\x08", "tab\there"]
NUMBERS = ["1" * 5000, "1e400", "-1e400", "nan", "NaN", "inf", "-inf", "1e999999999",
           "9223372036854775808", "0", "-3", "0.25", "1e-999999", "true", "8.0", "1_000"]
HOSTILE = st.one_of(
    st.sampled_from(MARKUP + CONTROLS + NUMBERS),
    st.text(max_size=30),
    st.text(alphabet="[]/\\=:\x1b\x00;", max_size=20),
    st.integers(min_value=100_000, max_value=140_000).map(lambda n: "x" * n),
)
ESC = "\x1b"


def _csv(rows: list[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=HEADER, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


@st.composite
def hostile_rows(draw: st.DrawFn) -> list[dict[str, str]]:
    rows = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        row = dict(GOOD)
        for column in draw(st.sets(st.sampled_from(HEADER), min_size=1, max_size=4)):
            row[column] = draw(HOSTILE)
        rows.append(row)
    return rows


def _render_offers(store: CatalogStore) -> str:
    from tuneplan.cli import catalog as catalog_cli

    sink = io.StringIO()
    catalog_cli._print_offers(store.offers(), store.status(), None,
                              Console(file=sink, force_terminal=True, width=200), wide=True)
    return sink.getvalue()


def test_safe_escapes_markup_and_replaces_controls() -> None:
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=False, width=200)
    console.print(safe("[/x] [link=file:///etc/passwd]x[/link] \x1b[31m a\x00b \u202e"))
    shown = sink.getvalue()
    assert "[/x] [link=file:///etc/passwd]x[/link]" in shown
    assert ESC not in shown and "\x00" not in shown and "\u202e" not in shown
    assert shown.count("\ufffd") == 3
    assert plain("ok\x1b[2J") == "ok\ufffd[2J"


@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=hostile_rows())
@example(rows=[GOOD | {"price_per_hour": "", "spot_price_per_hour": "1"}])  # spot price only
def test_hostile_csvs_are_refused_in_one_line_or_imported_and_stay_data(
        rows: list[dict[str, str]], tmp_path: Path) -> None:
    text = _csv(rows)
    now = datetime.now(UTC)
    try:
        result = parse_user_csv(text, "user-import:h.csv", now)
    except InvalidValueError as exc:
        assert "\n" not in " ".join(str(exc).split())
        return
    for reason in result.rejected_rows:
        assert len(reason) < 400  # a reason quotes at most a prefix of the bad value
    if not result.offers:
        return
    with CatalogStore.open(tmp_path / "hostile.sqlite", seed=False) as store:
        store.replace_source("user-import:h.csv", result.offers, now)
        try:
            # Listed by the price asked for: on-demand by default, spot with --spot (a row
            # with only a spot price is an offer of the spot listing alone).
            stored = store.offers()
            assert {o.instance_type for o in stored} == {
                o.instance_type for o in result.offers if o.price_per_hour is not None}
            spot = store.offers(OfferFilter(spot=True))
            assert {o.instance_type for o in spot} == {
                o.instance_type for o in result.offers if o.spot_price_per_hour is not None}
            shown = _render_offers(store)
            assert ESC + "]8" not in shown  # no hyperlink escape from data
            for offer in stored:
                assert offer.instance_type[:10].replace("\\", "") in shown.replace("\\", "")
        finally:
            store.remove_source("user-import:h.csv")


@pytest.mark.parametrize("column,value", [
    ("gpu_count", "1" * 5000), ("disk", "1e400"), ("ram", "1e999999999GiB"),
    ("gpu_count", "9223372036854775808"), ("price_per_hour", "nan"),
    ("price_per_hour", "inf"), ("vcpus", "1e400"), ("notes", "n" * 5000),
    ("instance_type", "i" * 1001), ("zone", "\x1b[31m"), ("instance_type", "a\x00b"),
])
def test_cli_refuses_hostile_values_in_one_line(run_cli: Run, tmp_path: Path, column: str,
                                                value: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(_csv([{**GOOD, column: value}]), encoding="utf-8")
    result = run_cli("catalog", "import", str(path))
    assert result.code == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert column in result.stderr and ESC not in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_refuses_a_field_over_the_csv_limit(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    path.write_text(_csv([{**GOOD, "notes": "x" * 131_073}]), encoding="utf-8")
    result = run_cli("catalog", "import", str(path))
    assert result.code == 2
    assert "line" in result.stderr and result.stderr.count("\n") == 1


def test_markup_imports_as_data_offers_and_plan_keep_working_then_remove(
        run_cli: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # no folding
    path = tmp_path / "markup.csv"
    rows = [{**GOOD, "instance_type": text, "region": f"r{i}", "notes": text}
            for i, text in enumerate(MARKUP)]
    path.write_text(_csv(rows), encoding="utf-8")
    imported = run_cli("catalog", "import", str(path), "--json").ok_json()
    assert imported["offers"] == len(MARKUP)
    table = run_cli("offers", "--gpu", "H100", "--provider", "acme")
    assert table.code == 0, table.stderr
    assert "[/x]" in table.stdout and "[link=file:///etc/passwd]x[/link]" in table.stdout
    records = run_cli("offers", "--provider", "acme", "--json").ok_json()
    assert sorted(r["instance_type"] for r in records) == sorted(MARKUP)
    plan = run_cli("plan", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--tokens", "20M",
                   "--top", "3")
    assert plan.code == 0, plan.stderr
    status = run_cli("catalog", "status")
    assert status.code == 0 and "user-import:markup.csv" in status.stdout

    unknown = run_cli("catalog", "remove", "no-such-source")
    assert unknown.code == 2
    assert "user-import:markup.csv" in unknown.stderr  # the list of sources
    removed = run_cli("catalog", "remove", "user-import:markup.csv", "--json").ok_json()
    assert removed == {"source": "user-import:markup.csv", "offers_removed": len(MARKUP),
                       "snapshots_removed": 1}
    assert run_cli("offers", "--provider", "acme", "--json").ok_json() == []
    after = run_cli("catalog", "status", "--json").ok_json()
    assert "user-import:markup.csv" not in {s["source"] for s in after["sources"]}


def test_remove_deletes_every_snapshot_of_the_source_in_one_go(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    offer = parse_user_csv(_csv([GOOD]), "mine", now).offers
    with CatalogStore.open(tmp_path / "c.sqlite", seed=False) as store:
        store.replace_source("mine", offer, now)
        store.replace_source("mine", offer, now)
        store.replace_source("other", offer, now)
        assert store.remove_source("mine") == (2, 2)
        assert [s.source for s in store.status()] == ["other"]
        with pytest.raises(InvalidValueError, match="sources: other"):
            store.remove_source("mine")


def test_eight_cli_processes_and_a_server_start_at_once_on_an_empty_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("TUNEPLAN_HOME", str(home))
    env = {**os.environ, "TUNEPLAN_HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(Path(tuneplan.__file__).parents[1]),
                                          os.environ.get("PYTHONPATH", "")])}
    web_answers: list[int] = []

    def serve() -> None:
        try:
            from fastapi.testclient import TestClient

            from tuneplan.web.app import create_app
        except ImportError:  # the web extra is not installed
            return
        with TestClient(create_app()) as client:
            web_answers.append(client.get("/api/offers", params={"gpu": "H100"}).status_code)

    # Each process imports the CLI, says it is ready, and waits for one "go" file, so all
    # eight open the empty home at the same moment (python start-up would stagger them).
    go = tmp_path / "go"
    script = ("import os, sys, time\n"
              "from tuneplan.cli.app import main\n"
              "open(sys.argv[2], 'w').close()\n"
              "while not os.path.exists(sys.argv[1]):\n"
              "    time.sleep(0.002)\n"
              "sys.argv = ['tuneplan', 'catalog', 'status', '--json']\n"
              "main()\n")
    ready = [tmp_path / f"ready{i}" for i in range(8)]
    server = threading.Thread(target=serve)
    processes = [subprocess.Popen(
        [sys.executable, "-c", script, str(go), str(flag)], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for flag in ready]
    while not all(flag.exists() for flag in ready) and all(
            p.poll() is None for p in processes):
        threading.Event().wait(0.01)
    go.touch()
    server.start()
    outputs = [p.communicate() for p in processes]
    server.join()
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
        assert json.loads(out)["sources"], out
    web = importlib.util.find_spec("fastapi") is not None and importlib.util.find_spec(
        "httpx") is not None
    assert web_answers == ([200] if web else [])
    with sqlite3.connect(default_path()) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        counts = db.execute("SELECT source, COUNT(*) FROM snapshots GROUP BY source").fetchall()
    assert counts and all(n == 1 for _, n in counts)  # seeded exactly once


def test_run_md_keeps_catalog_text_literal() -> None:
    from tuneplan.core.launch.readme import _code, _md

    assert _md("[x](javascript:alert(1)) a_b\x1b") == "\\[x\\]\\(javascript:alert\\(1\\)\\) a\\_b"
    assert _code("p5`rm -rf`\x1b") == "p5'rm -rf'"


def test_the_store_refuses_an_integer_sqlite_cannot_hold(tmp_path: Path) -> None:
    from dataclasses import replace

    from tuneplan.errors import CatalogError

    now = datetime.now(UTC)
    offer = replace(parse_user_csv(_csv([GOOD]), "mine", now).offers[0], disk_bytes=2**63)
    with CatalogStore.open(tmp_path / "c.sqlite", seed=False) as store:
        with pytest.raises(CatalogError, match="disk_bytes"):
            store.replace_source("mine", [offer], now)
        assert store.status() == []  # rolled back
