"""Refit the calibration-fitted constants without one group of cases, and score that group.

Used by ``accuracy.py`` (memory) and ``throughput_accuracy.py`` (tokens/s). Pure functions
over rows the caller has already built: nothing here reads a file or prints.

The fitting procedure, the same for every constant of both estimates (the comments of the
constants in ``tuneplan.core`` name which rows each was fitted on; before this module the
procedure itself was not written down anywhere, so this is the reproduction the figures rest
on):

- objective: the median over the constant's rows of |predicted - published| / published,
  with every other constant held at its current value;
- search: a grid of ``GRID_POINTS`` values over the constant's range (geometric when the
  range is wide), then a second grid of as many points between the best value's two
  neighbours; a tie (a median is flat between two rows) takes the middle of the tied values;
- constants are fitted one after another in the order given, and the whole sequence is
  repeated ``PASSES`` times (coordinate descent), because several constants share rows; or,
  with ``joint`` (the memory estimate's two constants), all at once on a product grid over
  the union of their rows, the second grid around the best point;
- a constant none of whose rows is left in the training set takes its ``fallback`` (what the
  estimate would use for a case like no calibrated one), or, without a fallback, stays at
  its current value and is reported as ``held (no training rows)``: the held-out group's
  figure then still rests on itself through that constant, and the report says so.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

C = TypeVar("C")   # the constants object (MemoryAssumptions, ThroughputAssumptions, ...)
R = TypeVar("R")   # one calibration row, as the caller built it

GRID_POINTS = 33
PASSES = 3


@dataclass(frozen=True)
class Fit(Generic[C, R]):
    """One fitted constant: which rows fit it, its search range, how to read and set it."""

    name: str
    rows: str                                  # the rows it is fitted on, in words
    selects: Callable[[R], bool]               # a training row that takes part in its fit
    low: float
    high: float
    get: Callable[[C], float]
    set: Callable[[C, float], C]
    # without training rows: (constants, what was done) from the constants fitted on the
    # training rows and those rows, or None to hold the current value
    fallback: Callable[[C, Sequence[R]], tuple[C, str]] | None = None
    log_grid: bool = False

    def grid(self, low: float, high: float) -> list[float]:
        n = GRID_POINTS
        if self.log_grid and low > 0:
            return [low * (high / low) ** (i / (n - 1)) for i in range(n)]
        return [low + (high - low) * i / (n - 1) for i in range(n)]


@dataclass(frozen=True)
class Refit(Generic[C]):
    constants: C
    status: dict[str, str]                     # constant -> what the refit did, in words
    values: dict[str, float]                   # constant -> value after the refit


@dataclass
class Held(Generic[C]):
    """One held-out group: the constants fitted without it and its rows' errors (%)."""

    group: Hashable
    refit: Refit[C]
    errors: list[float] = field(default_factory=list)       # signed % of its rows
    ids: list[str] = field(default_factory=list)

    @property
    def median_abs(self) -> float:
        return median_abs(self.errors)


def median_abs(errors: Iterable[float]) -> float:
    values = [abs(e) for e in errors]
    return statistics.median(values) if values else float("nan")


def error_pct(predicted: float, expected: float) -> float:
    return (predicted - expected) / expected * 100


def objective(constants: C, rows: Sequence[R], predict: Callable[[C, R], float | None],
              expected: Callable[[R], float]) -> float:
    """Median |error| in % of ``rows`` under ``constants`` (rows predict() refuses drop out)."""
    errors = []
    for row in rows:
        got = predict(constants, row)
        if got is not None:
            errors.append(error_pct(got, expected(row)))
    return median_abs(errors) if errors else float("inf")


