"""The pages in a real browser: Debian's chromium driven by Playwright (never a downloaded one).

Skipped cleanly when playwright or chromium is absent. Screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import HANG_GUARD_S, wait_until

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)",
                allow_module_level=True)

ARTIFACTS = Path(__file__).parent.parent / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tuneplan.web import create_app

    store = tmp_path_factory.mktemp("web-catalog") / "catalog.sqlite"
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(store), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "uvicorn start-up")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                  args=CHROMIUM_ARGS)
        except sync_api.Error as exc:  # a chromium that cannot start here: skip, not fail
            pytest.skip(f"chromium did not start: {str(exc).splitlines()[0]}")
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(60_000)
    yield opened
    context.close()


def _shot(page: Any, name: str, *, full_page: bool = False) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=full_page)


def test_offers_filter_to_h100_and_sort_by_price(base_url: str, page: Any) -> None:
    page.goto(f"{base_url}/offers")
    page.fill("#f-gpu", "H100")
    page.click("#f-apply")
    page.wait_for_url("**/offers?*gpu=H100*")
    gpus = page.locator("#offers tbody tr td:first-child").all_inner_texts()
    assert len(gpus) > 50 and all(g.startswith("H100") for g in gpus)
    # Sort by on-demand $/h with the column heading (client side), twice to reverse.
    heading = page.get_by_role("button", name="$/h", exact=True)
    assert heading.get_attribute("data-name") == "$/h"
    column = 1 + int(heading.get_attribute("data-col"))
    cells = f"#offers tbody tr td:nth-child({column})"
    heading.click()
    assert heading.get_attribute("aria-sort") == "ascending"
    prices = [float(v) for v in page.eval_on_selector_all(
        cells, "els => els.map(e => e.dataset.sort)") if v]
    assert prices == sorted(prices) and prices[0] < prices[-1]
    heading.click()
    assert heading.get_attribute("aria-sort") == "descending"
    prices = [float(v) for v in page.eval_on_selector_all(
        cells, "els => els.map(e => e.dataset.sort)") if v]
    assert prices == sorted(prices, reverse=True)
    heading.click()
    _shot(page, "offers.png")


def test_plan_llama_8b_qlora_shows_ranked_plans_and_both_charts(base_url: str,
                                                                 page: Any) -> None:
    page.goto(f"{base_url}/plan")
    assert page.locator("#model-names option").count() == 81  # autocomplete from the registry
    page.fill("#model", "meta-llama/Llama-3.1-8B")
    page.select_option("#method", "qlora")
    page.fill("#tokens", "50M")
    page.fill("#seq_len", "2048")
    page.click("#plan-submit")
    page.wait_for_selector("#plans li")
    plans = page.locator("#plans > li")
    assert plans.count() >= 3
    assert "#1" in plans.first.inner_text() and "fits" in plans.first.inner_text()
    # Memory chart: stacked segments with data, total and capacity marked.
    segments = page.locator("#memory-chart rect.segment")
    assert segments.count() >= 3
    widths = [float(w) for w in page.eval_on_selector_all(
        "#memory-chart rect.segment", "els => els.map(e => e.getAttribute('width'))")]
    assert all(w > 0 for w in widths)
    total = int(page.get_attribute("#memory-chart", "data-total") or 0)
    capacity = int(page.get_attribute("#memory-chart", "data-capacity") or 0)
    assert 0 < total <= capacity  # the top plan fits its card
    # Cost vs time: one point per charted plan, the Pareto front drawn through some of them.
    points = page.locator("#cost-time circle.point")
    assert points.count() >= plans.count()
    assert page.locator("#cost-time circle.pareto").count() >= 1
    assert page.get_attribute("#pareto", "points")
    hours = [float(h) for h in page.eval_on_selector_all(
        "#cost-time circle.point", "els => els.map(e => e.dataset.hours)")]
    assert all(h > 0 for h in hours)
    _shot(page, "plan.png", full_page=True)
    page.click("#plans > li:first-child a.what")
    page.wait_for_selector("#memory-chart")
    assert "Why" in page.inner_text("main") and page.locator("dl.facts dt").count() >= 8
    _shot(page, "plan_detail.png", full_page=True)
