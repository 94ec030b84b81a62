"""Why a job has no plan, and what it would cost to change that: the binding constraints in
order (memory, budget, deadline, a flag the person fixed, a filter) and, for each, the cheapest
relaxation the planner found, with its number and the plan it gives.

The planner (``core.planner.plan``) fills these from what it evaluated: the priced options that
missed the budget or the deadline give the budget and deadline relaxations directly; a flag or
filter is relaxed by planning again with only that one thing freed (every other constraint
kept). Pure: values in, values out; the faces only print them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from tuneplan.units import HOUR_S

#: Order in which binding constraints are listed (``Binding.constraint`` prefixes).
ORDER = ("estimate", "filters", "memory", "hardware", "budget", "deadline", "flag", "filter")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRef:
    """The plan a relaxation gives, in the few figures a person decides on."""

    id: str
    provider: str
    instance_type: str
    region: str
    gpu: str
    gpus: int                 # per node
    nodes: int
    method: str
    batch_size: int
    hours: float              # wall hours as it runs (spot's expected when spot wins)
    cost_usd: Decimal         # the ranked cost (spot's expected cost when spot wins)

    def text(self) -> str:
        where = f"{self.gpus}x {self.gpu}" + (f" x {self.nodes} nodes" if self.nodes > 1 else "")
        return (f"plan {self.id} ({where}, {self.provider} {self.instance_type}, "
                f"{self.method} mb{self.batch_size}: ${self.cost_usd:,.2f}, {self.hours:.1f} h)")

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "provider": self.provider, "instance_type": self.instance_type,
                "region": self.region, "gpu": self.gpu, "gpus_per_node": self.gpus,
                "nodes": self.nodes, "method": self.method, "batch_size": self.batch_size,
                "hours": self.hours, "cost_usd": self.cost_usd}


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    """One constraint no plan satisfies (with the others kept), and the figure that shows it.

    ``constraint`` is ``estimate``, ``filters``, ``memory``, ``budget``, ``deadline``,
    ``flag:<name>`` (a strategy flag the person fixed, or the method) or ``filter:<name>``.
    """

    constraint: str
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"constraint": self.constraint, "detail": self.detail}


@dataclass(frozen=True, slots=True, kw_only=True)
class Relaxation:
    """One change that makes the job plannable (or, for memory-only changes from the fit
    solver, makes it fit one card), with its size: ``amount`` in ``unit`` (``USD``, ``h``,
    ``bytes`` for a new per-GPU peak) and the plan it gives (None for a memory-only change)."""

    constraint: str
    change: str
    amount: Decimal | float | int | None = None
    unit: str | None = None
    plan: PlanRef | None = None

    def text(self) -> str:
        return self.change + (f" gives {self.plan.text()}" if self.plan else "")

    def as_dict(self) -> dict[str, object]:
        return {"constraint": self.constraint, "change": self.change, "amount": self.amount,
                "unit": self.unit, "plan": None if self.plan is None else self.plan.as_dict(),
                "text": self.text()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Infeasibility:
    """Why nothing is plannable: binding constraints in ``ORDER``, relaxations in the same
    order (cheapest first within a constraint)."""

    binding: tuple[Binding, ...]
    relaxations: tuple[Relaxation, ...]

    def summary(self) -> str:
        """One line: the binding constraints and the first relaxation."""
        names = ", ".join(b.constraint for b in self.binding) or "unknown"
        if self.relaxations:
            return f"binding: {names}; e.g. {self.relaxations[0].text()}"
        return f"binding: {names} ({self.binding[0].detail})" if self.binding else names


def rank(constraint: str) -> int:
    """Position of ``constraint`` in ``ORDER`` (``flag:gpus`` ranks as ``flag``)."""
    head = constraint.split(":", 1)[0]
    return ORDER.index(head) if head in ORDER else len(ORDER)


def ordered(binding: Sequence[Binding], relaxations: Sequence[Relaxation]) -> Infeasibility:
    """Both lists sorted by ``ORDER`` (stable: the order found within a kind stays)."""
    return Infeasibility(binding=tuple(sorted(binding, key=lambda b: rank(b.constraint))),
                         relaxations=tuple(sorted(relaxations,
                                                  key=lambda r: rank(r.constraint))))


def budget_and_deadline(refs: Sequence[PlanRef], budget_usd: Decimal | None,
                        deadline_s: float | None) -> tuple[list[Binding], list[Relaxation]]:
    """Binding budget/deadline and their cheapest relaxations from the plans that fit but
    miss them: raising the budget to the cheapest plan that meets the deadline; moving the
    deadline to the fastest plan within budget; when neither alone is enough, both together
    for the cheapest plan and for the fastest."""
    binding: list[Binding] = []
    relax: list[Relaxation] = []
    if not refs:
        return binding, relax

    def on_time(r: PlanRef) -> bool:
        return deadline_s is None or r.hours * HOUR_S <= deadline_s

    def affordable(r: PlanRef) -> bool:
        return budget_usd is None or r.cost_usd <= budget_usd

    cheapest = min(refs, key=lambda r: (r.cost_usd, r.hours, r.id))
    fastest = min(refs, key=lambda r: (r.hours, r.cost_usd, r.id))
    timely = [r for r in refs if on_time(r)]
    cheap = [r for r in refs if affordable(r)]
    if budget_usd is not None and timely:
        best = min(timely, key=lambda r: (r.cost_usd, r.hours, r.id))
        extra = best.cost_usd - budget_usd
        binding.append(Binding(constraint="budget", detail=(
            f"the cheapest plan{' within the deadline' if deadline_s is not None else ''} "
            f"costs ${best.cost_usd:,.2f}, the budget is ${budget_usd:,.2f}")))
        relax.append(Relaxation(constraint="budget", amount=extra, unit="USD", plan=best,
                                change=f"budget +${extra:,.2f} (to ${best.cost_usd:,.2f})"))
    if deadline_s is not None and cheap:
        best = min(cheap, key=lambda r: (r.hours, r.cost_usd, r.id))
        extra_h = best.hours - deadline_s / HOUR_S
        binding.append(Binding(constraint="deadline", detail=(
            f"the fastest plan{' within budget' if budget_usd is not None else ''} takes "
            f"{best.hours:.1f} h, the deadline is {deadline_s / HOUR_S:.1f} h")))
        relax.append(Relaxation(constraint="deadline", amount=extra_h, unit="h", plan=best,
                                change=f"deadline +{_hours(extra_h)} h (to "
                                       f"{_hours(best.hours)} h)"))
    if binding:
        return binding, relax
    # Neither alone: every plan misses both (budget and deadline are both given here).
    assert budget_usd is not None and deadline_s is not None
    binding.append(Binding(constraint="budget", detail=(
        f"no plan costs ${budget_usd:,.2f} or less: the cheapest costs "
        f"${cheapest.cost_usd:,.2f} and takes {cheapest.hours:.1f} h")))
    binding.append(Binding(constraint="deadline", detail=(
        f"no plan finishes in {deadline_s / HOUR_S:.1f} h: the fastest takes "
        f"{fastest.hours:.1f} h and costs ${fastest.cost_usd:,.2f}")))
    for ref in dict.fromkeys((cheapest, fastest)):
        extra = ref.cost_usd - budget_usd
        extra_h = max(0.0, ref.hours - deadline_s / HOUR_S)
        relax.append(Relaxation(
            constraint="budget", amount=extra, unit="USD", plan=ref,
            change=f"budget +${extra:,.2f} (to ${ref.cost_usd:,.2f}) and deadline "
                   f"+{_hours(extra_h)} h (to {_hours(ref.hours)} h)"))
    return binding, relax


def _hours(value: float) -> str:
    """Hours for a relaxation, rounded up to a tenth so the plan really fits in it."""
    tenths = -(-round(value * 1000) // 100)  # ceil to 0.1 h of the value rounded to 0.001 h
    return f"{tenths / 10:.1f}"
