"""Chart geometry: the memory bar adds up and scales to the card, the scatter's axes and front."""

from __future__ import annotations

import pytest

pytest.importorskip("jinja2")

from tuneplan.units import GiB
from tuneplan.web.charts import WIDTH, memory_chart, scatter


def test_memory_bar_sums_its_terms_and_marks_the_card() -> None:
    terms = [("weights", 16 * GiB), ("optimizer", 8 * GiB), ("bias", 1), ("norm", 2),
             ("zero", 0)]
    chart = memory_chart(terms, capacity_bytes=48 * GiB)
    assert chart.total_bytes == 24 * GiB + 3 and chart.fits is True
    names = [s.name for s in chart.segments]
    assert names == ["weights", "optimizer", "other (2 terms < 1%)"]  # slivers grouped, 0 gone
    # segments abut, and the card sits at 48/50.4 of the bar (scale = 105 % of the card)
    first, second = chart.segments[:2]
    assert second.x == pytest.approx(first.x + first.width)
    assert chart.capacity_x == pytest.approx(10 + (WIDTH - 20) * 48 / (48 * 1.05))
    assert [label for _, label in chart.ticks] == ["0 GiB", "20 GiB", "40 GiB"]  # 50.4 / 5 -> 20


def test_memory_bar_over_capacity_does_not_fit() -> None:
    chart = memory_chart([("weights", 30 * GiB)], capacity_bytes=24 * GiB)
    assert chart.fits is False
    assert chart.capacity_x is not None and chart.capacity_x < chart.segments[0].width + 10


def test_scatter_joins_the_front_fastest_first_and_goes_log_on_wide_spans() -> None:
    items = [("a", "A", 4.0, 1.5, 1), ("b", "B", 0.5, 3.0, 2), ("c", "C", 2.0, 2.0, 3),
             ("d", "D", 40.0, 1.7, 4)]
    sc = scatter(items, front_ids={"a", "b", "c"})
    assert sc.log_x and not sc.log_y  # 0.5 h .. 40 h spans 80x; costs 2x
    by_id = {p.plan_id: p for p in sc.points}
    front = [tuple(map(float, xy.split(","))) for xy in sc.front.split()]
    assert [x for x, _ in front] == sorted(x for x, _ in front)
    assert front[0] == pytest.approx((by_id["b"].x, by_id["b"].y), abs=0.06)
    assert by_id["b"].y < by_id["a"].y  # dearer is higher on the page (smaller y)
    assert not by_id["d"].pareto and by_id["a"].rank == 1
    assert [label for _, label in sc.x_ticks][:3] == ["0.5h", "1h", "2h"]


def test_plan_rows_show_the_planners_per_gpu_memory_not_the_neutral_estimate() -> None:
    """Plans past the first few keep a generation-neutral estimate: the row must show the
    figure the planner fitted and the CLI prints (``candidate.device_total_bytes``)."""
    from dataclasses import replace

    from tests.core.test_planner import offer, run
    from tuneplan.units import format_bytes
    from tuneplan.web.planning import plan_row

    plan = run("Qwen/Qwen2.5-0.5B", "lora", [offer("L4", 1, "0.80")]).plans[0]
    shifted = replace(plan, candidate=replace(
        plan.candidate, device_total_bytes=plan.candidate.memory.device_total_bytes + GiB))
    text = plan_row(shifted, 1, pareto=True).memory_text
    assert text.startswith(format_bytes(shifted.candidate.device_total_bytes))
