"""Geometry of the two server-rendered SVG charts: memory terms stacked against the card's
capacity, and plans' cost against time with the Pareto front. Layout only; the numbers come
from the estimates, and the templates draw the shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuneplan.units import format_bytes

# Colour-blind-safe palette (Okabe–Ito, then greys); terms beyond it reuse it in order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000", "#999999", "#7F3C8D", "#11A579", "#3969AC")
WIDTH = 760


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    name: str
    value_bytes: int
    label: str
    x: float
    width: float
    color: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryChart:
    """A horizontal stacked bar of per-GPU terms, with the capacity marked."""

    segments: tuple[Segment, ...]
    total_bytes: int
    total_label: str
    capacity_bytes: int | None
    capacity_label: str
    capacity_x: float | None
    bar_width: float
    ticks: tuple[tuple[float, str], ...]
    fits: bool | None
    width: int = WIDTH
    height: int = 110


def memory_chart(terms: Sequence[tuple[str, int]], capacity_bytes: int | None) -> MemoryChart:
    """Stack the non-zero ``terms`` (name, bytes) left to right; the scale reaches 105 % of
    the larger of the total and the capacity."""
    kept = [(n, b) for n, b in terms if b > 0]
    total = sum(b for _, b in kept)
    top = max(total, capacity_bytes or 0, 1) * 1.05
    left, bar_width = 10.0, WIDTH - 20.0
    segments, x = [], left
    for i, (name, size) in enumerate(kept):
        width = bar_width * size / top
        segments.append(Segment(name=name, value_bytes=size, label=format_bytes(size), x=x,
                                width=width, color=PALETTE[i % len(PALETTE)]))
        x += width
    ticks = tuple((left + bar_width * v / top, format_bytes(int(v), digits=0))
                  for v in _nice_ticks(top))
    cap_x = None if capacity_bytes is None else left + bar_width * capacity_bytes / top
    return MemoryChart(
        segments=tuple(segments), total_bytes=total, total_label=format_bytes(total),
        capacity_bytes=capacity_bytes,
        capacity_label="" if capacity_bytes is None else format_bytes(capacity_bytes),
        capacity_x=cap_x, bar_width=bar_width, ticks=ticks,
        fits=None if capacity_bytes is None else total <= capacity_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    plan_id: str
    label: str
    hours: float
    cost_usd: float
    x: float
    y: float
    pareto: bool
    rank: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Scatter:
    """Plans as points (x = hours, y = cost), the Pareto front as a polyline."""

    points: tuple[Point, ...]
    front: str                       # SVG polyline points "x,y x,y"
    x_ticks: tuple[tuple[float, str], ...]
    y_ticks: tuple[tuple[float, str], ...]
    plot: tuple[float, float, float, float] = field(default=(70.0, 20.0, 670.0, 300.0))
    width: int = WIDTH
    height: int = 360


def pareto_ids(items: Sequence[tuple[str, float, float]]) -> set[str]:
    """Ids of (id, hours, cost) not dominated: no other is at least as fast and as cheap and
    strictly better in one."""
    return {i for i, h, c in items
            if not any(h2 <= h and c2 <= c and (h2 < h or c2 < c) for _, h2, c2 in items)}


def scatter(items: Sequence[tuple[str, str, float, float]]) -> Scatter:
    """``items`` = (plan id, label, hours, cost USD), in rank order."""
    front_ids = pareto_ids([(i, h, c) for i, _, h, c in items])
    x0, y0, w, h = 70.0, 20.0, 670.0, 300.0
    x_top = max((it[2] for it in items), default=1.0) * 1.08 or 1.0
    y_top = max((it[3] for it in items), default=1.0) * 1.08 or 1.0

    def px(hours: float) -> float:
        return x0 + w * hours / x_top

    def py(cost: float) -> float:
        return y0 + h - h * cost / y_top

    points = tuple(Point(plan_id=i, label=label, hours=hours, cost_usd=cost, x=px(hours),
                         y=py(cost), pareto=i in front_ids, rank=rank)
                   for rank, (i, label, hours, cost) in enumerate(items, start=1))
    front = sorted((p for p in points if p.pareto), key=lambda p: p.hours)
    return Scatter(
        points=points, front=" ".join(f"{p.x:.1f},{p.y:.1f}" for p in front),
        x_ticks=tuple((px(v), _short(v, "h")) for v in _nice_ticks(x_top)),
        y_ticks=tuple((py(v), "$" + _short(v, "")) for v in _nice_ticks(y_top)))


def _nice_ticks(top: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values from 0 up to ``top`` (1, 2 or 5 times a power of 10)."""
    if top <= 0:
        return [0.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(top // step) + 1)]


def _short(value: float, unit: str) -> str:
    text = f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:.2g}"
    return text + unit
