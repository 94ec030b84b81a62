"""Spot capacity with checkpoints: the best checkpoint interval (Young/Daly), the expected wall
time under Poisson interruptions, and a seeded Monte Carlo for P50/P90.

Model: work of ``work_s`` seconds is cut into segments of ``interval_s`` each ending with a
checkpoint of ``checkpoint_s``; interruptions arrive at ``rate_per_s`` while the job runs;
each one costs ``restart_s`` (a new instance, image, model, resume). Without a usable notice
the work since the last checkpoint is lost; with a notice at least as long as a checkpoint
write, the job saves on notice and loses nothing. Pure: the random source is passed in.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

from tuneplan.errors import InfeasibleJobError

#: Beyond this many expected interruptions a spot run is not a plan (and would not simulate).
MAX_EXPECTED_INTERRUPTIONS = 10_000

_Number = TypeVar("_Number", float, Decimal)


def young_daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimum sqrt(2 x C x MTBF); Daly's bound MTBF when C >= 2 x MTBF."""
    if checkpoint_s <= 0 or math.isinf(mtbf_s):
        return math.inf
    if checkpoint_s >= 2 * mtbf_s:
        return mtbf_s
    return math.sqrt(2 * checkpoint_s * mtbf_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpotModel:
    """Inputs of one spot run, all in seconds (rate per second)."""

    work_s: float
    interval_s: float
    checkpoint_s: float
    restart_s: float
    rate_per_s: float
    saves_on_notice: bool

    def segments(self) -> tuple[int, float, float]:
        """(full segments, their length incl. checkpoint, last segment length or 0)."""
        if math.isinf(self.interval_s) or self.interval_s >= self.work_s:
            return 0, 0.0, self.work_s + self.checkpoint_s
        full = int(self.work_s // self.interval_s)
        rest = self.work_s - full * self.interval_s
        last = (rest + self.checkpoint_s) if rest else 0.0
        return full, self.interval_s + self.checkpoint_s, last

    @property
    def running_s(self) -> float:
        """Time the job runs when nothing interrupts it (work + every checkpoint)."""
        full, length, last = self.segments()
        return full * length + last


def expected_wall_s(model: SpotModel) -> tuple[float, float]:
    """(expected wall seconds incl. the first start, expected interruptions).

    No notice: each segment of length a takes (e^(λa) - 1)(1/λ + R) in expectation and is
    interrupted e^(λa) - 1 times. Save on notice: T = R + T_run + λ T_run (C + R).
    """
    lam, restart = model.rate_per_s, model.restart_s
    if lam <= 0:
        return restart + model.running_s, 0.0
    if model.saves_on_notice:
        run = model.running_s
        return restart + run + lam * run * (model.checkpoint_s + restart), lam * run
    full, length, last = model.segments()
    failures = full * math.expm1(lam * length) + (math.expm1(lam * last) if last else 0.0)
    return restart + failures * (1 / lam + restart), failures


def expected_billed_s(model: SpotModel, granularity_s: int, minimum_s: int = 0) -> float:
    """Expected billed seconds of a spot run whose every session is rounded up to
    ``granularity_s`` and to at least ``minimum_s`` (``estimate.billed_seconds``), without
    simulating: the ranking, the table and ``tuneplan cost`` all quote this one expectation.

    Expected wall time (``expected_wall_s``) plus the expected rounding of each session:
    - no interruption (probability e^(-λW), W the running time): one session of R + W;
    - each interruption (expected count from ``expected_wall_s``) ends a session of a + X,
      a = R (+ C when the job saves on notice), X exponential with rate λ cut at W; its billed
      length is E[max(m, ceil((a + X)/g) g) | X < W] = g (n0 + Σ_{k≥n0} P(a + X > k g | X < W)),
      a geometric sum in closed form;
    - the last session after an interruption runs what the first interruption left: W minus
      the whole segments done (no notice) or minus X (saved on notice), rounded likewise.
    Later interruptions are taken to look like the first (exact when at most one happens).
    Against the simulation (``simulate``, 4,000-20,000 runs) for jobs of 0.3-100 h, per-second
    to per-hour billing with and without minimums, with and without notice: within 1.5 % at
    0.1-0.5 interruptions per hour, within 3 % at 1 per hour (several interruptions per run,
    where the later ones are shorter than the first).
    """
    wall, interruptions = expected_wall_s(model)
    g, m = max(1, granularity_s), max(0, minimum_s)
    run, lam = model.running_s, model.rate_per_s
    first = model.restart_s + run
    waste_first = _billed(first, g, m) - first
    if lam <= 0 or run <= 0:
        return wall + waste_first
    p_none = math.exp(-lam * run)
    cut = -math.expm1(-lam * run)                      # P(X < W)
    mean_x = 1 / lam - run * p_none / cut              # E[X | X < W]
    a = model.restart_s + (model.checkpoint_s if model.saves_on_notice else 0.0)
    cut_billed = _billed_cut(a, 1.0, run, lam, g, m)  # E[billed(a + X) | X < W]
    waste_cut = max(0.0, cut_billed - (a + mean_x))
    waste = (p_none * waste_first + (1 - p_none) * _last_waste(model, g, m, mean_x)
             + interruptions * waste_cut)
    return wall + waste


def _billed(duration_s: float, g: int, m: int) -> float:
    """``estimate.billed_seconds`` for one session (kept here: the cost model imports spot)."""
    return float(max(m, math.ceil(round(max(0.0, duration_s), 6) / g) * g))


def _billed_cut(offset: float, sign: float, run: float, lam: float, g: int, m: int) -> float:
    """E[max(m, ceil(Y/g) g)] for Y = offset + sign x X (sign 1 or -1), X exponential with
    rate ``lam`` cut at ``run``: g x Σ_k P(Y > k g), the steps below max(m, min Y) always
    counted, the others a geometric sum."""
    cut = -math.expm1(-lam * run)
    low = offset if sign > 0 else offset - run         # Y lies in (low, low + run]
    n0 = math.ceil(max(m, low) / g)
    last = math.ceil((low + run) / g) - 1              # the last step Y can pass
    steps = max(0, last - n0 + 1)
    if not steps:
        return g * n0
    # P(Y > kg | X < W): sign 1: (e^(-λ(kg-a)) - e^(-λW)) / cut; sign -1: (1 - e^(-λ(a-kg))) /
    # cut, both with e^(±λ k g) summed as a geometric series.
    if sign > 0:
        ratio = -math.expm1(-lam * g * steps) / -math.expm1(-lam * g)
        total = math.exp(-lam * (n0 * g - offset)) * ratio - steps * math.exp(-lam * run)
    else:
        ratio = math.expm1(lam * g * steps) / math.expm1(lam * g)
        total = steps - math.exp(-lam * (offset - n0 * g)) * ratio
    return g * (n0 + total / cut)


def _last_waste(model: SpotModel, g: int, m: int, mean_x: float) -> float:
    """Expected rounding of the last session of a run interrupted once: it runs R + W minus
    the whole segments done before the interruption (X whole segments when saving on
    notice)."""
    lam, run, restart = model.rate_per_s, model.running_s, model.restart_s
    if g <= 60:
        return g / 2  # a minute or finer: the rounding is spread over the step
    if model.saves_on_notice:
        billed = _billed_cut(restart + run, -1.0, run, lam, g, m)
        return max(0.0, billed - (restart + run - mean_x))
    full, length, _last = model.segments()
    if not full:  # one segment: nothing is kept, the last session runs it all again
        return _billed(restart + run, g, m) - (restart + run)
    # d whole segments done before the interruption: P(d <= j) = (1 - q^(j+1)) / cut for
    # j < full (q = e^(-λL)), 1 at full; the last session runs R + W - dL. Its billed length is
    # g Σ_k P(R + W - dL > k g) (and every step below the minimum): one term per billing step
    # of the run, not per segment.
    cut = -math.expm1(-lam * run)
    steps = max(math.ceil((restart + run) / g), math.ceil(m / g))
    if steps > 5_000:
        return g / 2
    q_log = -lam * length

    def below(bound: float) -> float:  # P(d < bound)
        j = math.ceil(bound) - 1
        if j < 0:
            return 0.0
        return 1.0 if j >= full else -math.expm1(q_log * (j + 1)) / cut

    billed = g * sum(1.0 if k * g < m else below((restart + run - k * g) / length)
                     for k in range(steps))
    geometric = math.expm1(q_log * full) / math.expm1(q_log)   # Σ_{j=0}^{full-1} q^j
    mean_done = full - (full - math.exp(q_log) * geometric) / cut   # E[d] = Σ_j P(d >= j)
    return max(0.0, billed - (restart + run - length * mean_done))


@dataclass(frozen=True, slots=True, kw_only=True)
class SpotRun:
    """One simulated run: session lengths (each billed on its own) and interruptions."""

    sessions_s: tuple[float, ...]
    interruptions: int

    @property
    def wall_s(self) -> float:
        return sum(self.sessions_s)


def simulate_run(model: SpotModel, rng: random.Random) -> SpotRun:
    """One run: sessions start with ``restart_s`` (the first start too) and end at an
    interruption or when the work is done."""
    if model.saves_on_notice:
        return _simulate_with_notice(model, rng)
    lam = model.rate_per_s
    full, length, last = model.segments()
    sessions: list[float] = []
    while True:
        gap = rng.expovariate(lam) if lam > 0 else math.inf
        need = full * length + last
        if gap >= need:
            sessions.append(model.restart_s + need)
            return SpotRun(sessions_s=tuple(sessions), interruptions=len(sessions) - 1)
        done = min(full, int(gap // length)) if length else 0
        full -= done
        sessions.append(model.restart_s + gap)


def _simulate_with_notice(model: SpotModel, rng: random.Random) -> SpotRun:
    remaining = model.running_s
    sessions: list[float] = []
    while True:
        gap = rng.expovariate(model.rate_per_s) if model.rate_per_s > 0 else math.inf
        if gap >= remaining:
            sessions.append(model.restart_s + remaining)
            return SpotRun(sessions_s=tuple(sessions), interruptions=len(sessions) - 1)
        remaining -= gap
        sessions.append(model.restart_s + gap + model.checkpoint_s)


def check_feasible(model: SpotModel) -> None:
    """Raise InfeasibleJobError when segments almost never finish between interruptions."""
    _full, length, last = model.segments()
    exponent = model.rate_per_s * max(length, last)
    if exponent > 30 or expected_wall_s(model)[1] > MAX_EXPECTED_INTERRUPTIONS:
        raise InfeasibleJobError(
            "on spot this job would almost never finish between interruptions: checkpoint "
            "more often (--checkpoint-every), or use on-demand")


def simulate(model: SpotModel, *, runs: int, seed: int) -> list[SpotRun]:
    """``runs`` independent runs from ``random.Random(seed)``: same seed, same answer."""
    check_feasible(model)
    rng = random.Random(seed)
    return [simulate_run(model, rng) for _ in range(runs)]


def percentile(values: list[_Number], share: float) -> _Number:
    """Nearest-rank percentile (``share`` in 0..1) of a non-empty list (hours or USD)."""
    ordered = sorted(values)
    index = max(0, math.ceil(share * len(ordered)) - 1)
    return ordered[index]
