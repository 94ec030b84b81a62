"""Geometry of the two server-rendered SVG charts: memory terms stacked against the card's
capacity, and plans' cost against time with the Pareto front. Layout only; the numbers come
from the estimates, and the templates draw the shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tuneplan.units import GiB, format_bytes

# Colour-blind-safe palette (Okabe–Ito, then greys); terms beyond it reuse it in order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000", "#999999", "#7F3C8D", "#11A579", "#3969AC")
WIDTH = 760
LOG_SPAN = 20
SMALL_SHARE = 0.01  # terms under 1 % of the total are drawn as one "other" segment
PLOT = (70.0, 20.0, 670.0, 300.0)  # scatter plot area in px: left, top, width, height


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
    the larger of the total and the capacity. The total is the sum of the terms, always."""
    kept = [(n, b) for n, b in terms if b > 0]
    total = sum(b for _, b in kept)
    small = [(n, b) for n, b in kept if b < total * SMALL_SHARE]
    if len(small) > 1:  # slivers nobody can see or click: one "other" segment says what
        kept = [(n, b) for n, b in kept if b >= total * SMALL_SHARE]
        kept.append((f"other ({len(small)} terms < {SMALL_SHARE:.0%})", sum(b for _, b in small)))
    top = max(total, capacity_bytes or 0, 1) * 1.05
    left, bar_width = 10.0, WIDTH - 20.0
    segments, x = [], left
    for i, (name, size) in enumerate(kept):
        width = bar_width * size / top
        segments.append(Segment(name=name, value_bytes=size, label=format_bytes(size), x=x,
                                width=width, color=PALETTE[i % len(PALETTE)]))
        x += width
    ticks = tuple((left + bar_width * v * GiB / top, f"{v:g} GiB")
                  for v in _nice_ticks(top / GiB))
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
    log_x: bool = False
    log_y: bool = False
    plot: tuple[float, float, float, float] = PLOT
    width: int = WIDTH
    height: int = 360


def scatter(items: Sequence[tuple[str, str, float, float, int]], front_ids: Collection[str]
            ) -> Scatter:
    """``items`` = (plan id, label, hours, cost USD, rank); ``front_ids`` are the
    planner's Pareto front (joined by a line, fastest first)."""
    x0, y0, w, h = PLOT
    px, x_ticks = _axis([it[2] for it in items], x0, x0 + w, "h")
    py, y_ticks = _axis([it[3] for it in items], y0 + h, y0, "$")

    points = tuple(Point(plan_id=i, label=label, hours=hours, cost_usd=cost, x=px(hours),
                         y=py(cost), pareto=i in front_ids, rank=rank)
                   for i, label, hours, cost, rank in items)
    front = sorted((p for p in points if p.pareto), key=lambda p: p.hours)
    return Scatter(
        points=points, front=" ".join(f"{p.x:.1f},{p.y:.1f}" for p in front),
        x_ticks=x_ticks, y_ticks=y_ticks, log_x=_is_log([it[2] for it in items]),
        log_y=_is_log([it[3] for it in items]))


def _is_log(values: Sequence[float]) -> bool:
    """A log axis when the values span more than 20× (one slow plan would squash the rest)."""
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) > 1 and max(positive) / min(positive) > LOG_SPAN


def _axis(values: Sequence[float], start: float, end: float, unit: str
          ) -> tuple[Callable[[float], float], tuple[tuple[float, str], ...]]:
    """Pixel mapping from value to ``start``..``end`` and its ticks, linear or log10."""
    def label(v: float) -> str:
        return f"${_short(v)}" if unit == "$" else f"{_short(v)}{unit}"

    if _is_log(values):
        lo, hi = math.log10(min(values) / 1.25), math.log10(max(values) * 1.25)

        def log_px(v: float) -> float:
            return start + (end - start) * (math.log10(v) - lo) / (hi - lo)

        ticks = [m * 10.0**k for k in range(math.floor(lo), math.ceil(hi) + 1) for m in (1, 2, 5)
                 if lo <= math.log10(m * 10.0**k) <= hi]
        return log_px, tuple((log_px(v), label(v)) for v in ticks)
    top = max(values, default=1.0) * 1.08 or 1.0

    def lin_px(v: float) -> float:
        return start + (end - start) * v / top

    return lin_px, tuple((lin_px(v), label(v)) for v in _nice_ticks(top))


def _nice_ticks(top: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values from 0 up to ``top`` (1, 2 or 5 times a power of 10)."""
    if top <= 0:
        return [0.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(top // step) + 1)]


def _short(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:.2g}"
