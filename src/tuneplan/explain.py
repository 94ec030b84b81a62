"""Terms and breakdowns: every estimate is an ordered sum of named terms.

A ``Term`` carries its value, unit, the formula that produced it, the inputs it used and the
source of any constant. A ``Breakdown``'s total is, by construction, the sum of its terms.
This module computes nothing domain-specific and prints nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    """One named contribution: ``path`` is slash-keyed (``activations/attention``)."""

    path: str
    value: int | float
    unit: str
    formula: str = ""
    inputs: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.path,
            "value": self.value,
            "unit": self.unit,
            "formula": self.formula,
            "inputs": dict(self.inputs),
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class Breakdown:
    """An ordered collection of terms sharing one unit; ``total`` is their sum."""

    unit: str
    terms: tuple[Term, ...] = ()

    def __post_init__(self) -> None:
        for term in self.terms:
            if term.unit != self.unit:
                raise ValueError(f"term {term.path} is in {term.unit}, breakdown in {self.unit}")
        paths = [term.path for term in self.terms]
        if len(paths) != len(set(paths)):
            raise ValueError(f"duplicate term paths in breakdown: {paths}")

    @classmethod
    def of(cls, unit: str, terms: Iterable[Term]) -> Breakdown:
        return cls(unit, tuple(terms))

    @property
    def total(self) -> int | float:
        return sum(term.value for term in self.terms)

    def __iter__(self) -> Iterator[Term]:
        return iter(self.terms)

    def __len__(self) -> int:
        return len(self.terms)

    def get(self, path: str) -> Term | None:
        return next((term for term in self.terms if term.path == path), None)

    def value(self, path: str) -> int | float:
        """Value of one term, or 0 when absent."""
        term = self.get(path)
        return term.value if term else 0

    def subtotal(self, prefix: str) -> int | float:
        """Sum of the terms under a slash prefix (``activations`` sums ``activations/*``)."""
        under = prefix + "/"
        return sum(t.value for t in self.terms if t.path == prefix or t.path.startswith(under))

    def with_terms(self, extra: Iterable[Term]) -> Breakdown:
        return Breakdown(self.unit, self.terms + tuple(extra))

    def as_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "total": self.total, "terms": [t.as_dict() for t in self.terms]}


_TERMS = Breakdown.__dict__["terms"]    # the slot under the ``terms`` field
_UNIT = Breakdown.__dict__["unit"]


class LazyBreakdown(Breakdown):
    """A Breakdown whose terms are built on first use (then checked like any Breakdown's),
    for producers that make many candidate breakdowns and show few. ``total`` is known up
    front and equals the sum of the terms the maker returns."""

    __slots__ = ("_make", "_total")
    _make: Callable[[], tuple[Term, ...]]
    _total: int | float

    def __init__(self, unit: str, make: Callable[[], tuple[Term, ...]] | None = None,
                 total: int | float = 0, *, terms: tuple[Term, ...] | None = None) -> None:
        _UNIT.__set__(self, unit)
        if terms is not None:  # dataclasses.replace passes the fields: an eager breakdown
            fixed = tuple(terms)
            make, total = (lambda: fixed), sum(t.value for t in fixed)
        object.__setattr__(self, "_make", make)
        object.__setattr__(self, "_total", total)

    @property
    def terms(self) -> tuple[Term, ...]:
        try:
            found: tuple[Term, ...] = _TERMS.__get__(self)
            return found
        except AttributeError:
            made = self._make()
            _TERMS.__set__(self, made)
            Breakdown.__post_init__(self)
            return made

    @property
    def total(self) -> int | float:
        return self._total

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Breakdown):
            return NotImplemented
        return (self.unit, self.terms) == (other.unit, other.terms)

    def __hash__(self) -> int:
        return hash((self.unit, self.terms))

    def __reduce__(self) -> tuple[object, ...]:
        return (Breakdown, (self.unit, self.terms))