def fit_one(fit: Fit[C, R], constants: C, rows: Sequence[R],
            predict: Callable[[C, R], float | None], expected: Callable[[R], float]) -> C:
    """The value of ``fit`` minimising the objective on ``rows`` (two nested grids)."""
    low, high = fit.low, fit.high
    best = fit.get(constants)
    for _ in range(2):
        grid = fit.grid(low, high)
        scores = [objective(fit.set(constants, v), rows, predict, expected) for v in grid]
        top = min(scores)
        tied = [i for i, s in enumerate(scores) if s <= top + 1e-9]
        i = tied[len(tied) // 2]
        best = grid[i]
        low, high = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    return fit.set(constants, best)


def fit_joint(fits: Sequence[Fit[C, R]], constants: C, rows: Sequence[R],
              predict: Callable[[C, R], float | None], expected: Callable[[R], float]) -> C:
    """All of ``fits`` at once on the union of their rows: the product of their grids, then a
    finer product grid around the best point (for two or three constants that share rows,
    where one-at-a-time descent stops on a ridge)."""
    bounds = [(f.low, f.high) for f in fits]
    best: tuple[float, ...] = tuple(f.get(constants) for f in fits)
    for _ in range(2):
        grids = [f.grid(lo, hi) for f, (lo, hi) in zip(fits, bounds, strict=True)]
        scored: list[tuple[float, tuple[int, ...]]] = []
        for index in itertools.product(*(range(len(g)) for g in grids)):
            c = constants
            for f, g, i in zip(fits, grids, index, strict=True):
                c = f.set(c, g[i])
            scored.append((objective(c, rows, predict, expected), index))
        top = min(s for s, _ in scored)
        tied = [index for s, index in scored if s <= top + 1e-9]
        pick = tied[len(tied) // 2]
        best = tuple(g[i] for g, i in zip(grids, pick, strict=True))
        bounds = [(g[max(i - 1, 0)], g[min(i + 1, len(g) - 1)])
                  for g, i in zip(grids, pick, strict=True)]
    for f, v in zip(fits, best, strict=True):
        constants = f.set(constants, v)
    return constants


def refit(base: C, fits: Sequence[Fit[C, R]], train: Sequence[R],
          predict: Callable[[C, R], float | None], expected: Callable[[R], float],
          passes: int = PASSES, joint: bool = False) -> Refit[C]:
    """Every constant of ``fits`` refitted on ``train``: one at a time (coordinate descent,
    see above) or, with ``joint``, all together on the union of their rows."""
    constants = base
    status: dict[str, str] = {}
    idle = [f for f in fits if not any(f.selects(r) for r in train)]
    active = [f for f in fits if f not in idle]
    if joint and active:
        rows = [r for r in train if any(f.selects(r) for f in active)]
        constants = fit_joint(active, constants, rows, predict, expected)
        passes = 0
    for _ in range(passes):
        for fit in active:
            rows = [r for r in train if fit.selects(r)]
            constants = fit_one(fit, constants, rows, predict, expected)
    for fit in active:
        n = sum(fit.selects(r) for r in train)
        status[fit.name] = f"refitted on {n} row{'' if n == 1 else 's'}"
    for fit in idle:   # after the others: a fallback may derive from them
        if fit.fallback is not None:
            constants, what = fit.fallback(constants, train)
            status[fit.name] = f"no training rows: {what}"
        else:
            status[fit.name] = "held (no training rows): rests on the held-out group"
    return Refit(constants, status, {f.name: f.get(constants) for f in fits})


def leave_one_out(rows: Sequence[R], group_of: Callable[[R], Hashable], base: C,
                  fits: Sequence[Fit[C, R]], predict: Callable[[C, R], float | None],
                  expected: Callable[[R], float],
                  evaluate: Callable[[C, R], float | None] | None = None,
                  scored: Callable[[R], bool] = lambda r: True,
                  joint: bool = False) -> list[Held[C]]:
    """For each group: refit on the other groups' rows, score the group's ``scored`` rows.

    ``predict`` is what the fits call (it may be a fast path); ``evaluate`` (default
    ``predict``) gives a held-out row's prediction under the refitted constants."""
    evaluate = evaluate or predict
    out: list[Held[C]] = []
    groups = list(dict.fromkeys(group_of(r) for r in rows))
    for group in groups:
        train = [r for r in rows if group_of(r) != group]
        done = refit(base, fits, train, predict, expected, joint=joint)
        held: Held[C] = Held(group, done)
        for row in rows:
            if group_of(row) != group or not scored(row):
                continue
            got = evaluate(done.constants, row)
            if got is not None:
                held.errors.append(error_pct(got, expected(row)))
                held.ids.append(str(getattr(row, "id", "")))
        out.append(held)
    return out


def pooled(helds: Sequence[Held[C]]) -> list[float]:
    """Every held-out row's error, over all groups (the overall leave-one-out figure)."""
    return [e for h in helds for e in h.errors]


def plain(value: Any) -> Any:
    """``value`` with NaN (a group without rows) as None, so ``json.dumps`` writes valid JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
